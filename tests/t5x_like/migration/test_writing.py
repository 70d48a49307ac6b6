"""What migrate writes is gin that `--print_config` reads back (issue 52, item 8): every kind of value a translation
sets renders as a literal gin parses to the same value, and a value gin has no spelling for (nan, inf) is refused
where it came from, never written."""
import gin
import pytest

from t5x_like.errors import UserError
from t5x_like.migration import translate, upstream

VALUES = [None, True, False, 0, -3, 2 ** 40, 1e-5, 0.1, 3.0, -2.5e-8, 1.5e300, "", "plain", "it's", 'say "hi"',
          "both ' and \"", "C:\\runs\\gpt", "/root/thu-plm/CPM-2-Finetune/results/lcqmc/cpm2_finetune_lr0.000002_G1/",
          "path with spaces/and #hash", "中文 ünïcode", "tab\tand\nnewline", [1, 2.5, "x"], (32, 32, 6000000), [],
          {"train": "a.jsonl", "validation": "b.jsonl"}, {"inputs": 512, "targets": 114}, [["nested", 1], {"k": None}],
          ("text", "summary")]


def rendered(value) -> str:
    out = translate.Out(upstream.Upstream("megatron", ["run.sh"], {}))
    out.set("VALUE", value, "why")
    [line] = translate.binding_lines(out.bindings[0])
    return line


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_every_kind_of_value_round_trips_through_gin(value):
    gin.clear_config()
    try:
        gin.parse_config(rendered(value))
        assert gin.query_parameter("%VALUE") == value
    finally:
        gin.clear_config()


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), [1.0, float("nan")],
                                   {"coef": float("inf")}])
def test_a_value_gin_cannot_write_is_refused_naming_where_it_came_from(value):
    with pytest.raises(UserError, match=r"^--moe-aux-loss-coeff nan \(run.sh:3\): .* is not a finite number; fix the "
                                        r"value.$"):
        translate.Out(upstream.Upstream("megatron", ["run.sh"], {})).set(
            "model_config.router_aux_loss_coef", value, "--moe-aux-loss-coeff nan (run.sh:3)")
