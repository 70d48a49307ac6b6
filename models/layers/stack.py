"""A model's stack of blocks: scanned (parameters stacked on a leading 'layers' axis, the layout of every
checkpoint) or unrolled, rematerialised by a named policy, and replaceable by the runtime (a pipeline)."""
from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax

from models.layers.dense import FP8_STATE
from models.layers.moe import ROUTER_STATS

LayerStack = Callable[[type[nn.Module], type[nn.Module]], Callable[..., nn.Module]]
"""The runtime's hook replacing a scanned stack (e.g. by a pipeline): called with the block class and the
nn.scan stack class, returns a constructor called like the stack class."""

REMAT_POLICIES: dict[str, Callable | None] = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "minimal": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
    "save_dots": jax.checkpoint_policies.checkpoint_dots,
    "save_qkv_proj": jax.checkpoint_policies.save_only_these_names(
        "query_proj", "key_proj", "value_proj"),
    "minimal_offloaded": jax.checkpoint_policies.offload_dot_with_no_batch_dims("device", "pinned_host"),
}
"""Named rematerialisation policies ('none' = keep every activation, no remat). 'minimal_offloaded'
saves what 'minimal' saves in host memory instead of device memory (GPU/TPU)."""


def remat(block: type[nn.Module], policy: str) -> type[nn.Module]:
    """Wrap a block class in nn.remat with a named policy; 'none' returns it unchanged."""
    if policy == "none":
        return block
    if policy not in REMAT_POLICIES:
        raise ValueError(
            f"remat policy {policy!r} is unknown; choose 'none' or one of {sorted(REMAT_POLICIES)}."
        )
    return nn.remat(block, policy=REMAT_POLICIES[policy], prevent_cse=True)


# Where block_stack puts the layers' parameters: scanned, one stack `blocks` on a leading 'layers' axis;
# unrolled, `block_0`, `block_1`, ... (checkpoints and the optimizer read these names).
STACKED = "blocks"
UNROLLED = "block_{}"


def block_stack(block: type[nn.Module], block_args: tuple, *, num_layers: int, scan_layers: bool,
                broadcast_args: int, remat_policy: str = "none", layer_stack: LayerStack | None = None) -> Callable:
    """A model's `num_layers` blocks `block(*block_args)` applied in turn, called `(x, *args) -> (x, None)`
    with `broadcast_args` extra arguments every layer sees, each block rematerialised by `remat_policy`
    (`remat`). scan_layers: one nn.scan named `blocks`
    (parameters and cache stacked on a leading 'layers' axis), which `layer_stack(block, stack)` (the
    runtime's hook, e.g. a pipeline) may replace; else unrolled modules `block_0`, `block_1`, ...
    Call it from the model's compact method: the blocks become the model's children."""
    block = remat(block, remat_policy)
    if not scan_layers:
        if layer_stack is not None:
            raise ValueError("a replaced layer stack (pipeline parallelism) needs scan_layers=True; "
                             "set model_config.scan_layers = True.")
        blocks = [block(*block_args, name=UNROLLED.format(i)) for i in range(num_layers)]

        def apply_in_turn(x, *args):
            for layer in blocks:
                x, _ = layer(x, *args)
            return x, None

        return apply_in_turn
    stack = nn.scan(
        block,
        variable_axes={"params": 0, "cache": 0, FP8_STATE: 0, ROUTER_STATS: 0},
        split_rngs={"params": True, "dropout": True},
        in_axes=(nn.broadcast,) * broadcast_args,
        length=num_layers,
        metadata_params={nn.PARTITION_NAME: "layers"},
    )
    if layer_stack is not None:
        stack = layer_stack(block, stack)
    return stack(*block_args, name=STACKED)

