"""Decoding a checkpoint: loading it onto a mesh, the decoding options and the Generator, prompts in and
completions out, and the Python API (`load_model`). The search itself (greedy, sampling, beam search) is the
LanguageModel's (t5x_like/lm/)."""
