"""lm-eval tasks by name: loaded (local YAML tasks without a network), run on a `CheckpointLM`, and reported
as lm-eval's own results JSON, its summary table, or flat metrics for a training run's log.

A task whose data lives on the Hugging Face Hub is loaded from the datasets cache or downloaded; where neither
can happen (no network, HF_DATASETS_OFFLINE=1) it is refused in one line naming the task and how to provide it
offline. A local task is lm-eval's YAML with `dataset_path: json` and `dataset_kwargs: {data_files: ...}`
(paths read from the working directory, as lm-eval reads them) in a folder given as the include path.
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Sequence

from t5x_like.errors import UserError

OFFLINE_RECIPE = ("download it once where there is a network (lm-eval caches it under HF_DATASETS_CACHE; copy that "
                  "folder here), or write the task as a local YAML (dataset_path: json, dataset_kwargs.data_files) in "
                  "a folder given as --lm_eval_include_path (docs/evaluation.md)")


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
            raise UserError(f"--lm_eval_tasks: {name!r} is not an lm-eval task, group or tag{where}; list them with "
                            "`lm-eval ls tasks`, or give the folder of its YAML as --lm_eval_include_path.")
        try:
            loaded = manager.load([name])
        except (ConnectionError, OSError) as e:
            raise UserError(data_error(name, e)) from None
        built.extend([loaded["groups"][name]] if name in loaded["groups"] else loaded["tasks"].values())
    return manager, built


def data_error(name: str, error: Exception) -> str:
    """The line for a task whose data could not be loaded: a local file missing, or a download impossible."""
    reason = " ".join(str(error).split())
    if isinstance(error, FileNotFoundError) and not needs_download(error):
        return (f"task {name!r}: {reason}; a task's data_files are read from the working directory ({os.getcwd()}) "
                "as lm-eval reads them: run from the folder they are relative to, or make them absolute.")
    return f"task {name!r} needs data from the Hugging Face Hub that cannot be loaded here ({reason}): {OFFLINE_RECIPE}."


def needs_download(error: Exception) -> bool:
    text = str(error)
    return isinstance(error, ConnectionError) or "Hub" in text or "offline" in text.lower()


def evaluate(lm, manager, tasks: list, *, num_fewshot: int | None = None, limit: int | None = None,
             log_samples: bool = False, bootstrap_iters: int = 100_000) -> dict:
    """lm-eval's simple_evaluate of the built `tasks` on `lm`: its results dict (results, groups, configs,
    versions, n-shot, higher_is_better, n-samples, config; samples when log_samples). bootstrap_iters=0 skips the
    bootstrapped standard errors (of perplexities and some others)."""
    from lm_eval import evaluator

    results = evaluator.simple_evaluate(model=lm, tasks=tasks, task_manager=manager, num_fewshot=num_fewshot,
                                        limit=limit, log_samples=log_samples, bootstrap_iters=bootstrap_iters,
                                        model_args={"checkpoint": getattr(lm, "name", "")})
    return dict(results)


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
