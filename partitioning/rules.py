"""Logical-axis rule sets as plain data.

A rule set maps each logical axis name (used by the models) to mesh axes. `params` rules
place parameters, `activations` rules place activations and batches, and `opt_state` rules
place optimizer moments (ZeRO-1 shards only those). Axes that a rule set leaves unmapped are
replicated. Expert parallelism is in every set: a mixture of experts' weights split over 'expert' by their
'expert' axis, and outside the experts the 'expert' mesh axis splits the batch as 'data' does (MaxText's
layout), so EXPERT_PARALLEL devices hold different rows and, in the MoE layers, different experts.
"""
from __future__ import annotations

import dataclasses

from partitioning.errors import PartitioningError

Rules = tuple[tuple[str, str | tuple[str, ...] | None], ...]

ACTIVATIONS: Rules = (
    ("activation_batch", ("data", "fsdp", "expert")),
    ("activation_length", None),
    ("activation_embed", None),
    ("activation_heads", "tensor"),
    ("activation_kv", None),
    ("activation_mlp", "tensor"),
    ("activation_vocab", "tensor"),
)

REPLICATED: Rules = (
    ("vocab", None), ("embed", None), ("mlp", None), ("heads", None), ("kv", None),
    ("layers", "stage"), ("position", None), ("relpos_buckets", None), ("expert", "expert"),
)
FSDP: Rules = (
    ("vocab", None), ("embed", "fsdp"), ("mlp", None), ("heads", None), ("kv", None),
    ("layers", "stage"), ("position", None), ("relpos_buckets", None), ("expert", "expert"),
)
TENSOR: Rules = (
    ("vocab", "tensor"), ("embed", None), ("mlp", "tensor"), ("heads", "tensor"), ("kv", None),
    ("layers", "stage"), ("position", None), ("relpos_buckets", None), ("expert", "expert"),
)
FSDP_TENSOR: Rules = (
    ("vocab", "tensor"), ("embed", "fsdp"), ("mlp", "tensor"), ("heads", "tensor"), ("kv", None),
    ("layers", "stage"), ("position", None), ("relpos_buckets", None), ("expert", "expert"),
)
# Megatron sequence parallelism: the residual stream [batch, length, embed] (norms, dropout, residual
# adds) is split over 'tensor' along its length between the tensor-parallel blocks. Rules apply in
# order and a mesh axis is used once per array, so listing heads/mlp/vocab first keeps the blocks'
# own arrays split by heads/mlp/vocab and only arrays without those axes take length -> 'tensor'.
SEQUENCE_PARALLEL_ACTIVATIONS: Rules = (
    ("activation_batch", ("data", "fsdp", "expert")),
    ("activation_heads", "tensor"),
    ("activation_mlp", "tensor"),
    ("activation_vocab", "tensor"),
    ("activation_length", "tensor"),
    ("activation_embed", None),
    ("activation_kv", None),
)
_NO_TENSOR_ACTIVATIONS: Rules = tuple(
    (name, None if axes == "tensor" else axes) for name, axes in ACTIVATIONS
)


@dataclasses.dataclass(frozen=True)
class RuleSet:
    """Rules for parameters, optimizer state and activations."""

    name: str
    params: Rules
    opt_state: Rules
    activations: Rules

    @property
    def mesh_axes_used(self) -> set[str]:
        used = set()
        for _, axes in self.params + self.opt_state + self.activations:
            used.update((axes,) if isinstance(axes, str) else axes or ())
        return used


RULE_SETS = {
    "data_parallel": RuleSet("data_parallel", REPLICATED, REPLICATED, _NO_TENSOR_ACTIVATIONS),
    "fsdp": RuleSet("fsdp", FSDP, FSDP, _NO_TENSOR_ACTIVATIONS),
    "zero1": RuleSet("zero1", REPLICATED, FSDP, _NO_TENSOR_ACTIVATIONS),
    "tensor": RuleSet("tensor", TENSOR, TENSOR, ACTIVATIONS),
    "fsdp_tensor": RuleSet("fsdp_tensor", FSDP_TENSOR, FSDP_TENSOR, ACTIVATIONS),
    "zero1_tensor": RuleSet("zero1_tensor", TENSOR, FSDP_TENSOR, ACTIVATIONS),
    "tensor_sequence": RuleSet("tensor_sequence", TENSOR, TENSOR, SEQUENCE_PARALLEL_ACTIVATIONS),
    "fsdp_tensor_sequence": RuleSet("fsdp_tensor_sequence", FSDP_TENSOR, FSDP_TENSOR, SEQUENCE_PARALLEL_ACTIVATIONS),
}
"""Named rule sets. 'fsdp' is ZeRO-3; 'zero1' keeps parameters replicated and shards only
the optimizer state over 'fsdp'; 'tensor' is Megatron tensor parallelism (column/row splits
follow from heads/mlp/vocab -> 'tensor'); the *_tensor sets combine them; *_sequence adds Megatron
sequence parallelism to tensor parallelism."""


def get_rule_set(name: str) -> RuleSet:
    if name not in RULE_SETS:
        raise PartitioningError(f"rule set {name!r} is unknown; choose one of {sorted(RULE_SETS)}.")
    return RULE_SETS[name]
