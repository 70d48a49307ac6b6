"""Decoding a checkpoint: loading it onto a mesh, beam search, prompts in and completions out."""
