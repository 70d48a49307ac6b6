"""The documentation as a whole: the mkdocs site builds strictly, every command is either run by a test or
marked with its reason, no command hides outside a ```bash block, and docs/testing.md states the counts."""
import collections
import re
import subprocess
import sys
import warnings

import pytest

from tests.docs.doc_commands import PAGES, REPO, commands, hidden_commands
from tests.docs.pages import MODEL_PAGES, TOOL_PAGES

ABSOLUTE_PATH = re.compile(r"""(?:^|[\s='"])/(?!dev/)[\w.-]+/""")


def summary() -> str:
    found = commands()
    marked = [c for c in found if c.not_run]
    reasons = collections.Counter(c.not_run for c in marked)
    lines = [f"{len(found)} commands in README.md and docs/*.md: {len(found) - len(marked)} run as written, "
             f"{len(marked)} marked not run"]
    lines += [f"  {n} x not run: {reason}" for reason, n in reasons.most_common()]
    return "\n".join(lines)


@pytest.mark.system
def test_the_site_builds_strictly(tmp_path):
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file",
                           str(REPO / "mkdocs.yml"), "--site-dir", str(tmp_path / "site")],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "index.html").is_file() and (tmp_path / "site" / "t5" / "index.html").is_file()


def test_every_page_is_followed_by_one_test_module():
    followed = [*MODEL_PAGES, *TOOL_PAGES]
    assert sorted(followed) == sorted(PAGES), "each of README.md and docs/*.md belongs to exactly one doc-command test"


def test_no_command_hides_outside_a_bash_block():
    hidden = [line for page in PAGES for line in hidden_commands(page)]
    assert not hidden, "commands outside ```bash blocks (make them ```bash, run or marked not run):\n" + "\n".join(hidden)


def test_commands_that_run_use_relative_paths():
    absolute = [c.id for c in commands() if not c.not_run and ABSOLUTE_PATH.search(c.text)]
    assert not absolute, f"documented commands must run from a working directory of one's own: {absolute}"


def test_readme_links_point_at_files():
    links = re.findall(r"\]\(((?!https?:)[^)#]+)(?:#[^)]*)?\)", (REPO / "README.md").read_text(encoding="utf-8"))
    missing = [link for link in links if not (REPO / link).exists()]
    assert links and not missing, missing


class DocCommandCount(UserWarning):
    """Not a problem: how many documented commands run and how many are marked, shown in pytest's warnings
    summary (where `make test`'s output shows it, also from an xdist worker)."""


def test_testing_md_states_how_many_commands_run_and_how_many_are_marked():
    text = summary()
    print(text)
    warnings.warn(DocCommandCount(text))
    first = text.splitlines()[0]
    assert first in (REPO / "docs" / "testing.md").read_text(encoding="utf-8"), (
        f"docs/testing.md must say, as counted now:\n{text}")
