"""The training run: the step loop, resume, stop, the non-finite policy, validation, the run directory and its lock."""
