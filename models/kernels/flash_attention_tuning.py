"""Launch settings of our flash-attention kernels and the measured table that picks them per shape.

Each of the three kernels (forward, dQ, dK/dV) owns one block and walks the other: the forward and dQ
kernels own `block_q` query rows and walk `block_k` keys at a time; the dK/dV kernel owns `block_k` keys and
walks `block_q` queries. On GPU (Triton) `num_warps` and `num_stages` (software-pipelining depth of the walk)
are the other knobs; TPU and interpret mode read only the blocks.

The table (flash_attention_tuning.json beside this file) is written by `scripts/benchmark_attention.py --tune`
on the hardware: per (platform, dtype, causal, head dim, length) the fastest launch settings of each kernel and
the fastest attention implementation of that shape, forward+backward, with the timings behind both.
`flash_attention` reads the settings; 'auto' (models/attention.py) reads the implementation. A shape the
table lacks takes the entry of the nearest measured length with the same head dim (nothing measured: the
defaults below, and 'auto' keeps its per-dtype choice).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import math
import os

TABLE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flash_attention_tuning.json")


@dataclasses.dataclass(frozen=True)
class KernelTuning:
    """One kernel's launch: its blocks, and Triton's warps (None: 4 up to head dim 64, else 8) and stages."""

    block_q: int = 128
    block_k: int = 128
    num_warps: int | None = None
    num_stages: int = 2

    def __post_init__(self):
        for name in ("block_q", "block_k"):
            value = getattr(self, name)
            if value < 16 or value & (value - 1):
                raise ValueError(f"flash attention {name}={value} must be a power of two >= 16.")
        if self.num_warps is not None and self.num_warps not in (1, 2, 4, 8, 16):
            raise ValueError(f"flash attention num_warps={self.num_warps} must be 1, 2, 4, 8 or 16.")
        if self.num_stages < 1:
            raise ValueError(f"flash attention num_stages={self.num_stages} must be >= 1.")

    def warps(self, head_dim: int) -> int:
        return self.num_warps or (4 if head_dim <= 64 else 8)

    def short(self) -> str:
        warps = "auto" if self.num_warps is None else self.num_warps
        return f"{self.block_q}x{self.block_k} w{warps} s{self.num_stages}"


BACKWARDS = ("split", "fused")


@dataclasses.dataclass(frozen=True)
class Tuning:
    """The launch settings of the kernels of one attention call. backward 'split': a dQ kernel over query blocks
    and a dK/dV kernel over key blocks, each recomputing the scores (7 matmuls, deterministic); 'fused': one
    kernel over key blocks with `dkv`'s launch that also adds dQ atomically in float32 (5 matmuls; dQ's sum order,
    so its last bits, vary run to run; GPU/Triton and interpret mode only; 2.3-2.7x slower than 'split' on an
    H200, docs/benchmarks.md)."""

    forward: KernelTuning = KernelTuning()
    dq: KernelTuning = KernelTuning()
    dkv: KernelTuning = KernelTuning()
    backward: str = "split"

    def __post_init__(self):
        if self.backward not in BACKWARDS:
            raise ValueError(f"flash attention backward={self.backward!r} must be one of {BACKWARDS}.")

    @classmethod
    def blocks(cls, block_q: int, block_k: int) -> "Tuning":
        """The same blocks for every kernel, default warps and stages."""
        kernel = KernelTuning(block_q, block_k)
        return cls(kernel, kernel, kernel)

    @classmethod
    def from_dict(cls, d: dict) -> "Tuning":
        return cls(**{name: KernelTuning(**d[name]) for name in ("forward", "dq", "dkv")},
                   backward=d.get("backward", "split"))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def short(self) -> str:
        if self.backward == "fused":
            return f"fwd {self.forward.short()}, fused backward {self.dkv.short()}"
        return f"fwd {self.forward.short()}, dq {self.dq.short()}, dkv {self.dkv.short()}"


@functools.lru_cache(maxsize=None)
def load_table(path: str = TABLE_PATH) -> tuple[dict, ...]:
    """The measured entries (empty when the file is absent)."""
    if not os.path.exists(path):
        return ()
    with open(path) as f:
        return tuple(json.load(f)["entries"])


def nearest_entry(platform: str, dtype: str, causal: bool, head_dim: int, length: int,
                  entries: tuple[dict, ...] | None = None) -> dict | None:
    """The table entry of this platform, dtype, causality and head dim whose length is nearest (log scale)."""
    entries = load_table() if entries is None else entries
    same = [e for e in entries if (e["platform"], e["dtype"], e["causal"], e["head_dim"])
            == (platform, dtype, causal, head_dim)]
    if not same:
        return None
    return min(same, key=lambda e: (abs(math.log2(e["length"]) - math.log2(max(length, 1))), -e["length"]))


def tuning_for(platform: str, dtype: str, causal: bool, head_dim: int, length: int) -> Tuning:
    """The kernels' settings for a shape: the nearest measured entry's, else the defaults."""
    entry = nearest_entry(platform, dtype, causal, head_dim, length)
    return Tuning() if entry is None else Tuning.from_dict(entry["tuning"])


def fastest_implementation(platform: str, dtype: str, causal: bool, head_dim: int, length: int) -> str | None:
    """The implementation measured fastest (forward+backward) at the nearest measured shape, or None."""
    entry = nearest_entry(platform, dtype, causal, head_dim, length)
    return None if entry is None else entry["fastest"]
