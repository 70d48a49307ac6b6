"""The generic half of a converter: a family module lists how its tensors map to Hugging Face names
(`Entry`: HF name, our parameter paths, a `Transform`) for the top level and for each `Stack` of
blocks, and these functions walk the lists.

Our parameters are addressed by '/'-joined paths (`wte/embedding`, `attn/query_kernel`); per-layer
entries are relative to one block, which lives at `<stack>blocks/...` with a leading layer axis
(scan_layers=True) or at `<stack>block_<i>/...` (stack '' for GPT-2, 'encoder/' or 'decoder/' for T5). Both walks consume their input as they go, so a model
never exists twice in full.
"""
from __future__ import annotations

from typing import Any, Callable, Iterator, NamedTuple, Sequence

import numpy as np


class Transform(NamedTuple):
    """to_hf(our arrays, config) -> one HF array; from_hf(HF array, config) -> our arrays."""

    to_hf: Callable[[Sequence[np.ndarray], Any], np.ndarray]
    from_hf: Callable[[np.ndarray, Any], list[np.ndarray]]


IDENTITY = Transform(lambda ours, config: ours[0], lambda theirs, config: [theirs])


class Entry(NamedTuple):
    hf_name: str
    ours: tuple[str, ...]
    transform: Transform = IDENTITY


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
    """{'a': {'b': x}} -> {'a/b': x}."""
    flat = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(flatten(value, path + "/"))
        else:
            flat[path] = value
    return flat


def unflatten(flat: dict[str, Any]) -> dict:
    """{'a/b': x} -> {'a': {'b': x}}."""
    tree: dict = {}
    for path, value in flat.items():
        *parents, leaf = path.split("/")
        node = tree
        for name in parents:
            node = node.setdefault(name, {})
        node[leaf] = value
    return tree


class Stack(NamedTuple):
    """One stack of identical blocks: our path prefix ('' or e.g. 'encoder/'), the HF name prefix
    of block i (e.g. 'transformer.h.{}.'), the per-block entries and the number of blocks."""

    ours: str
    hf_prefix: str
    entries: Sequence[Entry]
    num_layers: int


def block_path(stack: Stack, scan_layers: bool, layer: int) -> str:
    return f"{stack.ours}blocks" if scan_layers else f"{stack.ours}block_{layer}"


def to_hf_tensors(flat: dict[str, np.ndarray], config, top: Sequence[Entry],
                  stacks: Sequence[Stack]) -> Iterator[tuple[str, np.ndarray]]:
    """(HF name, array) pairs from our flat parameters, which are popped once fully converted."""
    for entry in top:
        yield entry.hf_name, entry.transform.to_hf([flat.pop(p) for p in entry.ours], config)
    for stack in stacks:
        for entry in stack.entries:
            for layer in range(stack.num_layers):
                base = block_path(stack, config.scan_layers, layer)
                arrays = [flat[f"{base}/{p}"][layer] if config.scan_layers else flat.pop(f"{base}/{p}")
                          for p in entry.ours]
                yield stack.hf_prefix.format(layer) + entry.hf_name, entry.transform.to_hf(arrays, config)
            if config.scan_layers:
                for p in entry.ours:
                    del flat[f"{stack.ours}blocks/{p}"]
    if flat:
        raise ValueError(f"parameters {sorted(flat)} have no Hugging Face name in the converter; the checkpoint "
                         "does not match the model family's converter.")


def from_hf_tensors(tensors: dict[str, np.ndarray], config, top: Sequence[Entry], stacks: Sequence[Stack],
                    source: str) -> dict[str, np.ndarray]:
    """Our flat parameters from HF tensors (popped as they are used)."""
    def take(name: str) -> np.ndarray:
        if name not in tensors:
            raise ValueError(f"{source}: tensor {name!r} is missing; is this a complete {config.family} checkpoint?")
        return tensors.pop(name)

    flat = {}
    for entry in top:
        flat.update(zip(entry.ours, entry.transform.from_hf(take(entry.hf_name), config)))
    for stack in stacks:
        for entry in stack.entries:
            per_layer = [entry.transform.from_hf(take(stack.hf_prefix.format(layer) + entry.hf_name), config)
                         for layer in range(stack.num_layers)]
            for i, path in enumerate(entry.ours):
                if config.scan_layers:
                    flat[f"{stack.ours}blocks/{path}"] = np.stack([arrays[i] for arrays in per_layer])
                else:
                    flat.update((f"{block_path(stack, False, layer)}/{path}", arrays[i])
                                for layer, arrays in enumerate(per_layer))
    return flat
