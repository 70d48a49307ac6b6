"""The documentation's shell commands, read from the pages, and a runner that executes them as written.

Conventions in README.md and docs/*.md (docs/testing.md, "Documented commands"):

- A ```bash block holds commands a user types, one per line (`\\` continues a line; `#` lines are comments).
  Other fences (```text, ```gin, ```json, ```python) hold output and file contents and are not run.
- `<!-- not run: REASON -->` on the line before a ```bash block: its commands need what CI lacks (a GPU, a TPU
  pod, a SLURM cluster, the network); the reason is shown on the page's source and counted.
- `<!-- file: NAME -->` on the line before a fence: the block is a file the user saves as NAME (relative to the
  page's working directory); the runner writes it before running the commands that follow it.

Each page's commands run in order in one fresh working directory of the test's own, with relative paths,
`python` from this virtualenv first on PATH, 8 simulated CPU devices, and T5X_LIKE_EXTRA_GIN naming a copy
of tests/docs/small.gin (a few steps of a small model) that also sets short sequences for the command's kind
of model: training commands are made small by that file alone, never by editing their text.
"""
from __future__ import annotations

import dataclasses
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[2]
SMALL_GIN = Path(__file__).resolve().parent / "small.gin"
SMALL_MODEL = "'num_layers': 2, 'num_heads': 4, 'embed_dim': 32, 'mlp_dim': 64"
SMALL_BY_KIND = {
    "decoder_only": ["SEQ_LEN = 32", f"model_config.overrides = {{{SMALL_MODEL}}}"],
    "encoder_decoder": ["FEATURE_LENGTHS = {'inputs': 32, 'targets': 16}",
                        f"model_config.overrides = {{{SMALL_MODEL}, 'num_decoder_layers': 2, 'd_kv': 8}}"],
    "encoder_only": ["FEATURE_LENGTHS = {'inputs': 32}", f"model_config.overrides = {{{SMALL_MODEL}}}"],
}
"""The lines small.gin gets for each kind of model: the sequence lengths' macro differs between kinds (an
encoder-decoder run file refuses SEQ_LEN) and so do the model's fields (T5 has its decoder's own)."""
COMMAND_TIMEOUT_S = 300
RUN_FILES_BY_KIND = (("encoder_decoder", re.compile(r"--gin_file=\S*(t5|cpm2)")),
                     ("encoder_only", re.compile(r"--gin_file=\S*(bert|roberta|boolq)")))
PAGES = ("README.md", *sorted(f"docs/{p.name}" for p in (REPO / "docs").glob("*.md")))
FENCE = re.compile(r"^(?P<indent>\s*)(?P<fence>```+|~~~+)\s*(?P<info>[\w+-]*)\s*$")
NOT_RUN = re.compile(r"^\s*<!--\s*not run:\s*(?P<reason>.+?)\s*-->\s*$")
FILE = re.compile(r"^\s*<!--\s*file:\s*(?P<name>\S+)\s*-->\s*$")
SHELL = ("bash", "sh", "shell", "console")
COMMAND_LINE = re.compile(r"^(python3?|\.venv/bin/\S+|make|pip|scripts/\S+|sbatch|XLA_FLAGS=\S*|mkdocs) ")


@dataclasses.dataclass(frozen=True)
class Command:
    page: str
    line: int
    text: str
    not_run: str | None = None

    @property
    def id(self) -> str:
        words = " ".join(self.text.replace("\\\n", " ").split())
        return f"{self.page}:{self.line} {words[:60]}"


@dataclasses.dataclass(frozen=True)
class Page:
    """How a test module follows a page: the inputs (tests/docs/inputs.py) its working directory starts with,
    and `after`: the page it continues, in that page's working directory once every command there has run
    (the Evaluation page evaluates the run the GPT-2 page trained)."""
    inputs: tuple[str, ...] = ()
    after: str | None = None


@dataclasses.dataclass(frozen=True)
class File:
    page: str
    line: int
    name: str
    text: str


@dataclasses.dataclass(frozen=True)
class Fence:
    """A fenced block: the line its body starts on, its info string (`bash`, `python`, ...), its body (the
    fence's indentation removed) and the nonblank line before it (a mark, or prose)."""
    line: int
    info: str
    body: list[str]
    before: str


def fences(page: str) -> list[Fence]:
    """The fenced blocks of a page, in order."""
    lines = (REPO / page).read_text(encoding="utf-8").splitlines()
    found: list[Fence] = []
    i = 0
    while i < len(lines):
        match = FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence = len(match["indent"]), match["fence"]
        end = i + 1
        while end < len(lines) and not (lines[end].strip().startswith(fence) and lines[end].strip() == fence):
            end += 1
        body = [line[indent:] if line[:indent].strip() == "" else line.lstrip() for line in lines[i + 1:end]]
        found.append(Fence(i + 2, match["info"], body, _previous_nonblank(lines, i)))
        i = end + 1
    return found


def read_page(page: str) -> list[Command | File]:
    """The commands and files of a page, in order."""
    items: list[Command | File] = []
    for fence in fences(page):
        if (file := FILE.match(fence.before)):
            items.append(File(page, fence.line, file["name"], "\n".join(fence.body) + "\n"))
        elif fence.info in SHELL:
            reason = NOT_RUN.match(fence.before)
            items += split_commands(page, fence.line, fence.body, reason["reason"] if reason else None)
    return items


def python_blocks(page: str) -> list[str]:
    """The ```python blocks of a page: not run here (they are not shell commands); the test of what a block shows
    executes it (tests/t5x_like/inference/test_model.py runs generation.md's and conversion.md's)."""
    return ["\n".join(fence.body) + "\n" for fence in fences(page) if fence.info == "python"]


def _previous_nonblank(lines: list[str], i: int) -> str:
    j = i - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    return lines[j] if j >= 0 else ""


def split_commands(page: str, first_line: int, body: list[str], not_run: str | None) -> list[Command]:
    """One Command per logical line (backslash continuations joined); comment lines are skipped."""
    commands, current, start = [], [], 0
    for offset, line in enumerate(body):
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if not current:
            start = first_line + offset
        current.append(line)
        if not line.rstrip().endswith("\\"):
            commands.append(Command(page, start, "\n".join(current), not_run))
            current = []
    if current:
        raise ValueError(f"{page}:{start}: a command ends with a backslash continuation and no next line")
    return commands


def commands(pages=PAGES) -> list[Command]:
    return [item for page in pages for item in read_page(page) if isinstance(item, Command)]


def hidden_commands(page: str) -> list[str]:
    """Command lines the runner would not see: in an indented code block, or in a fence that is not a shell
    block (a ```text block holding `python -m ...`). Each must become a ```bash block, run or marked."""
    found, fence = [], None
    for number, line in enumerate((REPO / page).read_text(encoding="utf-8").splitlines(), 1):
        match = FENCE.match(line)
        if match and fence is None:
            fence = match["info"] or "(none)"
        elif match and not match["info"]:
            fence = None
        elif fence in SHELL:
            continue
        elif (fence is not None and COMMAND_LINE.match(line.strip())) or (fence is None and line.startswith("    ")
                                                                            and COMMAND_LINE.match(line.strip())):
            found.append(f"{page}:{number}: {line.strip()}")
    return found


# ---------------------------------------------------------------- running a page


def model_kind(command: Command) -> str:
    """decoder_only, encoder_decoder or encoder_only, from the run files a command names."""
    return next((kind for kind, pattern in RUN_FILES_BY_KIND if pattern.search(command.text)), "decoder_only")


def write_small_gin(directory: Path) -> dict[str, Path]:
    """small.gin plus each kind's lines, as files in `directory`: kind -> path."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for kind, lines in SMALL_BY_KIND.items():
        paths[kind] = directory / f"small_{kind}.gin"
        paths[kind].write_text(SMALL_GIN.read_text() + "".join(f"{line}\n" for line in lines))
    return paths


def command_env(cache_dir: Path) -> dict[str, str]:
    """What a user's shell has after `source .venv/bin/activate` on a CPU machine, plus the suite's settings:
    8 simulated devices, the suite's XLA flags (tests/conftest.py: the cheapest CPU code generation), JAX's
    compilation cache for the session, and no network for transformers (the runner adds T5X_LIKE_EXTRA_GIN per command)."""
    from tests.support.environment import cpu_env

    env = cpu_env(8)
    return dict(env, PATH=f"{os.path.dirname(sys.executable)}{os.pathsep}{env.get('PATH', '')}",
                JAX_COMPILATION_CACHE_DIR=str(cache_dir), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1",
                PYTHONUNBUFFERED="1", TF_CPP_MIN_LOG_LEVEL="2")


class PageRun:
    """One page followed by a user: a working directory with the page's inputs, its files and commands run in
    order; a command's test first runs the page's earlier commands that have not run yet."""

    def __init__(self, page: str, workdir: Path, env: dict[str, str], small: dict[str, Path],
                 inputs: Callable[[Path], None]):
        self.page, self.workdir, self.env, self.small, self.inputs = page, workdir, env, small, inputs
        self.items = read_page(page)
        self.done = 0
        self.results: dict[Command, tuple[bool, str]] = {}
        self.ready = False

    def run_through(self, command: Command) -> str:
        """Run every pending item up to and including `command` (an earlier command that fails is noted and
        the page goes on, as a user would); return the command's output, or raise AssertionError."""
        self.run_until(self.items.index(command) + 1)
        ok, output = self.results[command]
        if not ok:
            earlier = [c.id for c, (good, _) in self.results.items() if not good and c is not command]
            note = f"\n(earlier commands of this page that failed: {earlier})" if earlier else ""
            raise AssertionError(f"{command.page}:{command.line} failed as written, run in {self.workdir}:\n"
                                 f"{command.text}\n--- output (last 4000 characters) ---\n{output[-4000:]}{note}")
        return output

    def run_until(self, end: int | None = None) -> None:
        """Write the files and run the commands of items[:end] not yet done (all of them by default)."""
        if not self.ready:
            self.inputs(self.workdir)
            self.ready = True
        for item in self.items[self.done:end]:
            self.done += 1
            if isinstance(item, File):
                path = self.workdir / item.name
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(item.text, encoding="utf-8")
            elif item.not_run is None:
                self.results[item] = self.execute(item)

    def execute(self, command: Command) -> tuple[bool, str]:
        """Run one command in bash (-e, pipefail) in the page's directory; a command past COMMAND_TIMEOUT_S is
        killed with everything it started."""
        started, cpu = time.monotonic(), _children_cpu()
        env = dict(self.env, T5X_LIKE_EXTRA_GIN=str(self.small[model_kind(command)]))
        process = subprocess.Popen(["bash", "-eo", "pipefail", "-c", command.text], cwd=self.workdir, env=env,
                                   stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, start_new_session=True)
        try:
            output, _ = process.communicate(timeout=COMMAND_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output = process.communicate()[0] + f"\n(killed after {COMMAND_TIMEOUT_S} s)"
        print(f"{command.page}:{command.line} exit {process.returncode} in {time.monotonic() - started:.1f} s, "
              f"{_children_cpu() - cpu:.1f} s of CPU")
        return process.returncode == 0, output


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def copy_into(source: Path, dest: Path) -> None:
    if source.is_dir():
        shutil.copytree(source, dest, dirs_exist_ok=True)
    else:
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, dest)
