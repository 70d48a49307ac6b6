"""What the lm-eval harness tests share (tests/t5x_like/eval/harness/): the local test tasks."""
from pathlib import Path

TASKS = Path(__file__).resolve().parents[1] / "data" / "lm_eval"
