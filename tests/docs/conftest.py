"""Fixtures of the doc-command tests: one PageRun per page of the test module's PAGES (page -> Page)."""
import pytest

from tests.docs.doc_commands import PageRun, command_env, write_small_gin
from tests.docs.inputs import Inputs


@pytest.fixture(scope="session")
def doc_inputs(tmp_path_factory) -> Inputs:
    return Inputs(tmp_path_factory.mktemp("doc_inputs"))


@pytest.fixture(scope="module")
def page_runs(request, tmp_path_factory, doc_inputs) -> dict[str, PageRun]:
    """A PageRun per page; a page that continues another shares its working directory and first follows it."""
    base = tmp_path_factory.getbasetemp()
    env, small = command_env(base / "jax_cache"), write_small_gin(base / "small_gin")
    runs: dict[str, PageRun] = {}

    def prepare(page, workdir):
        spec = request.module.PAGES[page]
        if spec.after:
            runs[spec.after].run_until()
        doc_inputs.copy(list(spec.inputs), workdir)

    for page, spec in request.module.PAGES.items():
        workdir = (runs[spec.after].workdir if spec.after
                   else tmp_path_factory.mktemp(page.replace("/", "_").removesuffix(".md")))
        runs[page] = PageRun(page, workdir, env, small, lambda d, page=page: prepare(page, d))
    return runs
