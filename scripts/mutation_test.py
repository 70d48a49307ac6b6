"""Mutation testing of the core modules with mutmut, each module against its own fast unit tests.

    .venv/bin/python scripts/mutation_test.py [module ...] [--sample N] [--seed S] [--budget SECONDS]

Modules are the names in MODULES (default: all of them). For each module the script copies the working
tree (tracked and untracked, not ignored, files) to a private directory (never mutating this checkout, so
tests running here are not disturbed), configures mutmut to mutate only that module's file and to select
only that module's test files, draws a random sample of its mutants (all of them when there are fewer
than --sample), runs them one at a time (one worker: 2-core machines) within --budget seconds, and
prints a table: module, mutants in the file, mutants sampled, killed, survived, timeout, not run, score
(killed + timeout over the mutants that ran). The surviving mutants' diffs go to
<workdir>/<module>/survivors.txt; the table is also appended to <workdir>/results.md. docs/testing.md
holds the last recorded run and what survived.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MUTMUT = Path(sys.executable).with_name("mutmut")

MODULES: dict[str, tuple[str, tuple[str, ...]]] = {
    # test_step_fns.py's other tests train real models on several meshes: minutes each on 2 busy cores
    "trainer": ("t5x_like/step_fns.py", ("tests/t5x_like/test_step_fns.py",
                                        "-k", "loss_scale_update_rules or linear or eval_step_sums")),
    "optim": ("t5x_like/optim.py", ("tests/t5x_like/test_optim.py",)),
    "lm": ("t5x_like/lm/base.py", ("tests/t5x_like/lm/test_language_model.py",)),
    "features": ("t5x_like/features.py", ("tests/t5x_like/test_features.py",)),
    "span_corruption": ("t5x_like/data/objectives/span_corruption.py", (
        "tests/t5x_like/data/objectives/test_span_corruption.py",)),
    "seq2seq": ("t5x_like/data/objectives/seq2seq.py", ("tests/t5x_like/data/objectives/test_seq2seq.py",)),
    # BERT's masking and classification data are tested beside BERT's training and fine-tuning, left out here
    "mlm": ("t5x_like/data/objectives/mlm.py", (
        "tests/t5x_like/data/objectives/test_mlm.py", "tests/t5x_like/data/objectives/test_mlm_training.py",
        "-k", "not mlm_training_on_data")),
    "classification": ("t5x_like/data/objectives/classification.py", (
        "tests/t5x_like/data/objectives/test_classification.py", "tests/t5x_like/eval/test_classification.py",
        "-k", "not fine_tuning and not restore_from")),
    "loader": ("t5x_like/data/loader.py", ("tests/t5x_like/data/test_loader.py",)),
    "rules": ("partitioning/rules.py", ("tests/partitioning/test_rules.py",)),
    # the layer library (models/layers/), a module and its mirror test file each; decoding through the
    # attention is tested beside the KV cache
    **{f"layers.{name}": (f"models/layers/{name}.py", tuple(f"tests/models/layers/test_{test}.py" for test in tests))
       for name, tests in (("dense", ("dense",)), ("embeddings", ("embeddings",)), ("positions", ("positions",)),
                           ("norms", ("norms",)), ("mlp", ("mlp",)), ("kv_cache", ("kv_cache",)),
                           ("attention", ("attention", "kv_cache")), ("stack", ("stack",)),
                           ("decoder", ("decoder",)))},
}
"""module name -> (its file, its own fast unit test files and any pytest selection flags)."""

PACKAGES = ("t5x_like", "models", "partitioning", "configs")
"""Copied into mutmut's mutants/ tree so that every import resolves there, never to this checkout."""

STATUS_BY_EXIT_CODE = {1: "killed", 3: "killed", 0: "survived", 36: "timeout", -24: "timeout", 24: "timeout",
                       152: "timeout", 255: "timeout", None: "not run", 5: "no tests", 33: "no tests"}
"""mutmut's exit codes (mutmut.stats.status_by_exit_code), folded to the table's columns."""


@dataclass
class Score:
    module: str
    mutants: int
    sampled: int
    counts: dict[str, int]
    seconds: float

    @property
    def ran(self) -> int:
        return self.sampled - self.counts.get("not run", 0)

    @property
    def score(self) -> float | None:
        caught = self.counts.get("killed", 0) + self.counts.get("timeout", 0)
        return caught / self.ran if self.ran else None

    def row(self) -> str:
        score = "-" if self.score is None else f"{100 * self.score:.1f} %"
        c = self.counts
        other = self.ran - c.get("killed", 0) - c.get("survived", 0) - c.get("timeout", 0)
        return (f"| {self.module} | {self.mutants} | {self.sampled} | {c.get('killed', 0)} | {c.get('survived', 0)} "
                f"| {c.get('timeout', 0)} | {other} | {c.get('not run', 0)} | {score} | {self.seconds:.0f} s |")


HEADER = ("| module | mutants | sampled | killed | survived | timeout | other | not run | score | time |\n"
          "|---|---|---|---|---|---|---|---|---|---|")


def copy_tree(dest: Path) -> None:
    """The working tree's non-ignored files (committed or not) into `dest`, and ../shared beside it."""
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=REPO, check=True,
                            capture_output=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        source = REPO / name
        if source.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    shared = REPO.parent / "shared"
    if shared.is_dir():  # tests find the real tokenizers at <repo>/../shared; mutmut runs them from mutants/
        (dest / "shared").symlink_to(shared)


def configure_mutmut(dest: Path, source: str, tests: tuple[str, ...]) -> None:
    """A [mutmut] section in the copy's setup.cfg: mutate `source` only, select `tests` only."""
    lines = ["", "[mutmut]", "source_paths =", *(f"    {p}" for p in PACKAGES), f"only_mutate = {source}",
             "pytest_add_cli_args_test_selection =", *(f"    {t}" for t in tests),
             "pytest_add_cli_args = -p no:cacheprovider",
             "also_copy =", "    gin", "    scripts",
             # jax is not fork-safe once its backend runs: fork every mutant from a server that only collected.
             "process_isolation = forkserver", "use_git_change_detection = false",
             # a mutant that loops forever is stopped after 8x its tests' CPU time (+8 s), not mutmut's 30x
             "timeout_multiplier = 4", ""]
    with open(dest / "setup.cfg", "a") as f:
        f.write("\n".join(lines))


def mutant_names(dest: Path, source: str) -> list[str]:
    """Every mutant mutmut generates for `source` (computed in `dest`, where its config lives)."""
    code = ("import json, sys; from pathlib import Path\n"
            "from mutmut.mutation.file_mutation import mutate_file_contents\n"
            "from mutmut.utils.format_utils import get_mutant_name\n"
            "p = Path(sys.argv[1])\n"
            "m = mutate_file_contents(str(p), p.read_text())\n"
            "print(json.dumps([get_mutant_name(p, n) for n in m.mutant_names]))\n")
    out = subprocess.run([sys.executable, "-c", code, source], cwd=dest, check=True, capture_output=True, text=True)
    return json.loads(out.stdout)


def run_mutmut(dest: Path, names: list[str], budget: float, log: Path) -> None:
    """`mutmut run` over `names`, one worker, killed (its whole process group) after `budget` seconds."""
    # The mapped tests start no subprocesses: one would import this checkout (the editable install), unmutated.
    env = dict(os.environ, JAX_COMPILATION_CACHE_DIR=str(dest / "jax_cache"),
               JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0", JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0")
    with open(log, "w") as out:
        process = subprocess.Popen([str(MUTMUT), "run", "--max-children", "1", *names], cwd=dest, env=env,
                                   stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            process.wait(timeout=budget)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            out.write(f"\n[mutation_test.py] stopped after the {budget:.0f} s budget\n")


def read_results(dest: Path, source: str, names: list[str]) -> dict[str, str]:
    """Each sampled mutant's status from mutmut's meta file ('not run' when the budget ran out first)."""
    meta = dest / "mutants" / (source + ".meta")
    exit_codes = json.loads(meta.read_text())["exit_code_by_key"] if meta.exists() else {}
    return {n: STATUS_BY_EXIT_CODE.get(exit_codes.get(n), "suspicious") for n in names}


def write_survivors(dest: Path, statuses: dict[str, str], path: Path) -> None:
    """`mutmut show` of every surviving mutant into `path`, for triage."""
    with open(path, "w") as out:
        for name in sorted(n for n, s in statuses.items() if s == "survived"):
            shown = subprocess.run([str(MUTMUT), "show", name], cwd=dest, capture_output=True, text=True)
            out.write(shown.stdout + "\n")


def test_module(module: str, workdir: Path, sample: int, seed: int, budget: float) -> Score:
    source, tests = MODULES[module]
    dest = workdir / module
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    copy_tree(dest)
    configure_mutmut(dest, source, tests)
    names = mutant_names(dest, source)
    chosen = sorted(random.Random(seed).sample(names, sample)) if len(names) > sample else names
    started = time.monotonic()
    run_mutmut(dest, chosen, budget, dest / "mutmut.log")
    seconds = time.monotonic() - started
    statuses = read_results(dest, source, chosen)
    (dest / "statuses.json").write_text(json.dumps(statuses, indent=1))
    write_survivors(dest, statuses, dest / "survivors.txt")
    counts: dict[str, int] = {}
    for status in statuses.values():
        counts[status] = counts.get(status, 0) + 1
    return Score(module, len(names), len(chosen), counts, seconds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("modules", nargs="*", metavar="module", help=f"any of {', '.join(MODULES)} (default: all)")
    parser.add_argument("--sample", type=int, default=50, help="mutants drawn per module (default 50)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the sample (default 0)")
    parser.add_argument("--budget", type=float, default=420, help="seconds per module (default 420)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/t5x_like_mutation"),
                        help="where the private copies go (default /tmp/t5x_like_mutation)")
    args = parser.parse_args(argv)
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        parser.error(f"unknown module(s) {', '.join(unknown)}: choose from {', '.join(MODULES)}.")
    args.modules = args.modules or list(MODULES)
    if not MUTMUT.exists():
        parser.error(f"{MUTMUT} is missing: install the test extra (pip install -e '.[test]').")
    args.workdir.mkdir(parents=True, exist_ok=True)
    print(HEADER, flush=True)
    rows = []
    for module in args.modules:
        rows.append(test_module(module, args.workdir, args.sample, args.seed, args.budget).row())
        print(rows[-1], flush=True)
    with open(args.workdir / "results.md", "a") as f:
        f.write(f"\n{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} sample={args.sample} seed={args.seed} "
                f"budget={args.budget:.0f}s\n{HEADER}\n" + "\n".join(rows) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
