"""scripts/benchmark_lm_eval.py on a tiny shape: every request type gets a row with both backends' rates, and
the two backends answer alike (the script's own agreement columns)."""
import pytest

pytest.importorskip("torch", reason="needs the torch extra")
pytest.importorskip("lm_eval", reason="needs the lm_eval extra")

from scripts import benchmark_lm_eval  # noqa: E402


def test_a_tiny_run_measures_every_request_type_with_both_backends_agreeing(tmp_path, capsys):
    out = tmp_path / "rows.jsonl"
    rows = benchmark_lm_eval.main(["--layers=1", "--width=32", "--max_len=64", "--batch_size=4", "--contexts=2",
                                   "--documents=1", "--document_chars=400", "--prompts=2", "--max_gen_toks=4",
                                   "--repeats=1", f"--out={out}"])
    assert [row["request_type"] for row in rows] == list(benchmark_lm_eval.REQUEST_TYPES)
    assert [row["requests"] for row in rows] == [8, 1, 2]
    for row in rows:
        assert row["ours_requests_per_s"] > 0 and row["hf_requests_per_s"] > 0
        assert row["ratio"] == pytest.approx(row["ours_requests_per_s"] / row["hf_requests_per_s"])
    assert rows[0]["max_abs_loglikelihood_difference"] < 1e-4 and rows[0]["greedy_flags_differing"] == 0
    assert rows[1]["max_abs_loglikelihood_difference"] < 1e-3  # a document's sum over ~100 tokens, fp32 each
    assert rows[2]["generations_differing"] == 0
    assert "| loglikelihood | 8 |" in capsys.readouterr().out
    assert len(out.read_text().splitlines()) == 3
