"""What every family config shares (DESIGN.md, "Model families").

A family config is a frozen dataclass of plain values (it round-trips through JSON) that
subclasses `FamilyConfig` and has at least these fields:

    family             the registry name ('gpt2', 'neox', 't5')
    vocab_size         the tokenizer's real size; rows past it are padding and never take probability
    vocab_pad_multiple embedding rows are padded to a multiple of this (128 x TENSOR_PARALLEL by the runtime)
    dtype              compute dtype name ('float32' | 'bfloat16' | 'float16'); parameters stay fp32
    attention          models.attention implementation ('auto' | 'xla' | 'cudnn' | 'pallas' | 'splash')
    remat_policy       'none' or a name in models.layers.REMAT_POLICIES
    scan_layers        stack the blocks with nn.scan (needed for pipeline parallelism)
    matmul_dtype       None (dense matmuls in the compute dtype) or 'fp8' (models.layers.Einsum); every
                       family has it from FamilyConfig

Decoder-only families also have `max_len` (the longest sequence). Each config implements
`train_flops_per_example`, `check_lengths`, `pipeline_stacks` and `summary`. The runtime asks these
instead of reading a family's own fields.
"""
from __future__ import annotations

import dataclasses
from typing import Any, ClassVar, Mapping

import jax.numpy as jnp

from models.attention import IMPLEMENTATIONS as ATTENTION_IMPLEMENTATIONS
from models.layers import REMAT_POLICIES

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


MATMUL_DTYPES = (None, "fp8")


@dataclasses.dataclass(frozen=True)
class FamilyConfig:
    """Mixin for family config dataclasses: padded vocabulary, compute dtype, architecture."""

    RUN_FIELDS: ClassVar[tuple[str, ...]] = (
        "vocab_pad_multiple", "dtype", "attention", "remat_policy", "scan_layers", "matmul_dtype")
    """Fields a run may change without changing the weights; families add their dropout rates."""

    HEAD_FIELDS: ClassVar[tuple[str, ...]] = ()
    """Fields that shape only the output head, which a new run from a checkpoint's parameters
    (RESTORE_FROM) chooses for itself, e.g. fine-tuning a masked-LM encoder with a classifier: the
    checkpoint's parameters outside HEAD_PARAMS are restored and the run's own head starts fresh."""

    HEAD_PARAMS: ClassVar[tuple[str, ...]] = ()
    """The top-level parameter collections of the heads HEAD_FIELDS choose between."""

    matmul_dtype: str | None = None
    """'fp8': the blocks' dense matmuls run in FP8 with delayed scaling (models.layers.Einsum);
    None: in the compute dtype."""

    def check_common(self) -> None:
        """Validation every family's __post_init__ calls."""
        if self.matmul_dtype not in MATMUL_DTYPES:
            raise ValueError(f"matmul_dtype {self.matmul_dtype!r} is unknown; choose None (the compute dtype) "
                             "or 'fp8'.")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is unknown; choose one of {sorted(DTYPES)}.")
        if self.attention not in ATTENTION_IMPLEMENTATIONS:
            raise ValueError(f"attention {self.attention!r} is unknown; choose one of {ATTENTION_IMPLEMENTATIONS}.")
        if self.remat_policy != "none" and self.remat_policy not in REMAT_POLICIES:
            raise ValueError(f"remat policy {self.remat_policy!r} is unknown; choose 'none' or one of "
                             f"{sorted(REMAT_POLICIES)}.")
        if self.vocab_size < 1:
            raise ValueError(f"vocab_size {self.vocab_size} must be positive.")

    @property
    def padded_vocab_size(self) -> int:
        """vocab_size rounded up to a multiple of vocab_pad_multiple (rows past vocab_size are padding)."""
        m = self.vocab_pad_multiple
        return -(-self.vocab_size // m) * m

    @property
    def compute_dtype(self):
        return DTYPES[self.dtype]

    def architecture(self) -> dict[str, Any]:
        """The fields that decide the weights (a checkpoint and a config must agree on these)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k not in self.RUN_FIELDS}

    def train_flops_per_example(self, lengths: Mapping[str, int]) -> float:
        """Forward + backward FLOPs of one example (row) at these feature lengths
        ({'targets': T} or {'inputs': I, 'targets': T}): matmuls with every weight and attention."""
        raise NotImplementedError

    def check_lengths(self, lengths: Mapping[str, int]) -> None:
        """Raise ValueError naming the length and the limit when the model cannot take these lengths."""
        raise NotImplementedError

    def pipeline_stacks(self) -> dict[str, int]:
        """The layer count of every stack that pipeline parallelism splits into stages, in the order
        the model runs them, keyed by the config field that sets it (errors name it), e.g.
        {'num_layers': 24}; raise ValueError naming the reason when the family cannot be pipelined."""
        raise NotImplementedError

    def summary(self) -> str:
        """One line on the model's shape, for the start-up log (layers, width, heads, vocabulary)."""
        raise NotImplementedError


class DecoderOnlyConfig(FamilyConfig):
    """What decoder-only families (GPT-2, GPT-NeoX) share: one 'targets' length up to `max_len`, a
    pipeline over all `num_layers` blocks, and FLOPs from `matmul_params()` (the weights each token
    multiplies with) plus causal attention."""

    def matmul_params(self) -> int:
        raise NotImplementedError

    def train_flops_per_example(self, lengths: Mapping[str, int]) -> float:
        """6 FLOPs per weight per token, plus causal attention (QK^T and AV over half the T x T
        scores, 3x for forward + backward): 6·L·T²·d."""
        t = lengths["targets"]
        return 6.0 * self.matmul_params() * t + 6.0 * self.num_layers * t * t * self.embed_dim

    def check_lengths(self, lengths: Mapping[str, int]) -> None:
        if set(lengths) != {"targets"}:
            raise ValueError(f"FEATURE_LENGTHS={dict(lengths)}: a decoder-only model takes only 'targets' "
                             "(set SEQ_LEN, or FEATURE_LENGTHS={'targets': N}).")
        if lengths["targets"] > self.max_len:
            raise ValueError(f"SEQ_LEN={lengths['targets']} exceeds the model's max_len {self.max_len}.")

    def pipeline_stacks(self) -> dict[str, int]:
        return {"num_layers": self.num_layers}


class EncoderOnlyConfig(FamilyConfig):
    """What encoder-only families (BERT, RoBERTa) share: one 'inputs' length up to the positions the
    model has, and one of two heads, which the runtime asks for by these names:

        head        'mlm' (masked-LM head over the tied vocabulary) or 'classification'
        num_labels  the classification head's outputs
    """

    HEADS: ClassVar[tuple[str, ...]] = ("mlm", "classification")

    def max_input_length(self) -> int:
        """The longest row of tokens the model takes."""
        raise NotImplementedError

    def check_head(self) -> None:
        if self.head not in self.HEADS:
            raise ValueError(f"head {self.head!r} is unknown; choose one of {self.HEADS}.")
        if self.head == "classification" and self.num_labels < 2:
            raise ValueError(f"num_labels {self.num_labels}: a classification head needs at least 2 labels.")

    def check_lengths(self, lengths: Mapping[str, int]) -> None:
        if set(lengths) != {"inputs"}:
            raise ValueError(f"FEATURE_LENGTHS={dict(lengths)}: an encoder-only model takes only 'inputs', "
                             "e.g. FEATURE_LENGTHS={'inputs': 512}.")
        if not 2 <= lengths["inputs"] <= self.max_input_length():
            raise ValueError(f"FEATURE_LENGTHS['inputs']={lengths['inputs']} must be between 2 and the model's "
                             f"{self.max_input_length()} positions.")
