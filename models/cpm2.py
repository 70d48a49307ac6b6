"""CPM-2 (Zhang et al. 2021; ModelCenter's `model_center/model/cpm2.py`): T5 v1.1's layout over a Chinese
vocabulary. One input embedding shared by encoder and decoder, a relative position bias per stack (32 buckets,
max distance 128), RMS norms without bias, attention without 1/sqrt(d) scaling, an untied output projection
without rescaling; its gated MLP's gate is torch.nn.GELU(), the exact (erf) GELU, where transformers' T5
"gated-gelu" uses the tanh approximation. So CPM-2 is models/t5.py's module with this config: the same parameter
tree (see models/t5.py), the exact GELU, and CPM-2-Finetune's conventions for the decoder's start and the
inputs' and targets' ends.

The vocabulary's last 190 ids are the sentinels `<s_0>` ... `<s_189>` (CPM2Tokenizer's max_sentinels); `<s>`
is id 1. The decoder starts from [<s>, <s_0>], the encoder reads the text's ids alone (no end token), and a
target that ends is closed by `<s_1>` (CPM-2-Finetune's CPM2Datasets.py).
"""
from __future__ import annotations

import dataclasses

from models.registry import Family
from models.t5 import T5, T5Config

NUM_SENTINELS = 190
"""`<s_0>` ... `<s_189>`, the last ids of the vocabulary."""
START_ID = 1
"""`<s>`: the decoder's first input."""


@dataclasses.dataclass(frozen=True)
class CPM2Config(T5Config):
    """A T5 v1.1 config with the exact GELU in its gated MLP and CPM-2-Finetune's sequence conventions."""

    family: str = "cpm2"
    vocab_size: int = 26240
    feed_forward: str = "gated-gelu"
    tie_word_embeddings: bool = False
    dropout_rate: float = 0.0

    def __post_init__(self):
        super().__post_init__()
        if self.feed_forward != "gated-gelu":
            raise ValueError(f"feed_forward {self.feed_forward!r}: CPM-2's MLP is gated ('gated-gelu', its gate the "
                             "exact GELU); use the t5 family for another MLP.")
        if self.vocab_size <= NUM_SENTINELS + START_ID:
            raise ValueError(f"vocab_size {self.vocab_size} leaves no room for CPM-2's {NUM_SENTINELS} sentinels "
                             "(the last ids) and <s> (id 1); CPM-2's vocabulary has 26240 ids.")

    @property
    def mlp_activation(self) -> tuple[str, bool]:
        return "gelu", True  # exact (erf), as torch.nn.GELU()

    def sentinel_id(self, index: int) -> int:
        """`<s_index>`."""
        return self.vocab_size - NUM_SENTINELS + index

    def decoder_start_ids(self) -> tuple[int, ...]:
        return START_ID, self.sentinel_id(0)

    def inputs_end_with_eos(self) -> bool:
        return False

    def targets_end_id(self, eod_id: int) -> int:
        del eod_id
        return self.sentinel_id(1)

    def summary(self) -> str:
        return super().summary().replace("(gated-gelu)", "(gated, exact GELU)")


FAMILIES = {"cpm2": Family(CPM2Config, T5, "encoder_decoder")}
