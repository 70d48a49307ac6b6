"""Evaluation of a checkpoint, task by task (the CLI is t5x_like/eval.py): scoring rows of targets on a mesh
(scoring.py), WikiText perplexity and token-file loss (wikitext.py), LAMBADA (lambada.py), seq2seq pairs
(seq2seq.py), classification (classification.py)."""
