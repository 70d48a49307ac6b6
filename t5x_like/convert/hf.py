"""Checkpoint <-> Hugging Face directory / torch state_dict, for every family in FAMILIES.

    to_hf(src, dst)        MODEL_DIR or step dir -> dst/{config.json, model.safetensors, tokenizer files}
    from_hf(src, dst)      HF directory -> dst/checkpoints/0 (params + model config; params-only)
    to_torch(src, file)    MODEL_DIR or step dir -> a plain state_dict (HF names) saved with torch.save
"""
from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Iterator

import jax
import numpy as np

from models.registry import declaring_modules
from t5x_like.checkpoint import store
from t5x_like.convert import mapping
from t5x_like.data.tokenizer_files import save_tokenizer, tokenizer_record
from t5x_like.errors import UserError, note
from t5x_like.inference import loading

FAMILIES = declaring_modules("t5x_like.convert", "HF_MODEL_TYPE")
"""Our family name -> its converter module, t5x_like/convert/<family>.py: every module of the package that declares
HF_MODEL_TYPE is the converter of the family it is named after (mapping.py, hf.py and __main__.py declare none).
A converter declares HF_MODEL_TYPE, TIED, layout(config) (top-level entries and block stacks), config_to_hf,
config_from_hf, tokenizer_config; optionally HF_MODEL_TYPES (the model types it imports, when several),
tied(config) (to-torch; from-hf: a tied copy the weights hold must equal what it shares), UNUSED_HF_TENSORS
(from-hf: pattern -> why the weights' tensors of that name are not read, '' for buffers), BASE_MODEL_PREFIX
(from-hf: transformers' base_model_prefix, which a base-model checkpoint's names lack), copied(config) (to-hf),
config_for_tensors(config, tensors) (from-hf, T5's head), renamed_tensors(tensors) (from-hf), exported_tensors(pairs)
(to-hf and to-torch: the layout's (HF name, array) pairs -> those written; the mixture-of-experts families'
per-expert tensors, mapping.per_expert) and add_import_command(commands) (an import of its upstream's own
checkpoints, e.g. from-neox: convert/__main__.py)."""
HF_TOKENIZER_FILES = ("tokenizer.json", "vocab.json", "merges.txt", "spiece.model", "tokenizer.model", "vocab.txt")
"""Files of which a Hugging Face model directory with a tokenizer holds at least one."""


def converter_for(family: str):
    if family not in FAMILIES:
        raise UserError(f"no converter for model family {family!r}; converters exist for {sorted(FAMILIES)}.")
    return FAMILIES[family]


def hf_tensors(src: str) -> Iterator[tuple[str, np.ndarray]]:
    """Named float32 arrays of our checkpoint `src` with HF names (tied names left out)."""
    config, _ = loading.read_config(src)
    family = converter_for(config.family)
    flat = mapping.flatten(restore_on_host(src, config))
    pairs = mapping.to_hf_tensors(flat, config, *family.layout(config))
    yield from family.exported_tensors(pairs) if hasattr(family, "exported_tensors") else pairs


def restore_on_host(src: str, config) -> dict:
    """The checkpoint's parameters as numpy arrays, restored onto one CPU device whatever the mesh
    they were saved from."""
    try:
        host = jax.local_devices(backend="cpu")[0]
    except RuntimeError:  # JAX_PLATFORMS excludes cpu: the first local accelerator then
        host = jax.local_devices()[0]
    params = loading.restore_params(src, config, lambda specs: jax.tree.map(
        lambda _: jax.sharding.SingleDeviceSharding(host), specs,
        is_leaf=lambda x: isinstance(x, jax.sharding.PartitionSpec)))
    return jax.tree.map(np.asarray, params)


def to_hf(src: str, dst: str, tokenizer: str | None = None) -> None:
    """Write dst/config.json + dst/model.safetensors + the tokenizer's files (`tokenizer`, else the one src
    records; none when it records none)."""
    from safetensors.numpy import save_file

    config, recorded = loading.read_config(src)
    tokenizer = loading.checkpoint_tokenizer(src, config, tokenizer) if tokenizer or recorded else None
    converter = converter_for(config.family)
    hf_config = converter.config_to_hf(config, tokenizer.eod_id if tokenizer else None)  # refused before writing
    tensors = {name: np.ascontiguousarray(array, np.float32) for name, array in hf_tensors(src)}  # verified
    if hasattr(converter, "copied"):  # T5: a tied but unscaled head is written as an equal untied one
        tensors.update((name, tensors[same_as].copy()) for name, same_as in converter.copied(config).items())
    os.makedirs(dst, exist_ok=True)
    save_file(tensors, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    readable_as_the_others(os.path.join(dst, "model.safetensors"))
    del tensors
    bos = tokenizer.configured_token_id("bos_token") if tokenizer is not None else None
    own = tokenizer is not None and tokenizer.own_special_tokens  # its beginning-of-text token, or none as it has
    if (bos is not None or own) and "bos_token_id" in hf_config:
        hf_config["bos_token_id"] = bos
    write_json(os.path.join(dst, "config.json"), hf_config)
    if tokenizer:
        save_tokenizer(tokenizer, dst, converter.tokenizer_config(config, tokenizer))


def readable_as_the_others(path: str) -> None:
    """Give `path` the mode a file the user creates gets (0666 less the umask): safetensors writes through a
    temporary file and leaves it readable by its owner only (0600)."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


EXPORT_FILES = ("config.json", "generation_config.json", "model.safetensors", "model-*-of-*.safetensors",
                "model.safetensors.index.json", "pytorch_model*.bin", "pytorch_model.bin.index.json",
                "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                "vocab.json", "merges.txt", "vocab.txt", "spiece.model", "tokenizer.model", "chat_template.jinja")
"""What a Hugging Face model folder holds (transformers' save_pretrained, a tokenizer's save): an earlier export's
files that `to-hf --overwrite` removes, so none of them stays beside the new model's."""


def remove_export(dst: str) -> list[str]:
    """Remove the model and tokenizer files (EXPORT_FILES) in `dst`; returns their names."""
    removed = sorted({path.name for pattern in EXPORT_FILES for path in Path(dst).glob(pattern) if path.is_file()})
    for name in removed:
        os.remove(os.path.join(dst, name))
    return removed


def to_torch(src: str, file: str) -> None:
    """torch.save a state_dict with HF names (tied tensors shared), loadable into the HF model class.
    A tied name that the checkpoint has its own tensor for (an untied output head) keeps it."""
    import torch

    config, _ = loading.read_config(src)
    state = {name: torch.from_numpy(np.array(array, np.float32)) for name, array in hf_tensors(src)}
    converter = converter_for(config.family)
    for name, same_as in tied_names(converter, config).items():
        state.setdefault(name, state[same_as])
    os.makedirs(os.path.dirname(os.path.abspath(file)), exist_ok=True)
    torch.save(state, file)


def tied_names(converter, config) -> dict[str, str]:
    """HF name -> the name of the tensor it shares, for this config's model (BERT: only its MLM head ties)."""
    return converter.tied(config) if hasattr(converter, "tied") else converter.TIED


def from_hf(src: str, dst: str, *, step: int = 0, **choices) -> str:
    """Convert the HF directory `src` into a params-only checkpoint dst/checkpoints/<step>; returns its path.

    `choices` are our own config fields (scan_layers, vocab_pad_multiple, dtype, attention, remat_policy).
    The HF tokenizer, when the directory has one, is recorded in the checkpoint (its files included).
    """
    config_file = os.path.join(src, "config.json")
    if not os.path.isfile(config_file):
        raise UserError(f"{config_file} does not exist; from-hf expects a Hugging Face model directory "
                        "(config.json + model.safetensors or pytorch_model.bin).")
    try:
        with open(config_file) as f:
            hf_config = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{config_file}: not valid JSON ({e}); re-download or repair the model's config.json.") from None
    if not isinstance(hf_config, dict):
        raise UserError(f"{config_file}: a JSON object is expected, not {type(hf_config).__name__}; re-download "
                        "or repair the model's config.json.")
    family = family_for_hf(hf_config.get("model_type"), config_file)
    try:
        config = family.config_from_hf(hf_config, config_file, **choices)
    except (KeyError, TypeError) as e:  # a field missing or of the wrong type in the user's file
        raise UserError(f"{config_file}: {type(e).__name__}: {e} (a field missing or of the wrong type); "
                        "re-download or repair the model's config.json.") from None
    except UserError:
        raise
    except ValueError as e:  # values no model has: our config's own checks
        raise UserError(f"{config_file}: its values describe no model we can build ({e}); re-download or repair "
                        "the model's config.json.") from None
    tokenizer = hf_tokenizer_record(src, config)
    tensors = mapping.with_model_prefix(read_hf_weights(src), getattr(family, "BASE_MODEL_PREFIX", None))
    if hasattr(family, "renamed_tensors"):  # BERT: Google's LayerNorm gamma / beta; MoE: experts stacked
        try:
            tensors = family.renamed_tensors(tensors)
        except UserError as e:  # the weights' own fault (an expert missing): name the folder
            raise UserError(f"{src}: {e}") from None
    if hasattr(family, "config_for_tensors"):  # T5: transformers 5 keeps a head saved apart from shared untied
        config = family.config_for_tensors(config, tensors)
    copies = mapping.tied_copies(tensors, tied_names(family, config))
    flat = mapping.from_hf_tensors(tensors, config, *family.layout(config), src)
    mapping.check_all_used(tensors, copies, getattr(family, "UNUSED_HF_TENSORS", {}), config_file)
    del tensors, copies
    params = jax.tree.map(jax.numpy.asarray, mapping.unflatten(flat))
    store.save_params(dst, step, params, {"config": dataclasses.asdict(config), "tokenizer": tokenizer})
    if tokenizer is None:
        note_no_tokenizer(src, ", ".join(HF_TOKENIZER_FILES[:3]))
    return os.path.join(dst, store.CHECKPOINT_SUBDIR, str(step))


def note_no_tokenizer(src: str, files: str) -> None:
    """Say at conversion time that the checkpoint records no tokenizer (generate and eval then need --tokenizer)."""
    note(f"{src} has no tokenizer files ({files}), so the checkpoint records none: generate and eval will need "
         "--tokenizer=PATH (the model's own tokenizer), and an export writes none without it; or copy its files "
         "into the folder and convert again.")


def hf_model_types(family) -> tuple[str, ...]:
    """The HF model types a converter imports: HF_MODEL_TYPES (Llama's llama, mistral, qwen2), else its one."""
    return getattr(family, "HF_MODEL_TYPES", (family.HF_MODEL_TYPE,))


def family_for_hf(model_type: str | None, source: str):
    for family in FAMILIES.values():
        if model_type in hf_model_types(family):
            return family
    known = sorted(t for f in FAMILIES.values() for t in hf_model_types(f))
    raise UserError(f"{source}: model_type {model_type!r} has no converter; supported Hugging Face model types: "
                    f"{known}.")


def read_hf_weights(src: str) -> dict[str, np.ndarray]:
    """float32 arrays from model.safetensors (single or sharded) or pytorch_model.bin (weights_only)."""
    import torch
    from safetensors.torch import load_file

    index = os.path.join(src, "model.safetensors.index.json")
    if os.path.isfile(index):
        with open(index) as f:
            files = sorted(set(json.load(f)["weight_map"].values()))
    elif os.path.isfile(os.path.join(src, "model.safetensors")):
        files = ["model.safetensors"]
    elif os.path.isfile(os.path.join(src, "pytorch_model.bin")):
        state = torch.load(os.path.join(src, "pytorch_model.bin"), map_location="cpu", weights_only=True)
        return {name: tensor.float().numpy() for name, tensor in state.items()}
    else:
        raise UserError(f"{src}: no model.safetensors, model.safetensors.index.json or pytorch_model.bin.")
    tensors = {}
    for file in files:
        try:
            loaded = load_file(os.path.join(src, file))
        except Exception as e:  # noqa: BLE001 - safetensors raises its own error type for a damaged file
            raise UserError(f"{os.path.join(src, file)}: not a readable safetensors file ({e}); it may be "
                            "truncated: download it again.") from None
        tensors.update((name, t.float().numpy()) for name, t in loaded.items())
    return tensors


def hf_tokenizer_record(src: str, config) -> dict | None:
    """The record (tokenizer_record) of the tokenizer in the HF directory `src`, or None when it has none;
    a tokenizer far smaller than the model's vocabulary is refused (another model's files)."""
    if not any(os.path.isfile(os.path.join(src, name)) for name in HF_TOKENIZER_FILES):
        return None
    tokenizer = loading.open_tokenizer(src, config, flag=f"the tokenizer in {src}")
    unused = config.vocab_size - tokenizer.vocab_size
    if unused > loading.MAX_UNUSED_VOCAB_ROWS:
        raise UserError(
            f"{src}: the tokenizer has {tokenizer.vocab_size} ids but the model's vocab_size is {config.vocab_size}, "
            f"so {unused} embedding rows would never be used: these are not the model's tokenizer files. Put the "
            "model's own tokenizer files in the directory, or remove them (and pass --tokenizer to eval and generate).")
    return tokenizer_record(tokenizer)


def write_json(path: str, value: dict) -> None:
    with open(path, "w") as f:
        json.dump(value, f, indent=2)
        f.write("\n")
