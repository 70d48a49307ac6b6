"""scripts/benchmark_inference.py on a tiny shape: both tasks get a row with both sides' whole-process rates, and the
two sides answer alike (the same tokens and perplexity, the same greedy generations)."""
import pytest

pytest.importorskip("torch", reason="needs the torch extra")
pytest.importorskip("transformers", reason="needs the torch extra")

from scripts import benchmark_inference  # noqa: E402
from tests.support.shared_data import shared_file  # noqa: E402

pytestmark = pytest.mark.system


def test_a_tiny_run_measures_both_tasks_with_both_sides_agreeing(tmp_path, capsys):
    out = tmp_path / "rows.jsonl"
    wikitext = shared_file("wikitext", "wt103-tokenized", "wiki.test.tokens")
    rows = benchmark_inference.main([f"--wikitext={wikitext}", "--layers=1", "--width=32", "--max_len=64", "--lines=40", "--seq_len=64",
                                     "--stride=32", "--batch_size=4", "--prompts=4", "--prompt_words=8",
                                     "--max_new_tokens=4", f"--out={out}"])
    assert [row["task"] for row in rows] == ["wikitext", "generate"]
    for row in rows:
        assert row["ours_tokens_per_s"] > 0 and row["transformers_tokens_per_s"] > 0
        assert row["ratio"] == pytest.approx(row["ours_tokens_per_s"] / row["transformers_tokens_per_s"])
        assert row["ours_tokens_per_s"] == pytest.approx(row["tokens"] / row["ours_seconds"])
    wikitext, generate = rows
    assert wikitext["same_tokens"] and wikitext["tokens"] > 1000
    assert wikitext["ours_ppl"] == pytest.approx(wikitext["transformers_ppl"], rel=1e-5)
    assert (generate["prompts"], generate["tokens"], generate["generations_differing"]) == (4, 16, 0)
    printed = capsys.readouterr().out
    assert "| WikiText perplexity |" in printed and "| greedy generation | 16 |" in printed
    assert len(out.read_text().splitlines()) == 2
