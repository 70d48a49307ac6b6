"""`python -m t5x_like.eval --task=lm_eval`: lm-evaluation-harness tasks on a checkpoint, on any mesh and
any number of processes.

    python -m t5x_like.eval --task=lm_eval --checkpoint=MODEL_DIR --lm_eval_tasks=hellaswag,arc_easy \
        [--lm_eval_include_path=my_tasks/] [--num_fewshot=5] [--limit=100] --output=results.json

Every process loads the tasks and the model (sharded over all processes' devices by the mesh flags) and computes
its share of each batch; process 0 prints lm-eval's summary table and writes lm-eval's results JSON (results,
groups, configs, versions, n-shot, higher_is_better, n-samples, config; with --lm_eval_log_samples every
request's responses too).
"""
from __future__ import annotations

import argparse

from t5x_like import checks
from t5x_like.cluster import processes
from t5x_like.errors import UserError
from t5x_like.eval.harness import tasks as harness_tasks
from t5x_like.inference import loading


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of --task=lm_eval (besides --checkpoint, --tokenizer, --batch_size, --stride, --output and the
    mesh flags, which it shares with the other tasks)."""
    parser.add_argument("--lm_eval_tasks", default=None,
                        help="lm_eval: comma-separated lm-eval task, group or tag names (e.g. hellaswag,arc_easy)")
    parser.add_argument("--lm_eval_include_path", default=None,
                        help="lm_eval: a folder of task YAML files (local tasks: dataset_path: json + data_files)")
    parser.add_argument("--num_fewshot", type=int, default=None,
                        help="lm_eval: few-shot examples per prompt (default: each task's own, else 0)")
    parser.add_argument("--limit", type=int, default=None, help="lm_eval: only the first N documents of each task")
    parser.add_argument("--lm_eval_log_samples", action="store_true",
                        help="lm_eval: keep every request's responses ('samples') in --output")


LM_EVAL_FLAGS = ("lm_eval_tasks", "lm_eval_include_path", "num_fewshot", "limit", "lm_eval_log_samples")
OTHER_TASKS_FLAGS = ("data", "seq_len", "max_batches", "max_examples", "split", "data_split", "lambada_last_token")
"""t5x_like.eval.cli's flags of the other tasks, which --task=lm_eval does not take (its tasks bring their data)."""


def check_flags_apply(args: argparse.Namespace) -> None:
    """Refuse lm_eval's flags with another task, and the other tasks' flags with lm_eval, naming them."""
    if args.task == "lm_eval":
        given = [f"--{name}" for name in OTHER_TASKS_FLAGS if getattr(args, name) not in (None, False)]
        fix = "its tasks bring their data (--lm_eval_tasks, --lm_eval_include_path)"
    else:
        given = [f"--{name}" for name in LM_EVAL_FLAGS if getattr(args, name) not in (None, False)]
        fix = "they apply to --task=lm_eval"
    if given:
        raise UserError(f"--task={args.task} does not take {', '.join(given)}: {fix}.")


def check_arguments(args: argparse.Namespace) -> list[str]:
    """The task names, after refusing bad numbers, a missing lm-eval, and a checkpoint that is not causal
    (before anything heavy is loaded)."""
    if args.lm_eval_tasks is None:
        raise UserError("--task=lm_eval needs --lm_eval_tasks=NAME[,NAME...] (lm-eval task, group or tag names; "
                        "list them with `lm-eval ls tasks`).")
    names = harness_tasks.task_names(args.lm_eval_tasks)
    if args.num_fewshot is not None:
        checks.non_negative_int("--num_fewshot", args.num_fewshot)
    if args.limit is not None:
        checks.positive_int("--limit", args.limit)
    harness_tasks.require_lm_eval()
    from t5x_like.eval.harness.model import refusal
    from t5x_like.lm import make_lm

    kind = make_lm(loading.read_config(args.checkpoint)[0]).KIND
    if kind != "decoder_only":
        raise UserError(refusal(args.checkpoint, kind))
    return names


def run(args: argparse.Namespace) -> dict:
    """lm-eval's results of the checkpoint on the named tasks (the same on every process)."""
    names = check_arguments(args)
    manager, built = harness_tasks.load_tasks(names, args.lm_eval_include_path)
    from t5x_like.eval.harness.model import CheckpointLM

    config, params, tokenizer, partitioner = loading.load_for_inference(args)
    lm = CheckpointLM(config, params, partitioner, tokenizer, batch_size=args.batch_size, stride=args.stride,
                      name=args.checkpoint, add_bos_token=False if args.no_bos else None)
    return harness_tasks.evaluate(lm, manager, built, num_fewshot=args.num_fewshot, limit=args.limit,
                                  log_samples=args.lm_eval_log_samples)


def report(results: dict, output: str | None) -> None:
    """Process 0 prints the summary table and writes the results JSON to `output`."""
    if not processes.is_primary():
        return
    print(harness_tasks.summary_table(results))
    if output:
        with open(output, "w", encoding="utf-8") as f:
            f.write(harness_tasks.results_json(results))
