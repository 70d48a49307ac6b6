"""GPT-NeoX <-> Hugging Face `GPTNeoXForCausalLM`: a name map plus a few transforms, and `from_neox`
for GPT-NeoX's own DeepSpeed pipeline checkpoints.

HF stores torch Linear weights [out, in]; ours are [in, out] (per head where there are heads):
  - `attention.query_key_value` is fused per head: its output dim is [heads, 3 (q, k, v), head_dim]
    (not [3, heads, head_dim] as GPT-2's c_attn); ours are three [embed, heads, head_dim] kernels;
  - `attention.dense` [embed, heads * head_dim] is our out_kernel [heads, head_dim, embed];
  - the MLP's dense_h_to_4h / dense_4h_to_h are our fc / proj kernels transposed;
  - both vocabulary tables (`gpt_neox.embed_in`, `embed_out`) have padded_vocab_size rows here and
    exactly vocab_size rows in HF; padding rows come back as zeros on import (they never take
    probability). The rotary inverse frequencies are buffers HF recomputes: never written, ignored.
transformers >= 5 calls the output head `lm_head` in the module but saves and loads it as
`embed_out.weight`, the name in every published GPT-NeoX checkpoint; this map uses that name.
"""
from __future__ import annotations

import argparse
import dataclasses
import glob
import os
import re

import jax
import numpy as np

import configs
import models
from models.neox import NeoXConfig
from t5x_like.checkpoint import store
from t5x_like.convert import gpt2, mapping
from t5x_like.convert.mapping import VOCAB_ROWS, Entry, Stack, Transform
from t5x_like.data.tokenizer_files import tokenizer_record
from t5x_like.errors import UserError
from t5x_like.inference import loading

HF_MODEL_TYPE = "gpt_neox"
HF_BLOCK_PREFIX = "gpt_neox.layers.{}."
TIED: dict[str, str] = {}
"""No HF name shares another tensor: the output head is untied."""
BASE_MODEL_PREFIX = "gpt_neox"
UNUSED_HF_TENSORS = {r"gpt_neox\.layers\.\d+\.attention\.(bias|masked_bias|rotary_emb\.inv_freq)": ""}
"""Buffers older transformers saved (Pythia's checkpoints): the causal mask and the rotary inverse frequencies."""
HF_GELU_EXACT = ("gelu",)


def _fuse_qkv(ours, c: NeoXConfig) -> np.ndarray:
    """3 x [embed, heads, head_dim] -> [heads * 3 * head_dim, embed]; 3 x [heads, head_dim] -> [heads * 3 * head_dim]."""
    fused = np.stack(ours, axis=-2)  # [..., heads, 3, head_dim]
    if fused.ndim == 3:
        return fused.reshape(-1)
    return fused.reshape(fused.shape[0], -1).T


def _split_qkv(theirs: np.ndarray, c: NeoXConfig) -> list[np.ndarray]:
    per_head = theirs.reshape(c.num_heads, 3, c.head_dim, *theirs.shape[1:])
    if theirs.ndim == 1:
        return [per_head[:, i] for i in range(3)]
    return [np.moveaxis(per_head[:, i], -1, 0) for i in range(3)]  # [embed, heads, head_dim]


FUSED_QKV = Transform(_fuse_qkv, _split_qkv)
TRANSPOSED = Transform(lambda ours, c: ours[0].T, lambda theirs, c: [theirs.T])
HEADS_IN = Transform(lambda ours, c: ours[0].reshape(c.embed_dim, c.embed_dim).T,
                     lambda theirs, c: [theirs.T.reshape(c.num_heads, c.head_dim, c.embed_dim)])

TOP = (
    Entry("gpt_neox.embed_in.weight", ("embed_in/embedding",), VOCAB_ROWS),
    Entry("gpt_neox.final_layer_norm.weight", ("ln_f/scale",)),
    Entry("gpt_neox.final_layer_norm.bias", ("ln_f/bias",)),
    Entry("embed_out.weight", ("embed_out/embedding",), VOCAB_ROWS),
)
BLOCK = (
    Entry("input_layernorm.weight", ("ln_1/scale",)),
    Entry("input_layernorm.bias", ("ln_1/bias",)),
    Entry("attention.query_key_value.weight", ("attn/query_kernel", "attn/key_kernel", "attn/value_kernel"),
          FUSED_QKV),
    Entry("attention.query_key_value.bias", ("attn/query_bias", "attn/key_bias", "attn/value_bias"), FUSED_QKV),
    Entry("attention.dense.weight", ("attn/out_kernel",), HEADS_IN),
    Entry("attention.dense.bias", ("attn/out_bias",)),
    Entry("post_attention_layernorm.weight", ("ln_2/scale",)),
    Entry("post_attention_layernorm.bias", ("ln_2/bias",)),
    Entry("mlp.dense_h_to_4h.weight", ("mlp/fc_kernel",), TRANSPOSED),
    Entry("mlp.dense_h_to_4h.bias", ("mlp/fc_bias",)),
    Entry("mlp.dense_4h_to_h.weight", ("mlp/proj_kernel",), TRANSPOSED),
    Entry("mlp.dense_4h_to_h.bias", ("mlp/proj_bias",)),
)
tokenizer_config = gpt2.tokenizer_config
"""GPT-2's special tokens: the 20B tokenizer's <|endoftext|> (id 0) as bos, eos and unk."""


def layout(config: NeoXConfig) -> tuple[tuple[Entry, ...], list[Stack]]:
    """(top-level entries, block stacks) of this config."""
    return TOP, [Stack("", HF_BLOCK_PREFIX, BLOCK, config.num_layers)]


def config_to_hf(config: NeoXConfig, eod_id: int | None) -> dict:
    """config.json contents for transformers' GPTNeoXConfig (HF sees the unpadded vocabulary)."""
    return {
        "model_type": HF_MODEL_TYPE,
        "architectures": ["GPTNeoXForCausalLM"],
        "vocab_size": config.vocab_size,
        "max_position_embeddings": config.max_len,
        "hidden_size": config.embed_dim,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "intermediate_size": config.mlp_dim,
        "hidden_act": "gelu",
        "rotary_pct": config.rotary_pct,
        "rotary_emb_base": config.rotary_base,
        "rope_parameters": {"rope_type": "default", "rope_theta": config.rotary_base,
                            "partial_rotary_factor": config.rotary_pct},
        "use_parallel_residual": config.use_parallel_residual,
        "layer_norm_eps": config.layer_norm_eps,
        "hidden_dropout": config.dropout_rate,
        "attention_dropout": config.attention_dropout_rate,
        "initializer_range": config.input_init_std,
        "attention_bias": True,
        "tie_word_embeddings": False,
        "bos_token_id": eod_id,
        "eos_token_id": eod_id,
        "torch_dtype": "float32",
    }


def config_from_hf(hf: dict, source: str, **choices) -> NeoXConfig:
    """Our config from a HF GPT-NeoX config.json (rotary settings in the 4.x keys or 5.x's
    rope_parameters); `choices` are ours alone (scan_layers, dtype, ...)."""
    rope, rope_type = mapping.rope_of(hf, source)
    unsupported = {
        "hidden_act": (hf.get("hidden_act", "gelu"), HF_GELU_EXACT),
        "attention_bias": (hf.get("attention_bias", True), (True,)),
        "tie_word_embeddings": (hf.get("tie_word_embeddings", False), (False,)),
        "rope_type": (rope_type, ("default",)),
    }
    for name, (value, allowed) in unsupported.items():
        if value not in allowed:
            raise UserError(f"{source}: {name}={value!r} is not supported by our GPT-NeoX (supported: {allowed}).")
    return NeoXConfig(
        vocab_size=hf["vocab_size"], max_len=hf["max_position_embeddings"], num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"], embed_dim=hf["hidden_size"], mlp_dim=hf["intermediate_size"],
        rotary_pct=rope.get("partial_rotary_factor", hf.get("rotary_pct", 0.25)),
        rotary_base=rope.get("rope_theta", hf.get("rotary_emb_base", 10000.0)),
        use_parallel_residual=hf.get("use_parallel_residual", True),
        layer_norm_eps=hf.get("layer_norm_eps", 1e-5), init_std=hf.get("initializer_range"),
        dropout_rate=hf.get("hidden_dropout", 0.0), attention_dropout_rate=hf.get("attention_dropout", 0.0),
        **choices)


# GPT-NeoX's own checkpoints: DeepSpeed's PipelineModule saves one file per layer and tensor-parallel
# rank, global_stepN/layer_XX-model_YY-model_states.pt, holding that layer's state_dict. Layer 0 is the
# word embedding, 1 a parameterless pre-transformer step, 2 .. L+1 the transformer layers, L+2 a
# parameterless post-transformer step, L+3 the final norm and L+4 the output layer. Tensor-parallel
# shards merge as NeoX's tools/ckpts converter merges them:
COLUMN_PARALLEL = ("attention.query_key_value.weight", "attention.query_key_value.bias",
                   "mlp.dense_h_to_4h.weight", "mlp.dense_h_to_4h.bias")
"""Split on the output dim: concatenated on dim 0 (as are the word embeddings and the output layer)."""
ROW_PARALLEL = ("attention.dense.weight", "mlp.dense_4h_to_h.weight")
"""Split on the input dim: concatenated on dim 1."""
ROW_PARALLEL_BIASES = ("attention.dense.bias", "mlp.dense_4h_to_h.bias")
"""Every rank holds one. With the parallel residual NeoX adds each rank's bias before the all-reduce
(the layer reduces attention + MLP once), so the model's bias is their sum (what NeoX's converter
takes); with the sequential residual each linear reduces first and adds one bias: rank 0's."""
NORMS = ("input_layernorm.weight", "input_layernorm.bias", "post_attention_layernorm.weight",
         "post_attention_layernorm.bias")
"""Replicated: the mean over ranks (equal copies)."""
NEOX_FILE = "layer_{:02d}-model_{:02d}-model_states.pt"


def add_import_command(commands) -> argparse.ArgumentParser:
    """`python -m t5x_like.convert from-neox SRC DST --preset=... [--tokenizer=...]` (convert/__main__.py adds the
    options every import shares and runs it through `run_import`)."""
    command = commands.add_parser("from-neox", help="GPT-NeoX pipeline checkpoint -> params-only checkpoint")
    command.add_argument("src", help="GPT-NeoX checkpoint directory (global_stepN) with "
                                     "layer_XX-model_YY-model_states.pt files")
    command.add_argument("dst", help="output MODEL_DIR (the checkpoint goes to DST/checkpoints/<step>)")
    command.add_argument("--preset", required=True, help="the checkpoint's model preset, e.g. neox_20b, pythia_1b")
    command.add_argument("--tokenizer", default=None,
                         help="tokenizer to record, e.g. .../gpt-neox-20b-tokenizer/20B_tokenizer.json")
    command.set_defaults(run_import=run_import)
    return command


def run_import(args: argparse.Namespace) -> str:
    """The from-neox command: the checkpoint's path."""
    config = preset_config(args.preset, scan_layers=args.scan_layers, vocab_pad_multiple=args.vocab_pad_multiple,
                           dtype=args.dtype)
    return from_neox(args.src, args.dst, config, tokenizer=args.tokenizer, step=args.step)


def preset_config(preset: str, **choices) -> NeoXConfig:
    """The config of a GPT-NeoX preset (e.g. 'neox_20b', 'pythia_1b') with our own choices (scan_layers, ...)."""
    config = models.config_from_dict({**configs.get_model_config(preset).to_dict(), **choices})
    if config.family != "neox":
        raise UserError(f"--preset={preset} is a {config.family} model; from-neox converts GPT-NeoX presets: "
                        f"{[p for p in configs.PRESETS if configs.get_model_config(p).family == 'neox']}.")
    return config


def from_neox(src: str, dst: str, config: NeoXConfig, *, tokenizer: str | None = None, step: int = 0) -> str:
    """Convert GPT-NeoX's pipeline checkpoint directory `src` (global_stepN) of the model `config`
    into a params-only checkpoint dst/checkpoints/<step>; returns its path. `tokenizer` (e.g.
    20B_tokenizer.json) is checked against the model and recorded."""
    if tokenizer:
        tokenizer = tokenizer_record(loading.open_tokenizer(tokenizer, config))
    tensors = neox_checkpoint_as_hf(src, config)
    flat = mapping.from_hf_tensors(tensors, config, *layout(config), src)
    params = jax.tree.map(jax.numpy.asarray, mapping.unflatten(flat))
    store.save_params(dst, step, params, {"config": dataclasses.asdict(config), "tokenizer": tokenizer})
    return os.path.join(dst, store.CHECKPOINT_SUBDIR, str(step))


def neox_checkpoint_as_hf(src: str, config: NeoXConfig) -> dict[str, np.ndarray]:
    """The merged float32 tensors of a NeoX pipeline checkpoint under Hugging Face's names (vocabulary
    rows trimmed to vocab_size)."""
    ranks = len(glob.glob(os.path.join(src, "layer_00-model_*-model_states.pt")))
    if not ranks:
        raise UserError(f"{src}: no {NEOX_FILE.format(0, 0)}; from-neox expects a GPT-NeoX checkpoint "
                                "directory (global_stepN) of per-layer files layer_XX-model_YY-model_states.pt.")
    layers = config.num_layers
    found = len({m.group(1) for m in (re.match(r"layer_(\d+)-model_00-", os.path.basename(f))
                                       for f in glob.glob(os.path.join(src, "layer_*-model_00-model_states.pt")))})
    if found != layers + 3:
        raise UserError(f"{src}: {found} layer files, but the model has {layers} transformer layers (expected "
                         f"{layers + 3} files: embedding, layers, final norm, output layer). Pick the preset of "
                         "this checkpoint.")

    def shards(layer: int) -> list[dict[str, np.ndarray]]:
        import torch

        files = [os.path.join(src, NEOX_FILE.format(layer, rank)) for rank in range(ranks)]
        return [{k: v.float().numpy() for k, v in torch.load(f, map_location="cpu", weights_only=True).items()}
                for f in files]

    def vocab_rows(table: np.ndarray, name: str) -> np.ndarray:
        if table.shape[0] < config.vocab_size or table.shape[1] != config.embed_dim:
            raise UserError(f"{src}: {name} is {list(table.shape)}, which does not fit vocab_size "
                             f"{config.vocab_size} x width {config.embed_dim}; pick the preset of this checkpoint.")
        return table[:config.vocab_size]

    tensors = {"gpt_neox.embed_in.weight": vocab_rows(
        np.concatenate([s["word_embeddings.weight"] for s in shards(0)]), "word_embeddings.weight")}
    for i in range(layers):
        prefix = HF_BLOCK_PREFIX.format(i)
        parts = shards(i + 2)
        for name in COLUMN_PARALLEL:
            tensors[prefix + name] = np.concatenate([s[name] for s in parts], axis=0)
        for name in ROW_PARALLEL:
            tensors[prefix + name] = np.concatenate([s[name] for s in parts], axis=1)
        for name in ROW_PARALLEL_BIASES:
            tensors[prefix + name] = sum(s[name] for s in parts) if config.use_parallel_residual else parts[0][name]
        for name in NORMS:
            tensors[prefix + name] = np.mean([s[name] for s in parts], axis=0)
    norm = shards(layers + 3)
    tensors["gpt_neox.final_layer_norm.weight"] = np.mean([s["norm.weight"] for s in norm], axis=0)
    tensors["gpt_neox.final_layer_norm.bias"] = np.mean([s["norm.bias"] for s in norm], axis=0)
    tensors["embed_out.weight"] = vocab_rows(
        np.concatenate([s["final_linear.weight"] for s in shards(layers + 4)]), "final_linear.weight")
    return tensors
