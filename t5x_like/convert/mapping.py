"""The generic half of a converter: a family module lists how its tensors map to Hugging Face names
(`Entry`: HF name, our parameter paths, a `Transform`) for the top level and for each `Stack` of
blocks, and these functions walk the lists.

Our parameters are addressed by '/'-joined paths (`wte/embedding`, `attn/query_kernel`); per-layer
entries are relative to one block, which lives at `<stack>blocks/...` with a leading layer axis
(scan_layers=True) or at `<stack>block_<i>/...` (stack '' for GPT-2, 'encoder/' or 'decoder/' for T5). Both walks consume their input as they go, so a model
never exists twice in full.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Sequence

import numpy as np

from t5x_like.errors import UserError, note
from t5x_like.inference import loading


class Transform(NamedTuple):
    """to_hf(our arrays, config) -> one HF array; from_hf(HF array, config) -> our arrays."""

    to_hf: Callable[[Sequence[np.ndarray], Any], np.ndarray]
    from_hf: Callable[[np.ndarray, Any], list[np.ndarray]]


IDENTITY = Transform(lambda ours, config: ours[0], lambda theirs, config: [theirs])


def _pad_vocab_rows(theirs: np.ndarray, config) -> list[np.ndarray]:
    padding = ((0, config.padded_vocab_size - config.vocab_size),) + ((0, 0),) * (theirs.ndim - 1)
    return [np.pad(theirs, padding)]


VOCAB_ROWS = Transform(lambda ours, config: ours[0][:config.vocab_size], _pad_vocab_rows)
"""A table (or bias) over the vocabulary: HF holds vocab_size rows, ours padded_vocab_size (the padding rows come
back as zeros; they never take probability). A table of another size gives a shape the import refuses."""


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
    """Our flat parameters from HF tensors (popped as they are used). A tensor that does not give the shapes
    of `config`'s parameters, or a block beyond a stack's layer count, means the config.json beside the
    weights describes another model: a UserError names the tensor."""
    shapes = {path: leaf.shape for path, leaf in flatten(loading.abstract_params(config)[0]).items()}

    def take(name: str, entry: Entry, ours: Sequence[str], per_layer: bool) -> list[np.ndarray]:
        if name not in tensors:
            raise UserError(f"{source}: tensor {name!r} is missing; is this a complete {config.family} checkpoint?")
        theirs = tensors.pop(name)
        expected = [shapes[p][1:] if per_layer and config.scan_layers else shapes[p] for p in ours]
        try:
            arrays = entry.transform.from_hf(theirs, config)
        except ValueError:  # a reshape to the config's sizes that the tensor's size cannot fill
            arrays = None
        if arrays is None or [a.shape for a in arrays] != expected:
            raise UserError(f"{source}: tensor {name!r} has shape {tuple(theirs.shape)}, which does not fit the "
                            f"model config.json describes ({config.summary()}); the config and the weights disagree: "
                            "repair config.json (or download the model again).")
        return arrays

    flat = {}
    for entry in top:
        flat.update(zip(entry.ours, take(entry.hf_name, entry, entry.ours, per_layer=False)))
    for stack in stacks:
        check_block_count(tensors, stack, source)
        for entry in stack.entries:
            per_layer = [take(stack.hf_prefix.format(layer) + entry.hf_name, entry,
                              [f"{block_path(stack, config.scan_layers, layer)}/{p}" for p in entry.ours],
                              per_layer=True)
                         for layer in range(stack.num_layers)]
            for i, path in enumerate(entry.ours):
                if config.scan_layers:
                    flat[f"{stack.ours}blocks/{path}"] = np.stack([arrays[i] for arrays in per_layer])
                else:
                    flat.update((f"{block_path(stack, False, layer)}/{path}", arrays[i])
                                for layer, arrays in enumerate(per_layer))
    return flat


def rope_of(hf: dict, source: str) -> tuple[dict, str]:
    """(the rotary settings, their rope_type) of a config.json: 4.x's rope_theta and rope_scaling or 5.x's
    rope_parameters. A scaling (a `factor`) that names no type is refused: read as no scaling, the model would run
    on other positions than it was trained on."""
    key = "rope_parameters" if hf.get("rope_parameters") else "rope_scaling"
    rope = hf.get(key) or {}
    if "factor" in rope and "rope_type" not in rope and "type" not in rope:
        raise UserError(f"{source}: {key}={rope} names no rope_type, so its scaling cannot be read; repair config.json: "
                        f"add the type it was trained with to {key} (e.g. \"rope_type\": \"llama3\").")
    return rope, rope.get("rope_type", rope.get("type", "default"))


def with_model_prefix(tensors: dict[str, np.ndarray], prefix: str | None) -> dict[str, np.ndarray]:
    """A checkpoint of the base model (transformers' `GPT2Model`, `LlamaModel`, ...: the Hub's `gpt2` is one) names
    its tensors without the prefix (transformers' base_model_prefix) the language model's names carry: add it, as
    `from_pretrained` does, when no tensor has it."""
    if not prefix or any(name.startswith(f"{prefix}.") for name in tensors):
        return tensors
    return {f"{prefix}.{name}": tensors[name] for name in list(tensors)}


def tied_copies(tensors: dict[str, np.ndarray], tied: dict[str, str]) -> dict[str, np.ndarray]:
    """For each tied HF name (`tied`: name -> the tensor it shares) the weights hold beside what it shares: that
    tensor, which a copy left over by from_hf_tensors must equal (taken before the walk pops it)."""
    return {name: tensors[same_as] for name, same_as in tied.items() if name in tensors and same_as in tensors}


def check_all_used(left: dict[str, np.ndarray], copies: dict[str, np.ndarray], unused: dict[str, str],
                   config_file: str) -> None:
    """The tensors from_hf_tensors left over are tied copies equal to what they share (`copies`, tied_copies) or
    tensors the family never reads (`unused`: pattern -> why, '' for buffers such as rotary inverse frequencies;
    each reason is told once as a note). Any other is a part of the model that config.json switches off (a bias, a
    shared expert, q/k norms ...) while the weights hold it: converting would drop it, so it is refused."""
    untied = sorted(name for name in left if name in copies and not np.array_equal(left[name], copies[name]))
    if untied:
        raise UserError(f"{config_file}: the model it describes ties {untied[0]!r} to another tensor, but the weights "
                        f"hold a different {untied[0]!r}: set the tie option false in config.json (e.g. "
                        "tie_word_embeddings) or download the model again. Nothing was written.")
    reasons = {pattern: sorted(n for n in left if n not in copies and re.fullmatch(pattern, n)) for pattern in unused}
    dropped = sorted(set(left) - set(copies) - {n for names in reasons.values() for n in names})
    if dropped:
        shown = ", ".join(repr(name) for name in dropped[:4]) + (f" and {len(dropped) - 4} more" if len(dropped) > 4
                                                                  else "")
        raise UserError(f"{config_file}: the weights hold {len(dropped)} tensor(s) the model it describes has no place "
                        f"for ({shown}): config.json switches off a part the weights have; repair config.json (or "
                        "download the model again). Nothing was written.")
    for pattern, names in reasons.items():
        if names and unused[pattern]:
            note(f"left out {len(names)} tensor(s) ({names[0]!r}, ...): {unused[pattern]}")


def check_block_count(tensors: dict[str, np.ndarray], stack: Stack, source: str) -> None:
    """The weights hold as many blocks of the stack as config.json gives (its first tensor counts them)."""
    first = stack.entries[0].hf_name
    held = 0
    while stack.hf_prefix.format(held) + first in tensors:
        held += 1
    if held and held != stack.num_layers:
        raise UserError(f"{source}: config.json gives {stack.num_layers} blocks but the weights hold {held} "
                        f"({stack.hf_prefix.format(held - 1) + first!r} is the last); repair the layer count in "
                        "config.json (or download the model again).")


# Mixture of experts: Hugging Face checkpoints (save_pretrained's files) hold one tensor per expert,
# `<...>.experts.<e>.<name>`; ours stack the experts on a leading axis. A converter maps the stacked name
# `<...>.experts.<name>` [experts, ...] in its layout, with `stacked_experts` as its renamed_tensors (from-hf)
# and `per_expert` as its exported_tensors (to-hf, to-torch).
_PER_EXPERT = re.compile(r"^(?P<head>.*\.experts\.)(?P<expert>\d+)\.(?P<tail>.+)$")
_STACKED = re.compile(r"^(?P<head>.*\.experts\.)(?P<tail>[^\d].*)$")

EXPERTS_TRANSPOSED = Transform(lambda ours, c: np.swapaxes(ours[0], -1, -2),
                               lambda theirs, c: [np.swapaxes(theirs, -1, -2)])
"""Stacked torch Linear weights [experts, out, in] <-> our expert kernels [experts, in, out]."""


def stacked_experts(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`<...>.experts.<e>.<name>` for e = 0..n-1 -> one `<...>.experts.<name>` [n, ...] (the others unchanged);
    experts that are not numbered 0..n-1 without a gap are refused, naming the first one missing."""
    groups: dict[str, dict[int, np.ndarray]] = {}
    for name in [n for n in tensors if _PER_EXPERT.match(n)]:
        match = _PER_EXPERT.match(name)
        groups.setdefault(match["head"] + match["tail"], {})[int(match["expert"])] = tensors.pop(name)
    for name, by_expert in groups.items():
        missing = sorted(set(range(max(by_expert) + 1)) - set(by_expert))
        if missing:
            head, tail = _STACKED.match(name).group("head", "tail")
            raise UserError(f"tensor {head + str(missing[0]) + '.' + tail!r} is missing (the weights hold experts "
                            f"{sorted(by_expert)} of {name!r}); download the model again.")
        tensors[name] = np.stack([by_expert.pop(e) for e in range(len(by_expert))])
    return tensors


def per_expert(pairs: Iterable[tuple[str, np.ndarray]]) -> Iterator[tuple[str, np.ndarray]]:
    """The inverse of stacked_experts over (name, array) pairs: `<...>.experts.<name>` [n, ...] -> n tensors
    `<...>.experts.<e>.<name>`."""
    for name, array in pairs:
        match = _STACKED.match(name)
        if match is None:
            yield name, array
        else:
            yield from ((f"{match['head']}{e}.{match['tail']}", array[e]) for e in range(array.shape[0]))
