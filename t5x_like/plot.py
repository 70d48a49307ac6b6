"""`python -m t5x_like.plot MODEL_DIR [MODEL_DIR ...] --output=plot.png`: training curves as a PNG.

Reads each run's MODEL_DIR/metrics.jsonl and draws loss with validation loss (dashed), learning rate,
gradient norm and tokens/s against the step, one colour per run, so runs can be compared at a
glance without a TensorBoard server (`tensorboard --logdir MODEL_DIR` shows the same scalars).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Sequence

from t5x_like import checks
from t5x_like.errors import UserError, exit_on_user_error

IMAGE_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg")

PANELS = (  # (title, [(metric, line style, label suffix)])
    ("loss", [("loss", "-", "train"), ("eval_loss", "--", "validation")]),
    ("learning rate", [("learning_rate", "-", "")]),
    ("gradient norm", [("grad_norm", "-", "")]),
    ("tokens / s", [("tokens_per_sec", "-", "")]),
)


def read_metrics(model_dir: str) -> list[dict]:
    """The rows of MODEL_DIR/metrics.jsonl by step; a step logged again (after a resume) keeps its last row
    per kind (training and evaluation rows share steps)."""
    path = os.path.join(model_dir, "metrics.jsonl")
    if not os.path.isfile(path):
        raise UserError(f"{path} does not exist; give a MODEL_DIR of a run that has logged a step.")
    with open(path) as f:
        lines = [line for line in f if line.strip()]
    rows: dict[tuple[int, bool], dict] = {}
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                continue  # a last line cut short when the run was killed
            raise UserError(f"{path}: line {number} is not JSON.") from None
        rows[(row["step"], "eval_loss" in row)] = row
    return [rows[k] for k in sorted(rows)]


def series(rows: list[dict], metric: str) -> tuple[list[int], list[float]]:
    points = [(r["step"], r[metric]) for r in rows if r.get(metric) is not None]
    return [s for s, _ in points], [v for _, v in points]


def run_labels(model_dirs: Sequence[str]) -> list[str]:
    """Each run's directory name, or its full path when names repeat."""
    names = [os.path.basename(os.path.normpath(d)) for d in model_dirs]
    return names if len(set(names)) == len(names) else [os.path.normpath(d) for d in model_dirs]


def plot(model_dirs: Sequence[str], output: str) -> int:
    """Draw the runs' curves into `output` (PNG); returns the number of points drawn."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs = [read_metrics(d) for d in model_dirs]
    figure, axes = plt.subplots(2, 2, figsize=(12, 8), sharex=True)
    drawn = 0
    for (title, metrics), ax in zip(PANELS, axes.flat):
        for index, (label, rows) in enumerate(zip(run_labels(model_dirs), runs)):
            for metric, style, suffix in metrics:
                steps, values = series(rows, metric)
                if steps:
                    ax.plot(steps, values, style, color=f"C{index}", marker="." if len(steps) < 30 else None,
                            label=f"{label} {suffix}".strip())
                    drawn += len(steps)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize="small")
    for ax in axes[1]:
        ax.set_xlabel("step")
    if drawn == 0:
        plt.close(figure)
        raise UserError(f"{', '.join(model_dirs)}: metrics.jsonl holds no training or validation rows yet.")
    figure.tight_layout()
    figure.savefig(output, dpi=100)
    plt.close(figure)
    return drawn


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m t5x_like.plot", description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dirs", nargs="+", metavar="MODEL_DIR", help="runs to draw, overlaid")
    parser.add_argument("--output", default="plot.png", help="PNG file to write (default: plot.png)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    checks.output_file("--output", args.output, suffixes=IMAGE_SUFFIXES)
    points = plot(args.model_dirs, args.output)
    print(f"wrote {args.output}: {len(args.model_dirs)} run(s), {points} points")


if __name__ == "__main__":
    exit_on_user_error(main)()
