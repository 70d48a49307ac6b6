"""The suite's own rules (docs/testing.md): tiers, no test module imported by another, ../shared reached only
through its guard, and a process started or shared data read past the guard fails the test that did it."""
import ast
import os
import re
import subprocess
import sys
from pathlib import Path

# jax is imported here, outside the pytester sessions below: each of those forgets the modules it imported, and
# jaxlib imported a second time aborts the process (absl's logging set up twice)
import jax  # noqa: F401
import pytest

from tests.support import environment, shared_data, tiers

TESTS = Path(__file__).resolve().parent
CONFTEST_ROOT = TESTS.parent


def python_files():
    return sorted(p for p in TESTS.rglob("*.py") if "__pycache__" not in p.parts)


def imported_modules(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


def test_no_test_module_imports_another():
    """Shared helpers live in tests/support (or a conftest); a test module imports no `test_*` module."""
    offenders = {str(p.relative_to(CONFTEST_ROOT)): sorted(n for n in imported_modules(p)
                                                           if re.search(r"(^|\.)test_\w+$", n))
                 for p in python_files()}
    assert {path: names for path, names in offenders.items() if names} == {}


def test_only_the_shared_data_module_builds_paths_into_shared():
    """A path into ../shared/data built by hand bypasses the skip a fresh clone needs."""
    pattern = re.compile(r"""["']shared["']\s*(/|,)\s*["']data["']""")
    found = [str(p.relative_to(CONFTEST_ROOT)) for p in python_files()
             if p.name != "shared_data.py" and p != Path(__file__) and pattern.search(p.read_text(encoding="utf-8"))]
    assert found == []


@pytest.mark.parametrize("marks, tier", [(set(), "unit"), ({"integration"}, "integration"),
                                         ({"system", "slow_io"}, "system"), ({"pulse", "integration"}, "integration")])
def test_a_test_has_the_tier_its_marks_give(marks, tier):
    assert tiers.tier_of(marks) == tier


def test_two_tiers_on_one_test_are_refused():
    with pytest.raises(ValueError, match=r"two tiers \['integration', 'system'\]"):
        tiers.tier_of({"integration", "system"})


def test_a_read_under_shared_data_is_seen():
    """The watch sees a file opened under ../shared/data (this one through its guard, so the test passes)."""
    tiers.reset()
    path = shared_data.shared_file("gpt2-bpe", "vocab.bpe")
    path.read_bytes()
    assert tiers.shared_files_opened() == [str(path)] and shared_data.reached_by_helper()


def test_paths_outside_shared_data_are_not_taken_for_it(tmp_path):
    assert not shared_data.is_shared(str(tmp_path / "shared" / "data" / "x"))
    assert shared_data.is_shared(str(shared_data.SHARED_DATA / "x")) and not shared_data.is_shared(3)


@pytest.mark.system
def test_a_process_a_test_starts_is_seen():
    tiers.reset()
    subprocess.run([sys.executable, "-c", "pass"], check=True)
    assert any(sys.executable in line for line in tiers.processes_started())


RULE_BREAKERS = '''
import subprocess, sys

import pytest

from tests.support.shared_data import SHARED_DATA, shared_file


@pytest.fixture(scope="session")
def bpe():
    return shared_file("gpt2-bpe")

def test_reads_through_a_session_fixture(bpe):
    (bpe / "vocab.bpe").read_bytes()

def test_reads_through_it_again(bpe):
    (bpe / "encoder.json").read_bytes()


@pytest.fixture(scope="module")
def made_by_a_process():
    return subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True, text=True).stdout

@pytest.mark.system
def test_sets_the_fixture_up(made_by_a_process):
    assert made_by_a_process.strip() == "1"

def test_uses_it_unmarked(made_by_a_process):
    assert made_by_a_process.strip() == "1"

def test_starts_a_process_unmarked():
    subprocess.run([sys.executable, "-c", "pass"], check=True)

def test_reads_shared_data_unguarded():
    next(p for p in SHARED_DATA.rglob("*") if p.is_file()).read_bytes()
'''


@pytest.mark.system
def test_breaking_a_rule_fails_the_test_that_did_it(pytester):
    """Run as their own session (in this process): an unmarked test that starts a process, and one that reads
    ../shared/data without the guard, both fail at teardown, each naming what it did, and so does an unmarked test
    using a fixture that started a process when another test set it up; tests reading ../shared/data through a
    session-scoped fixture that took it from the guard pass (the second one sets nothing up)."""
    shared_data.shared_file()  # the second case needs the data to exist
    pytester.makeini("[pytest]\n")  # the root directory is above tests/, as in this checkout
    inner = pytester.mkdir("tests")
    (inner / "conftest.py").write_text(f"import sys\nsys.path.insert(0, {str(CONFTEST_ROOT)!r})\n"
                                       "from tests.conftest import *\n")
    (inner / "test_breakers.py").write_text(RULE_BREAKERS)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q", "tests")
    tiers.reset()  # what the inner session saw is not this test's doing
    result.assert_outcomes(passed=6, errors=3)
    result.stdout.re_match_lines([r".*test_starts_a_process_unmarked starts a process \(subprocess.Popen .*\) but is "
                                  r"not marked @pytest.mark.system.*"], consecutive=False)
    result.stdout.re_match_lines([r".*test_uses_it_unmarked starts a process through its fixture 'made_by_a_process' "
                                  r"but is not marked @pytest.mark.system.*"], consecutive=False)
    result.stdout.re_match_lines([r".*test_reads_shared_data_unguarded reads .*shared/data.* without "
                                  r"tests.support.shared_data.shared_file.*"], consecutive=False)


COMPILED_ACROSS_FILES = {
    "conftest.py": "import jax, pytest\n"
                   "@pytest.fixture(scope='session')\n"
                   "def add_one():\n"
                   "    return jax.jit(lambda x: x + 1)\n",
    "test_first.py": "def test_compiles(add_one):\n"
                     "    add_one(1.0)\n"
                     "def test_keeps_it_within_the_file(add_one):\n"
                     "    assert add_one._cache_size() == 1\n",
    "test_second.py": "def test_finds_it_dropped(add_one):\n"
                      "    assert add_one._cache_size() == 0\n",
}


def test_a_worker_drops_its_compiled_programs_after_each_file(pytester):
    """tests/conftest.py's teardown hook: a program compiled in one file is still compiled for that file's next
    test, and gone (environment.release_compiled) when the next file starts."""
    pytester.makeini("[pytest]\n")
    inner = pytester.mkdir("tests")
    conftest = f"import sys\nsys.path.insert(0, {str(CONFTEST_ROOT)!r})\nfrom tests.conftest import *\n"
    for name, text in COMPILED_ACROSS_FILES.items():
        (inner / name).write_text(conftest + text if name == "conftest.py" else text)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q", "tests")
    result.assert_outcomes(passed=3)


def test_the_compilation_cache_is_pruned_oldest_first_past_its_size(tmp_path, monkeypatch):
    monkeypatch.setattr(environment, "CACHE_MAX_BYTES", 250)
    monkeypatch.setattr(environment, "CACHE_KEPT_BYTES", 150)
    for age in range(4):  # entry0 is the newest
        path = tmp_path / f"entry{age}"
        path.write_bytes(b"x" * 100)
        os.utime(path, (1000 - age, 1000 - age))
    environment.prune_cache(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry0"]
    environment.prune_cache(str(tmp_path))  # under the cap: nothing goes
    environment.prune_cache(str(tmp_path / "absent"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry0"]
