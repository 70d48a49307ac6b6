"""scripts/benchmark_attention.py runs end to end on a tiny CPU configuration and prints its table."""
import importlib.util
import pathlib

import pytest

SCRIPT = pathlib.Path(__file__).parents[3] / "scripts" / "benchmark_attention.py"


def load_script():
    spec = importlib.util.spec_from_file_location("benchmark_attention", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tiny_cpu_table(capsys):
    load_script().main(["--lengths", "32", "--head-dims", "64", "--tokens", "32", "--hidden", "128",
                        "--dtype", "float32", "--repeats", "1", "--modes", "fwd",
                        "--implementations", "xla,pallas,cudnn"])
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[2:]}
    assert set(rows) == {"xla", "pallas", "cudnn"}
    assert "n/a on cpu" in rows["cudnn"]
    assert float(rows["pallas"].split()[-1]) < 1e-4  # max |pallas - xla| on the forward output


def test_flops_count_halves_for_causal_and_adds_the_backward():
    module = load_script()
    assert module.attention_flops(1, 1, 4, 2, "fwd") == 4 * 16 * 2 / 2
    assert module.attention_flops(1, 1, 4, 2, "fwd+bwd") == 3.5 * 4 * 16 * 2 / 2


def test_rejects_unknown_implementations():
    with pytest.raises(SystemExit):
        load_script().parse_args(["--implementations", "flash"])
