"""The commands of the GPT-2 page and the pages that continue it (evaluation, generation, conversion, outputs),
of parallelism and migrating, and of README.md, run as written (tests/docs/doc_commands.py). The other pages are
in test_docs_models.py: two files, so `make test`'s two workers share the work."""
import pytest

from tests.docs.doc_commands import commands
from tests.docs.pages import TOOL_PAGES

pytestmark = pytest.mark.system

PAGES = TOOL_PAGES  # the pages this module follows (tests/docs/conftest.py's page_runs reads them)
RUN = [c for c in commands(PAGES) if c.not_run is None]


@pytest.mark.timeout(900)  # a command's test may first run the page's earlier commands
@pytest.mark.parametrize("command", RUN, ids=[c.id for c in RUN])
def test_documented_command(command, page_runs):
    page_runs[command.page].run_through(command)
