"""`python -m t5x_like.eval` and every evaluation: WikiText, LAMBADA, token files, seq2seq, classification, lm-eval."""
