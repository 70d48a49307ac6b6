"""Checkpoint layout: canonical, stacked. A model's blocks are saved as one `blocks` entry per stack whose leaves
hold the layers on a leading axis (what model_config.scan_layers=True and a pipeline hold), in the
parameters and in every parameter-shaped part of the optimizer state alike; an unrolled run's
`block_0`, `block_1`, ... are stacked when saved and split again when restored (`stacked_layout`,
`as_target`). So scan_layers stays a run choice: any setting resumes or fine-tunes any checkpoint of
the same architecture, exactly. Stacked rather than unrolled because it is what TPU and pipelined
runs hold (they save without a copy) and because a deep model then has a few arrays to write and
index, not a few per layer. An unrolled run's save holds one stacked copy of its state on the device
until orbax has it in host memory. Checkpoints written unrolled by earlier versions still restore
(the stored layout is read from orbax's metadata)."""
from __future__ import annotations

import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import orbax.checkpoint as ocp
from etils import epath

from models.layers import STACKED, UNROLLED
from t5x_like.errors import UserError


def with_shardings(abstract: Any, shardings: Any) -> Any:
    """ShapeDtypeStructs carrying the target shardings (what restore lays arrays out as)."""
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)


_UNROLLED_KEY = re.compile(UNROLLED.format(r"\d+"))


def _unrolled_count(node: Any) -> int:
    """How many unrolled blocks (`block_0` ...) `node` holds (0 unless it is a dict holding some)."""
    return sum(1 for key in node if _UNROLLED_KEY.fullmatch(str(key))) if isinstance(node, dict) else 0


def _is_stack(node: Any) -> bool:
    return isinstance(node, dict) and (STACKED in node or _unrolled_count(node) > 0)


def _layer_axis(sharding: Any, *, add: bool) -> Any:
    """A layer's sharding with the stack's leading 'layers' axis added (not split), or removed."""
    if not isinstance(sharding, jax.sharding.NamedSharding):
        return sharding
    spec = (None, *sharding.spec) if add else tuple(sharding.spec)[1:]
    return jax.sharding.NamedSharding(sharding.mesh, jax.sharding.PartitionSpec(*spec),
                                      memory_kind=sharding.memory_kind)


def _stack_arrays(*layers: jax.Array) -> jax.Array:
    return jnp.stack(layers)


def _split_array(stack: jax.Array) -> tuple[jax.Array, ...]:
    return tuple(stack)


def _stack(layers: list, sharding: Any = None) -> Any:
    """One leaf of every layer -> the stacked leaf (an array on the devices, laid out as `sharding`,
    by default the first layer's plus an unsplit layer axis; a ShapeDtypeStruct; a host array)."""
    first = layers[0]
    if isinstance(first, jax.ShapeDtypeStruct):
        return jax.ShapeDtypeStruct((len(layers), *first.shape), first.dtype,
                                    sharding=sharding or _layer_axis(first.sharding, add=True))
    if isinstance(first, jax.Array):
        return jax.jit(_stack_arrays, out_shardings=sharding or _layer_axis(first.sharding, add=True))(*layers)
    return np.stack(layers)


def _split(stack: Any, shardings: list) -> list:
    """A stacked leaf -> its layers, laid out as `shardings` (one per layer)."""
    if isinstance(stack, jax.ShapeDtypeStruct):
        return [jax.ShapeDtypeStruct(stack.shape[1:], stack.dtype, sharding=s) for s in shardings]
    if isinstance(stack, jax.Array):
        return list(jax.jit(_split_array, out_shardings=tuple(shardings))(stack))
    return list(stack)


def _without_layers(node: dict) -> dict:
    return {k: v for k, v in node.items() if k != STACKED and not _UNROLLED_KEY.fullmatch(str(k))}


def stacked_layout(tree: Any) -> Any:
    """`tree` (parameters, or a train state holding parameter-shaped trees; arrays, ShapeDtypeStructs or
    host arrays) in the checkpoint layout: every dict's `block_0` ... `block_{n-1}` become one `blocks`
    entry whose leaves are the layers' stacked on a leading axis. A stacked tree is returned as is."""
    def convert(node):
        count = _unrolled_count(node)
        if not count:
            return node
        layers = [node[UNROLLED.format(i)] for i in range(count)]
        return {**_without_layers(node), STACKED: jax.tree.map(lambda *leaves: _stack(list(leaves)), *layers)}

    return jax.tree.map(convert, tree, is_leaf=lambda node: _unrolled_count(node) > 0)


def _unrolled_layout(abstract: Any) -> Any:
    """ShapeDtypeStructs in the unrolled layout (`blocks` split into `block_0` ...): the target for a
    checkpoint an earlier version wrote from an unrolled run."""
    def convert(node):
        if not (isinstance(node, dict) and STACKED in node):
            return node
        leaves, treedef = jax.tree.flatten(node[STACKED])
        count = leaves[0].shape[0]
        split = [_split(leaf, [_layer_axis(leaf.sharding, add=False)] * count) for leaf in leaves]
        return {**_without_layers(node),
                **{UNROLLED.format(i): treedef.unflatten([layers[i] for layers in split]) for i in range(count)}}

    return jax.tree.map(convert, abstract, is_leaf=lambda node: isinstance(node, dict) and STACKED in node)


def as_target(restored: Any, target: Any) -> Any:
    """`restored` (in the checkpoint's layout) in the layout of `target` (ShapeDtypeStructs with
    shardings): stacked leaves split into the target's `block_<i>`, or unrolled ones stacked into its
    `blocks`, each laid out as the target says (no target: as restored)."""
    if target is None:
        return restored

    def convert(want, got):
        if not _is_stack(want) or not isinstance(got, dict):
            return got
        count = _unrolled_count(want)
        if count and STACKED in got:
            leaves, treedef = jax.tree.flatten(got[STACKED])
            wants = [treedef.flatten_up_to(want[UNROLLED.format(i)]) for i in range(count)]
            split = [_split(leaf, [layer[j].sharding for layer in wants]) for j, leaf in enumerate(leaves)]
            return {**_without_layers(got),
                    **{UNROLLED.format(i): treedef.unflatten([layers[i] for layers in split]) for i in range(count)}}
        count = _unrolled_count(got)
        if STACKED in want and count:
            layers = [got[UNROLLED.format(i)] for i in range(count)]
            stacked = jax.tree.map(lambda w, *leaves: _stack(list(leaves), w.sharding), want[STACKED], *layers)
            return {**_without_layers(got), STACKED: stacked}
        return got

    return jax.tree.map(convert, target, restored, is_leaf=_is_stack)


def _shapes(tree: Any) -> dict[str, tuple[int, ...]]:
    return {jax.tree_util.keystr(path, simple=True, separator="/"): tuple(leaf.shape)
            for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


def restore_target(step_dir: str, target: Any, *, parameters: bool = False) -> Any:
    """`target` in the layout the step's files hold (stacked; unrolled when an earlier version saved
    an unrolled run). For the parameters, a target of other names or shapes than the files' (another
    number of layers, another model) is refused in one line."""
    stored = _shapes(dict(ocp.StandardCheckpointHandler().metadata(epath.Path(step_dir) / "params")))
    disk = stacked_layout(target)
    if any(_UNROLLED_KEY.fullmatch(name) for path in stored for name in path.split("/")):
        disk = _unrolled_layout(disk)
    if parameters and target is not None and _shapes(disk) != stored:
        wanted = _shapes(disk)
        path = sorted(set(wanted) ^ set(stored) or {p for p in wanted if wanted[p] != stored[p]})[0]
        raise UserError(f"checkpoint {step_dir} holds another model than the one restoring it: parameter {path} is "
                        f"{stored.get(path, 'missing')} there, {wanted.get(path, 'missing')} here; restore it with "
                        "the model config it records (e.g. another num_layers is not converted).")
    if not parameters and target is not None:
        check_train_state(step_dir, _shapes(disk))
    return disk


def check_train_state(step_dir: str, wanted: dict[str, tuple[int, ...]]) -> None:
    """The step's optimizer state (and loss scale) has the shapes of the run's: a setting that shapes them
    (OPTIMIZER, float16's loss scale) changed since the save is refused in one line, naming the first difference."""
    stored = _shapes(dict(ocp.StandardCheckpointHandler().metadata(epath.Path(step_dir) / "train_state")))
    if wanted == stored:
        return
    path = sorted(set(wanted) ^ set(stored) or {p for p in wanted if wanted[p] != stored[p]})[0]
    raise UserError(f"checkpoint {step_dir} holds the training state of other settings than this run's: {path} is "
                    f"{stored.get(path, 'missing')} there, {wanted.get(path, 'missing')} here. A setting that shapes it "
                    "changed since the save (OPTIMIZER, or DTYPE='float16', whose loss scale is saved with it): resume "
                    "with the settings the run was saved with (its config.gin records them), or start a new "
                    "MODEL_DIR from its parameters with --gin.RESTORE_FROM.")
