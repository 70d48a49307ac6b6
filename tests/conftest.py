"""Test-wide setup: 8 simulated CPU devices (set before jax is imported anywhere), and a
synthetic data source that follows the trainer's data contract."""
import os

os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np  # noqa: E402
import pytest  # noqa: E402


class SyntheticSource:
    """Rows of a learnable pattern (each row counts up by a per-row stride modulo the vocab).

    Row r of step i depends only on (seed, split, i, r), so hosts can read disjoint slices and a
    resumed source continues exactly; state is the step index.
    """

    def __init__(self, split, *, batch_size, seq_len, seed, shard_index, shard_count, vocab_size=256):
        self.split, self.batch_size, self.seq_len, self.seed = split, batch_size, seq_len, seed
        self.shard_index, self.vocab_size = shard_index, vocab_size
        self.eod_id, self.tokenizer_path, self.index = 0, None, 0

    def __iter__(self):
        return self

    def __next__(self):
        rows = [self.row(self.index, self.shard_index * self.batch_size + r) for r in range(self.batch_size)]
        self.index += 1
        tokens = np.stack(rows)
        return {"inputs": tokens[:, :-1], "targets": tokens[:, 1:],
                "weights": np.ones((self.batch_size, self.seq_len), np.float32)}

    def row(self, index, row):
        rng = np.random.default_rng([self.seed, {"train": 0, "validation": 1}[self.split], index, row])
        start, stride = rng.integers(0, self.vocab_size), rng.integers(1, 4)
        return ((start + stride * np.arange(self.seq_len + 1)) % self.vocab_size).astype(np.int32)

    def get_state(self):
        return {"index": self.index}

    def set_state(self, state):
        self.index = state["index"]

    def reset(self):
        self.index = 0


@pytest.fixture(scope="session")
def synthetic_source():
    return SyntheticSource
