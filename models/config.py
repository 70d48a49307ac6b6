"""What every family config shares (DESIGN.md, "Model families").

A family config is a frozen dataclass of plain values (it round-trips through JSON) that subclasses
`FamilyConfig` (or a kind's base below) and declares its own `family` (the registry name) and
`vocab_size` (the tokenizer's real size; rows past it are padding and never take probability) with
their defaults. The fields every family shares are declared here, once; a family redeclares one only to
change its default (T5's sizes, BERT's epsilon).

Each config implements `train_flops_per_example`, `check_lengths`, `pipeline_stacks` and `summary`
(the kinds' bases implement them where the kind decides). The runtime asks these instead of reading a
family's own fields.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, Mapping

import jax.numpy as jnp

from models.attention import IMPLEMENTATIONS as ATTENTION_IMPLEMENTATIONS
from models.layers import REMAT_POLICIES, MoE, Rotary

DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


MATMUL_DTYPES = (None, "fp8")


@dataclasses.dataclass(frozen=True)
class FamilyConfig:
    """Mixin for family config dataclasses: sizes, padded vocabulary, compute dtype, run choices."""

    POSITIVE_FIELDS: ClassVar[tuple[str, ...]] = ("vocab_size", "num_layers", "num_heads", "embed_dim", "mlp_dim",
                                                   "layer_norm_eps")
    """Fields that must be positive numbers (a family adds its own, e.g. rope_theta); None where a field allows it
    means 'not set'. Checked with their annotated type: an int field takes an int, a float field a finite number."""

    RUN_FIELDS: ClassVar[tuple[str, ...]] = (
        "vocab_pad_multiple", "dtype", "attention", "remat_policy", "scan_layers", "matmul_dtype", "dropout_rate",
        "attention_dropout_rate")
    """Fields a run may change without changing the weights."""

    HEAD_FIELDS: ClassVar[tuple[str, ...]] = ()
    """Fields that shape only the output head, which a new run from a checkpoint's parameters
    (RESTORE_FROM) chooses for itself, e.g. fine-tuning a masked-LM encoder with a classifier: the
    checkpoint's parameters outside HEAD_PARAMS are restored and the run's own head starts fresh."""

    HEAD_PARAMS: ClassVar[tuple[str, ...]] = ()
    """The top-level parameter collections of the heads HEAD_FIELDS choose between."""

    ABSENT: ClassVar[dict[str, tuple[Any, str]]] = {}
    """Options of the fields this family inherits that it does not have: field -> (the one value it takes, a
    family that has the option). Refused when the config is made: its converter could not export the model."""

    num_layers: int = 12
    """Blocks (an encoder-decoder: the encoder's)."""
    num_heads: int = 12
    embed_dim: int = 768
    mlp_dim: int = 3072
    """The MLP's hidden width."""
    layer_norm_eps: float = 1e-5
    dropout_rate: float = 0.1
    vocab_pad_multiple: int = 128
    """Embedding rows are padded to a multiple of this (128 x TENSOR_PARALLEL by the runtime)."""
    dtype: str = "float32"
    """The compute dtype ('float32' | 'bfloat16' | 'float16'); parameters stay fp32."""
    attention: str = "auto"
    """The models.attention implementation ('auto' | 'xla' | 'cudnn' | 'pallas' | 'splash')."""
    remat_policy: str = "none"
    """'none' or a name in models.layers.REMAT_POLICIES."""
    scan_layers: bool = True
    """Stack the blocks with nn.scan (needed for pipeline parallelism)."""
    matmul_dtype: str | None = None
    """'fp8': the blocks' dense matmuls run in FP8 with delayed scaling (models.layers.Einsum);
    None: in the compute dtype."""

    def __post_init__(self):
        self.check_positive_fields()
        self.check_absent_options()
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

    def check_positive_fields(self) -> None:
        """POSITIVE_FIELDS hold positive numbers of their annotated type (a config.json's "4" or -1 is refused)."""
        annotations = {field.name: str(field.type) for field in dataclasses.fields(self)}
        for name in self.POSITIVE_FIELDS:
            value = getattr(self, name)
            if value is None and "None" in annotations[name]:
                continue
            integer = annotations[name].startswith("int")
            kind = (int,) if integer else (int, float)
            if isinstance(value, bool) or not isinstance(value, kind) or not math.isfinite(value) or value <= 0:
                raise ValueError(f"{name} {value!r} must be a positive "
                                 f"{'integer' if integer else 'number, not nan or inf'}.")

    def check_absent_options(self) -> None:
        """Each ABSENT field at the one value this family takes."""
        for name, (value, elsewhere) in self.ABSENT.items():
            if getattr(self, name) != value:
                raise ValueError(f"{name} {getattr(self, name)!r}: {self.family} has no {name.replace('_', ' ')} "
                                 f"option (family {elsewhere!r} has it); leave {name} at {value!r}, or use family "
                                 f"{elsewhere!r}.")

    def check_heads(self) -> None:
        """Heads that split the width (every family whose head_dim is embed_dim / num_heads)."""
        if self.embed_dim % self.num_heads:
            raise ValueError(f"embed_dim {self.embed_dim} is not divisible by num_heads {self.num_heads}; "
                             "choose a head count that divides the width.")

    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

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

    def loss_terms(self) -> dict[str, float]:
        """The weight of each auxiliary loss the model's layers report (models.layers.router_losses's names) in
        the training loss; none by default."""
        return {}

    def summary(self) -> str:
        """One line on the model's shape, for the start-up log (layers, width, heads, vocabulary)."""
        raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class DecoderOnlyConfig(FamilyConfig):
    """What decoder-only families (GPT-2, GPT-NeoX, Llama) share: one 'targets' length up to `max_len`, a
    pipeline over all `num_layers` blocks, FLOPs from `matmul_params()`, and what the shared decoder
    (models.layers.decoder) and the runtime ask of them: `num_kv_heads`, `rotary`, and `input_init_std`
    (the token tables' initialiser). Each family composes its own block in its file; an option only one
    family has (GPT-NeoX's use_parallel_residual, Llama's sliding_window) is that family's field, and the
    family tells the counts and the summary about it through `mlp_params`, `attention_pairs` and
    `block_notes`."""

    POSITIVE_FIELDS: ClassVar[tuple[str, ...]] = FamilyConfig.POSITIVE_FIELDS + ("max_len",)

    max_len: int = 1024
    """The longest sequence (and, with learned positions, the position table's rows)."""
    attention_dropout_rate: float = 0.1

    def __post_init__(self):
        super().__post_init__()
        self.check_heads()
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads {self.num_kv_heads} does not divide num_heads {self.num_heads}; "
                             "choose a key/value head count that divides the query heads.")

    @property
    def num_kv_heads(self) -> int:
        """Key/value heads (grouped-query attention when fewer than num_heads)."""
        return self.num_heads

    @property
    def rotary(self) -> Rotary | None:
        """Rotary embeddings on queries and keys (None: positions are the family's embedding's)."""
        return None

    @property
    def input_init_std(self) -> float:
        """The standard deviation of the token tables (and of the family's projections out of the residual stream)."""
        raise NotImplementedError

    def mlp_params(self) -> int:
        """One block's MLP weights: fc and proj (a gated MLP's family adds its gate)."""
        return 2 * self.embed_dim * self.mlp_dim

    def matmul_params(self) -> int:
        """Weights each token multiplies with: the blocks and the output head, not the input lookups."""
        e, heads = self.embed_dim, self.num_heads * self.head_dim
        attention = 2 * e * heads + 2 * e * self.num_kv_heads * self.head_dim
        return self.num_layers * (attention + self.mlp_params()) + self.vocab_size * e

    def attention_pairs(self, length: int) -> float:
        """The (query, key) pairs one layer's causal attention scores over `length` tokens: T²/2 (a family
        attending to fewer, e.g. through a sliding window, says so)."""
        return length * length / 2

    def train_flops_per_example(self, lengths: Mapping[str, int]) -> float:
        """6 FLOPs per weight per token, plus causal attention: QK^T and AV over the (query, key) pairs
        attended, 2 FLOPs per multiply-add, 3x for forward + backward: 12·L·pairs·(heads·head_dim), where
        pairs is `attention_pairs` (T²/2: 6·L·T²·heads·head_dim)."""
        t, pairs = lengths["targets"], self.attention_pairs(lengths["targets"])
        return 6.0 * self.matmul_params() * t + 12.0 * self.num_layers * pairs * self.num_heads * self.head_dim

    def check_lengths(self, lengths: Mapping[str, int]) -> None:
        if set(lengths) != {"targets"}:
            raise ValueError(f"FEATURE_LENGTHS={dict(lengths)}: a decoder-only model takes only 'targets' "
                             "(set SEQ_LEN, or FEATURE_LENGTHS={'targets': N}).")
        if lengths["targets"] > self.max_len:
            raise ValueError(f"SEQ_LEN={lengths['targets']} exceeds the model's max_len {self.max_len}.")

    def pipeline_stacks(self) -> dict[str, int]:
        return {"num_layers": self.num_layers}

    def mlp_note(self) -> str:
        """summary()'s word on the blocks' MLP (', mlp 3072')."""
        return f", mlp {self.mlp_dim}"

    def block_notes(self) -> str:
        """What the family's blocks add to summary()'s line, each note after ', ' (e.g. ', parallel residual')."""
        return ""

    def summary(self) -> str:
        heads = f"{self.num_heads} heads x {self.head_dim}"
        if self.num_kv_heads != self.num_heads:
            heads += f" ({self.num_kv_heads} key/value heads)"
        if self.rotary is not None:
            heads += f" (rotary on {self.rotary.dim})"
        return (f"{self.family}: {self.num_layers} layers, width {self.embed_dim}, {heads}{self.mlp_note()}"
                f"{self.block_notes()}, vocab {self.vocab_size} (padded to {self.padded_vocab_size}), "
                f"max_len {self.max_len}, {self.dtype}")


@dataclasses.dataclass(frozen=True)
class EncoderOnlyConfig(FamilyConfig):
    """What encoder-only families (BERT, RoBERTa) share: one 'inputs' length up to the positions the
    model has, and one of two heads, which the runtime asks for by these names."""

    HEADS: ClassVar[tuple[str, ...]] = ("mlm", "classification")
    HEAD_FIELDS: ClassVar[tuple[str, ...]] = ("head", "num_labels", "labels")
    RUN_FIELDS: ClassVar[tuple[str, ...]] = FamilyConfig.RUN_FIELDS + ("labels",)

    attention_dropout_rate: float = 0.1
    head: str = "mlm"
    """'mlm' (masked-LM head over the tied vocabulary) or 'classification'."""
    num_labels: int = 2
    """The classification head's outputs."""
    labels: tuple[str, ...] = ()
    """The classification head's label names by index (recorded with the checkpoint); () = '0', '1', ..."""

    def __post_init__(self):
        super().__post_init__()
        if self.head not in self.HEADS:
            raise ValueError(f"head {self.head!r} is unknown; choose one of {self.HEADS}.")
        if self.head == "classification" and self.num_labels < 2:
            raise ValueError(f"num_labels {self.num_labels}: a classification head needs at least 2 labels.")
        object.__setattr__(self, "labels", tuple(str(label) for label in self.labels))  # JSON gives a list
        if self.labels and len(self.labels) != self.num_labels:
            raise ValueError(f"labels {list(self.labels)} are {len(self.labels)} names for num_labels "
                             f"{self.num_labels}; give one name per label.")
        self.check_heads()

    def label_names(self) -> list[str]:
        return list(self.labels) or [str(i) for i in range(self.num_labels)]

    def max_input_length(self) -> int:
        """The longest row of tokens the model takes."""
        raise NotImplementedError

    def check_lengths(self, lengths: Mapping[str, int]) -> None:
        if set(lengths) != {"inputs"}:
            raise ValueError(f"FEATURE_LENGTHS={dict(lengths)}: an encoder-only model takes only 'inputs', "
                             "e.g. FEATURE_LENGTHS={'inputs': 512}.")
        if not 2 <= lengths["inputs"] <= self.max_input_length():
            raise ValueError(f"FEATURE_LENGTHS['inputs']={lengths['inputs']} must be between 2 and the model's "
                             f"{self.max_input_length()} positions.")


@dataclasses.dataclass(frozen=True)
class MoEConfig(DecoderOnlyConfig):
    """The fields of a decoder whose blocks' MLP is a mixture of experts (models.layers.MoE): a family config
    inherits this before its dense base (`class MixtralConfig(MoEConfig, LlamaConfig)`), adds
    MOE_POSITIVE_FIELDS to its POSITIVE_FIELDS and builds its block's feed-forward with `moe_layer`. The
    router's loss coefficients and the capacity are run choices (a checkpoint's weights do not change)."""

    MOE_POSITIVE_FIELDS: ClassVar[tuple[str, ...]] = (
        "num_experts", "num_experts_per_token", "expert_mlp_dim", "shared_expert_mlp_dim", "capacity_factor")
    RUN_FIELDS: ClassVar[tuple[str, ...]] = FamilyConfig.RUN_FIELDS + (
        "router_aux_loss_coef", "router_z_loss_coef", "capacity_factor")

    num_experts: int = 8
    num_experts_per_token: int = 2
    """The experts each token goes to (top-k)."""
    expert_mlp_dim: int | None = None
    """Each expert's hidden width (None: mlp_dim, as Mixtral's)."""
    normalize_router_weights: bool = True
    """Divide the top-k router probabilities by their sum (Mixtral, Qwen3-MoE; Qwen2-MoE: no)."""
    shared_expert_mlp_dim: int | None = None
    """Qwen2-MoE's shared expert's hidden width (None: no shared expert)."""
    router_aux_loss_coef: float = 0.001
    """The load-balancing loss's weight in the training loss (transformers' router_aux_loss_coef)."""
    router_z_loss_coef: float = 0.0
    """The router z-loss's weight in the training loss (Megatron's --moe-z-loss-coeff)."""
    capacity_factor: float | None = None
    """None: dropless routing; c: each expert takes at most ceil(c · tokens · k / experts) assignments."""

    def __post_init__(self):
        super().__post_init__()
        if self.num_experts_per_token > self.num_experts:
            raise ValueError(f"num_experts_per_token {self.num_experts_per_token} exceeds num_experts "
                             f"{self.num_experts}; route each token to at most num_experts experts.")
        for name in ("router_aux_loss_coef", "router_z_loss_coef"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} {value!r} must be a number >= 0, not nan or inf.")

    @property
    def expert_width(self) -> int:
        return self.expert_mlp_dim or self.mlp_dim

    def loss_terms(self) -> dict[str, float]:
        return {"load_balancing_loss": float(self.router_aux_loss_coef), "router_z_loss": float(self.router_z_loss_coef)}

    def moe_layer(self, activation: str, init_std: float, out_init_std: float) -> MoE:
        """The blocks' feed-forward (named 'mlp')."""
        return MoE(self.num_experts, self.num_experts_per_token, self.expert_width, init_std, out_init_std,
                   activation=activation, normalize_top_k=self.normalize_router_weights,
                   shared_expert_mlp_dim=self.shared_expert_mlp_dim, capacity_factor=self.capacity_factor,
                   dtype=self.compute_dtype, name="mlp")

    def mlp_params(self) -> int:
        """The weights one token multiplies with in a block's MLP: the router, its k experts, the shared one."""
        e = self.embed_dim
        shared = 3 * e * self.shared_expert_mlp_dim + e if self.shared_expert_mlp_dim else 0
        return e * self.num_experts + self.num_experts_per_token * 3 * e * self.expert_width + shared

    def pipeline_stacks(self) -> dict[str, int]:
        raise ValueError("a mixture-of-experts model is not pipelined here (its router statistics do not pass "
                         "between stages); set PIPELINE_PARALLEL=1 and shard the experts with EXPERT_PARALLEL.")

    def mlp_note(self) -> str:
        """None: the experts' width is in block_notes (a sparse block has no dense MLP of mlp_dim)."""
        return ""

    def block_notes(self) -> str:
        notes = f", {self.num_experts} experts, top-{self.num_experts_per_token}, expert mlp {self.expert_width}"
        if self.shared_expert_mlp_dim:
            notes += f", shared expert mlp {self.shared_expert_mlp_dim}"
        if self.capacity_factor is not None:
            notes += f", capacity factor {self.capacity_factor}"
        return super().block_notes() + notes
