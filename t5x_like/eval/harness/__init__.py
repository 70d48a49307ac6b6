"""lm-evaluation-harness on our checkpoints: `CheckpointLM` (model.py), the three request types as packed token
sequences (sequences.py), tasks loaded and reported (tasks.py), the `--task=lm_eval` route of t5x_like.eval.cli
(cli.py) and evaluation during training (during_training.py). lm-eval is an optional extra: only model.py imports
it at the top, and the others import model.py when they run."""
