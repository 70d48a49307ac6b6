"""Checkpoint converters: one module per model family (a name map plus a few transforms, see
mapping.py), and `python -m t5x_like.convert {to-hf,from-hf,to-torch}` (see hf.py)."""
