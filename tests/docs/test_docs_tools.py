"""The commands of the GPT-2 page and the pages that continue it (evaluation, generation, conversion, outputs),
of parallelism and migrating, and of README.md, run as written (tests/docs/doc_commands.py). The other pages are
in test_docs_models.py: two files, so `make test`'s two workers share the work."""
import pytest

from tests.docs.doc_commands import Page, commands

GPT2 = "docs/gpt2.md"
PAGES = {
    "README.md": Page(),
    "docs/index.md": Page(),
    GPT2: Page(("openwebtext", "gpt2-bpe")),
    "docs/evaluation.md": Page(("wikitext-103", "lambada_test.jsonl"), after=GPT2),
    "docs/generation.md": Page(after=GPT2),
    "docs/conversion.md": Page(("gpt2",), after=GPT2),
    "docs/outputs.md": Page(after=GPT2),
    "docs/parallelism.md": Page(),
    "docs/attention.md": Page(),
    "docs/clusters.md": Page(),
    "docs/migrating.md": Page(("megatron", "train.json")),
    "docs/troubleshooting.md": Page(),
    "docs/benchmarks.md": Page(),
    "docs/testing.md": Page(),
    "docs/add_a_family.md": Page(),
    "docs/add_an_objective.md": Page(),
}
RUN = [c for c in commands(PAGES) if c.not_run is None]


@pytest.mark.timeout(900)  # a command's test may first run the page's earlier commands
@pytest.mark.parametrize("command", RUN, ids=[c.id for c in RUN])
def test_documented_command(command, page_runs):
    page_runs[command.page].run_through(command)
