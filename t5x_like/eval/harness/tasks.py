"""lm-eval tasks by name: loaded (local YAML tasks without a network), run on a `CheckpointLM`, and reported
as lm-eval's own results JSON, its summary table, or flat metrics for a training run's log.

A task whose data lives on the Hugging Face Hub is loaded from the datasets cache or downloaded; where neither
can happen (no network, HF_DATASETS_OFFLINE=1) it is refused in one line naming the task and how to provide it
offline. A local task is lm-eval's YAML with `dataset_path: json` and `dataset_kwargs: {data_files: ...}`
(paths read from the working directory, as lm-eval reads them) in a folder given as the include path.
"""
from __future__ import annotations

import contextlib
import glob
import json
import math
import os
import sys
import traceback
from typing import Any, Iterator, Sequence

import yaml

from t5x_like.errors import UserError

OFFLINE_RECIPE = ("download it once where there is a network (lm-eval caches it under HF_DATASETS_CACHE; copy that "
                  "folder here), or write the task as a local YAML (dataset_path: json, dataset_kwargs.data_files) in "
                  "a folder given as --lm_eval_include_path (docs/evaluation.md)")

PACKAGE_DIR = os.path.abspath(os.path.join(os.path.dirname(__file__), os.pardir, os.pardir))
"""The folder of t5x_like (this file is t5x_like/eval/harness/tasks.py)."""


def require_lm_eval() -> None:
    """A UserError with the install line when the lm-eval extra is missing."""
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        raise UserError("lm-evaluation-harness is not installed: pip install 't5x_like[lm_eval]' (or "
                        "pip install lm-eval) and run again.") from None


def task_names(value: str) -> list[str]:
    """The names in a comma-separated --lm_eval_tasks value (at least one)."""
    names = [name.strip() for name in value.split(",") if name.strip()]
    if not names:
        raise UserError(f"--lm_eval_tasks={value!r}: name at least one lm-eval task, group or tag, e.g. "
                        "--lm_eval_tasks=hellaswag,arc_easy (list them with `lm-eval ls tasks`).")
    return names


def task_manager(names: Sequence[str], include_path: str | None):
    """lm-eval's TaskManager: only the include path's tasks when it holds every name (indexing lm-eval's ~15,000
    built-in tasks takes seconds), else the built-in ones too (the include path's win where names clash)."""
    from lm_eval.tasks import TaskManager

    if include_path:
        if not os.path.isdir(include_path):
            raise UserError(f"--lm_eval_include_path={include_path}: no such folder; give the folder holding the "
                            "task YAML files.")
        local = TaskManager(include_path=include_path, include_defaults=False)
        if all(name in local.all_tasks for name in names):
            return local
    return TaskManager(include_path=include_path)


def load_tasks(names: Sequence[str], include_path: str | None = None) -> tuple[Any, list]:
    """(the TaskManager, the built Task / Group objects of `names`), their data loaded; a name that is not a task,
    or whose data cannot be had here, is one line naming it and the fix."""
    manager = task_manager(names, include_path)
    built = []
    for name in names:
        if name not in manager.all_tasks:
            where = f" nor under --lm_eval_include_path={include_path}" if include_path else ""
            unreadable = unreadable_task_files(include_path) if include_path else []
            raise UserError(f"--lm_eval_tasks: {name!r} is not an lm-eval task, group or tag{where}; " + (
                f"lm-eval skips the folder's files it cannot read: {'; '.join(unreadable)}." if unreadable else
                "list them with `lm-eval ls tasks`, or give the folder of its YAML as --lm_eval_include_path."))
        try:
            loaded = manager.load([name])
        except (ConnectionError, OSError) as e:
            raise UserError(data_error(name, e)) from None
        except Exception as e:  # noqa: BLE001 - lm-eval builds the task from the user's YAML and data files
            raise UserError(task_error([name], manager, e)) from None
        built.extend([loaded["groups"][name]] if name in loaded["groups"] else loaded["tasks"].values())
    return manager, built


def data_error(name: str, error: Exception) -> str:
    """The line for a task whose data could not be loaded: a local file missing, or a download impossible."""
    reason = " ".join(str(error).split())
    if isinstance(error, FileNotFoundError) and not needs_download(error):
        return (f"task {name!r}: {reason}; a task's data_files are read from the working directory ({os.getcwd()}) "
                "as lm-eval reads them: run from the folder they are relative to, or make them absolute.")
    return f"task {name!r} needs data from the Hugging Face Hub that cannot be loaded here ({reason}): {OFFLINE_RECIPE}."


class _AnyTagLoader(yaml.SafeLoader):
    """YAML as lm-eval reads it, its tags (`!function utils.process_docs`) taken as plain values."""


_AnyTagLoader.add_multi_constructor("", lambda loader, suffix, node: None)


def unreadable_task_files(include_path: str) -> list[str]:
    """What is wrong with the include path's YAML files lm-eval cannot index: not YAML, or no `task:` name."""
    problems = []
    for path in sorted(glob.glob(os.path.join(include_path, "**", "*.yaml"), recursive=True)):
        try:
            with open(path, encoding="utf-8") as f:
                config = yaml.load(f, Loader=_AnyTagLoader)
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            mark = getattr(e, "problem_mark", None)
            where = f"{path}:{mark.line + 1}" if mark else path
            problems.append(f"{where}: not valid YAML ({getattr(e, 'problem', None) or e})")
            continue
        if not isinstance(config, dict) or not any(key in config for key in ("task", "group", "tag")):
            problems.append(f"{path}: no `task:` name (a task file names its task, e.g. `task: my_qa`)")
    return problems


def task_error(names: Sequence[str], manager, error: Exception) -> str:
    """The line for a task lm-eval could not build or run from its YAML and data: the files, lm-eval's error
    and where in lm-eval it arose."""
    files = [str(manager.task_index[name].yaml_path) for name in names
             if name in getattr(manager, "task_index", {}) and getattr(manager.task_index[name], "yaml_path", None)]
    frames = [frame for frame in traceback.extract_tb(error.__traceback__) if "lm_eval" in frame.filename]
    where = f" in lm-eval's {frames[-1].name}" if frames else ""
    reason = " ".join(str(error).split()) or (
        "(the data has no documents)" if isinstance(error, StopIteration) else "(no message)")
    return (f"task {', '.join(map(repr, names))}{' (' + ', '.join(files) + ')' if files else ''}: lm-eval could not "
            f"use it: {type(error).__name__}: {reason}{where}; check the task's YAML (test_split, doc_to_text, "
            "doc_to_target, doc_to_choice, metric_list) against its data.")


def raised_in_our_code(error: Exception) -> bool:
    """An error raised inside t5x_like (the model lm-eval calls) rather than in lm-eval or a task's files; the
    first frame, the call into lm-eval, does not count."""
    return any(os.path.abspath(frame.filename).startswith(PACKAGE_DIR + os.sep)
               for frame in traceback.extract_tb(error.__traceback__)[1:])


def needs_download(error: Exception) -> bool:
    text = str(error)
    return isinstance(error, ConnectionError) or "Hub" in text or "offline" in text.lower()


def evaluate(lm, manager, tasks: list, *, num_fewshot: int | None = None, limit: int | None = None,
             log_samples: bool = False, bootstrap_iters: int = 100_000) -> dict:
    """lm-eval's simple_evaluate of the built `tasks` on `lm`: its results dict (results, groups, configs,
    versions, n-shot, higher_is_better, n-samples, config; samples when log_samples). bootstrap_iters=0 skips the
    bootstrapped standard errors (of perplexities and some others)."""
    from lm_eval import evaluator

    try:
        with quiet_git_describe(evaluator):
            results = evaluator.simple_evaluate(model=lm, tasks=tasks, task_manager=manager, num_fewshot=num_fewshot,
                                                limit=limit, log_samples=log_samples, bootstrap_iters=bootstrap_iters,
                                                model_args={"checkpoint": getattr(lm, "name", "")})
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - a task's YAML or data that lm-eval cannot use; our own errors go on
        if raised_in_our_code(e):
            raise
        names = [getattr(task, "task_name", None) or getattr(task, "group_name", None) or str(task) for task in tasks]
        raise UserError(task_error(names, manager, e)) from None
    return dict(results)


@contextlib.contextmanager
def quiet_git_describe(evaluator) -> Iterator[None]:
    """lm-eval's simple_evaluate records the working directory's `git describe` (evaluator.get_git_commit_hash),
    and outside a git repository git prints `fatal: not a git repository ...` on the process's stderr. Within
    this context that one call runs with file descriptor 2 on /dev/null; it still records what it finds (None
    outside a repository)."""
    described = evaluator.get_git_commit_hash

    def quietly():
        with stderr_to_devnull():
            return described()

    evaluator.get_git_commit_hash = quietly
    try:
        yield
    finally:
        evaluator.get_git_commit_hash = described


@contextlib.contextmanager
def stderr_to_devnull() -> Iterator[None]:
    """File descriptor 2 (what child processes inherit as stderr) on /dev/null, restored after."""
    sys.stderr.flush()
    saved = os.dup(2)
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def results_json(results: dict) -> str:
    """The results as lm-eval's own CLI writes them (numpy values and sets made plain)."""
    from lm_eval.utils import handle_non_serializable

    return json.dumps(results, indent=2, default=handle_non_serializable, ensure_ascii=False) + "\n"


def summary_table(results: dict) -> str:
    """lm-eval's markdown table of every task's metrics (and of the groups, when there are any)."""
    from lm_eval.utils import make_table

    table = make_table(results)
    if results.get("groups"):
        table += "\n" + make_table(results, "groups")
    return table


NOT_METRICS = ("alias", "name", "sample_len", "sample_count")
"""Entries of a task's results that are not metrics (lm-eval's table leaves them out too)."""


def flat_metrics(results: dict) -> dict[str, float | None]:
    """`lm_eval/<task>/<metric>` -> value for every metric of every task and group (no stderrs; a filter other
    than lm-eval's 'none' is kept after the metric: exact_match/strict-match)."""
    flat = {}
    for section in ("results", "groups"):
        for task, metrics in results.get(section, {}).items():
            for key, value in metrics.items():
                metric, _, filter_name = key.partition(",")
                if metric.endswith("_stderr") or metric in NOT_METRICS or not isinstance(value, (int, float)):
                    continue
                name = metric if filter_name in ("", "none") else f"{metric}/{filter_name}"
                flat[f"lm_eval/{task}/{name}"] = float(value) if math.isfinite(value) else None
    return flat
