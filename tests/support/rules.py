"""The pytest side of the suite's tiers and rules (tests/support/tiers.py): every test gets its tier, a test marked
`shared_data` skips without ../shared/data, and one that starts a process unmarked, or reads ../shared/data past its
guard, fails at teardown. Registered by tests/conftest.py as a plugin: a conftest below the root directory would not
see session-scoped fixtures being set up."""
import os

import pytest

from tests.support import environment, shared_data, tiers

tiers.start_watching()
_FIXTURES_READING_SHARED: set[str] = set()
_FIXTURES_STARTING_PROCESSES: set[str] = set()


def pytest_configure(config):
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # once a run, in the controller
        environment.prune_cache(os.environ["JAX_COMPILATION_CACHE_DIR"])


def pytest_collection_modifyitems(config, items):
    """Every test gets its tier: unit unless marked integration or system (`pytest -m unit` selects it)."""
    for item in items:
        try:
            tier = tiers.tier_of({mark.name for mark in item.iter_markers()})
        except ValueError as error:
            raise pytest.UsageError(f"{item.nodeid}: {error}") from None
        if tier == "unit":
            item.add_marker(pytest.mark.unit)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    tiers.reset()
    mark = item.get_closest_marker("shared_data")
    if mark is not None:
        shared_data.shared_file(*mark.args)


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """Remembers the fixtures that took a path from shared_data.shared_file (the tests using them may read it) and
    those that started a process (the tests using them are system tests, whichever set the fixture up)."""
    reached_before = shared_data.reached_by_helper()
    shared_data.start_test()
    processes_before = len(tiers.processes_started())
    try:
        return (yield)
    finally:
        if len(tiers.processes_started()) > processes_before:
            _FIXTURES_STARTING_PROCESSES.add(fixturedef.argname)
        if shared_data.reached_by_helper():
            _FIXTURES_READING_SHARED.add(fixturedef.argname)
        if reached_before or shared_data.reached_by_helper():
            shared_data.mark_reached()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """A test that started a process without the system mark, or read ../shared/data past its guard, fails."""
    result = yield
    started = tiers.processes_started()
    by_fixture = sorted(_FIXTURES_STARTING_PROCESSES.intersection(getattr(item, "fixturenames", ())))
    if (started or by_fixture) and item.get_closest_marker("system") is None:
        what = f"a process ({started[0]})" if started else f"a process through its fixture {by_fixture[0]!r}"
        raise pytest.fail.Exception(f"{item.nodeid} starts {what} but is not marked @pytest.mark.system "
                                    "(tests/support/tiers.py)", pytrace=False)
    opened = tiers.shared_files_opened()
    guarded = (shared_data.reached_by_helper() or item.get_closest_marker("shared_data") is not None
               or _FIXTURES_READING_SHARED.intersection(getattr(item, "fixturenames", ())))
    if opened and not guarded:
        raise pytest.fail.Exception(f"{item.nodeid} reads {opened[0]} without tests.support.shared_data.shared_file "
                                    "(or its needs_shared mark), so a clone without ../shared fails instead of "
                                    "skipping", pytrace=False)
    return result
