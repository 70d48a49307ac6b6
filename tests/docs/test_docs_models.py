"""The commands of the model-family, data and configuration pages, run as written (tests/docs/doc_commands.py).
The other pages are in test_docs_tools.py: two files, so `make test`'s two workers share the work."""
import pytest

from tests.docs.doc_commands import Page, commands

PAGES = {
    "docs/configure.md": Page(),
    "docs/neox.md": Page(("pile", "20B_tokenizer.json")),
    "docs/llama.md": Page(("wikitext-103", "lambada_test.jsonl")),
    "docs/cpm.md": Page(("cpm-generate", "zh")),
    "docs/t5.md": Page(("t5-v1_1-base", "c4", "train.jsonl", "dev.jsonl")),
    "docs/bert.md": Page(("bert-base-uncased", "wiki", "BoolQ")),
    "docs/data.md": Page(("openwebtext", "wiki", "pairs.jsonl", "t5-v1_1-base")),
}
RUN = [c for c in commands(PAGES) if c.not_run is None]


@pytest.mark.timeout(900)  # a command's test may first run the page's earlier commands
@pytest.mark.parametrize("command", RUN, ids=[c.id for c in RUN])
def test_documented_command(command, page_runs):
    page_runs[command.page].run_through(command)
