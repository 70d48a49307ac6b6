"""CPM-2 <-> ModelCenter's own folders (config.json with CPM2Config's fields, pytorch_model.pt in float16,
vocab.txt), and CPM-2 -> a Hugging Face T5 folder.

    python -m t5x_like.convert from-modelcenter SRC DST     ModelCenter cpm2 folder -> DST/checkpoints/<step>
    python -m t5x_like.convert to-modelcenter CKPT OUT      MODEL_DIR or step dir -> OUT/{config.json,
                                                            pytorch_model.pt, vocab.txt}

ModelCenter's names are transformers' T5 names renamed (its transfer/hugFLANT5_bmtrainFLANT5.py): its linear
weights are [out, in] as transformers', so T5's transforms (convert/t5.py) serve. The conversion is streamed:
pytorch_model.pt is memory-mapped and each tensor becomes float32 only as it is converted (from-modelcenter);
each of ours becomes float16 as it is written (to-modelcenter): besides the float32 parameters, one tensor at a
time is held twice. float16 -> float32 -> float16 gives back the same bits.

Hugging Face has no CPM-2 model type: to-hf writes a T5ForConditionalGeneration whose feed_forward_proj is
'gated-gelu_python' (transformers' exact GELU), which transformers loads with CPM-2's logits; from-hf reads a
folder whose config.json says model_type 'cpm2' (the ModelCenter import is the usual way in).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os

import jax
import numpy as np

from models.cpm2 import CPM2Config
from t5x_like.checkpoint import store
from t5x_like.convert import mapping, t5
from t5x_like.convert.mapping import Entry, Stack
from t5x_like.convert.t5 import HEADS_IN, HEADS_OUT, TRANSPOSED
from t5x_like.errors import UserError, note
from t5x_like.inference import loading

HF_MODEL_TYPE = "cpm2"
TIED = {}
HF_FEED_FORWARD = "gated-gelu_python"
"""transformers' T5 with the exact GELU in its gated MLP ('gated-gelu' is the tanh approximation)."""
WEIGHTS, CONFIG, VOCAB = "pytorch_model.pt", "config.json", "vocab.txt"
FIXED = {"pos_bias_type": "relative", "norm_bias": False, "att_bias": False, "ffn_bias": False,
         "ffn_activate_fn": "gated_gelu", "proj_bias": False, "length_scale": False, "attn_scale": False,
         "cls_head": None, "post_layer_norm": False, "int8": False}
"""CPM2Config fields whose other values make another model than CPM-2 (ModelCenter's defaults)."""


def layout(config: CPM2Config):
    """Hugging Face's T5 layout (to-hf, to-torch)."""
    return t5.layout(config)


def config_to_hf(config: CPM2Config, eod_id: int | None) -> dict:
    return {**t5.config_to_hf(config, eod_id), "feed_forward_proj": HF_FEED_FORWARD,
            "decoder_start_token_id": config.decoder_start_ids()[0]}


def config_from_hf(hf_config: dict, source: str, **choices) -> CPM2Config:
    ours = t5.config_from_hf({**hf_config, "feed_forward_proj": "gated-gelu"}, source)
    fields = {f.name: getattr(ours, f.name) for f in dataclasses.fields(ours) if f.name != "family"}
    return CPM2Config(**{**fields, "vocab_size": hf_config["vocab_size"], **choices})


def tokenizer_config(config: CPM2Config, tokenizer) -> dict:
    return {}


# -- ModelCenter's layout
def _attention(prefix: str, ours: str) -> tuple[Entry, ...]:
    return tuple(Entry(f"{prefix}.{theirs}.weight", (f"{ours}/{o}_kernel",), HEADS_IN if o == "out" else HEADS_OUT)
                 for theirs, o in (("project_q", "query"), ("project_k", "key"), ("project_v", "value"),
                                   ("attention_out", "out")))


def _mlp() -> tuple[Entry, ...]:
    return tuple(Entry(f"ffn.ffn.{theirs}.weight", (f"mlp/{o}_kernel",), TRANSPOSED)
                 for theirs, o in (("w_in.w_0", "gate"), ("w_in.w_1", "fc"), ("w_out", "proj")))


def modelcenter_layout(config: CPM2Config) -> tuple[tuple[Entry, ...], list[Stack]]:
    """(top-level entries, [encoder, decoder]) with ModelCenter's CPM2 names."""
    top = (Entry("input_embedding.weight", ("token_embedder/embedding",), mapping.VOCAB_ROWS),
           Entry("position_bias_enc.relative_attention_bias", ("encoder/relpos_bias/embedding",)),
           Entry("position_bias_dec.relative_attention_bias", ("decoder/relpos_bias/embedding",)),
           Entry("encoder.output_layernorm.weight", ("encoder/final_norm/scale",)),
           Entry("decoder.output_layernorm.weight", ("decoder/final_norm/scale",)))
    if not config.tie_word_embeddings:
        top += (Entry("output_projection.weight", ("lm_head/embedding",), mapping.VOCAB_ROWS),)
    norm = "self_att.layernorm_before_attention.weight"
    encoder = (Entry(norm, ("pre_attention_norm/scale",)), *_attention("self_att.self_attention", "attention"),
               Entry("ffn.layernorm_before_ffn.weight", ("pre_mlp_norm/scale",)), *_mlp())
    decoder = (Entry(norm, ("pre_self_attention_norm/scale",)),
               *_attention("self_att.self_attention", "self_attention"),
               Entry("cross_att.layernorm_before_attention.weight", ("pre_cross_attention_norm/scale",)),
               *_attention("cross_att.self_attention", "cross_attention"),
               Entry("ffn.layernorm_before_ffn.weight", ("pre_mlp_norm/scale",)), *_mlp())
    return top, [Stack("encoder/", "encoder.layers.{}.", encoder, config.num_layers),
                 Stack("decoder/", "decoder.layers.{}.", decoder, config.num_decoder_layers)]


def config_from_modelcenter(values: dict, source: str, **choices) -> CPM2Config:
    """Our config from ModelCenter's CPM2Config fields (its defaults where the file leaves one out)."""
    for name, value in FIXED.items():
        if values.get(name, value) != value:
            raise UserError(f"{source}: {name}={values[name]!r}; CPM-2 has {name}={value!r} (another value makes "
                            "another model, which from-modelcenter does not convert).")
    try:
        return CPM2Config(
            vocab_size=values.get("vocab_size", 26240), embed_dim=values.get("dim_model", 768),
            num_heads=values.get("num_heads", 12), d_kv=values.get("dim_head", 64), mlp_dim=values.get("dim_ff", 1920),
            num_layers=values.get("num_encoder_layers", 12), num_decoder_layers=values.get("num_decoder_layers", 12),
            dropout_rate=values.get("dropout_p", 0.0), layer_norm_eps=values.get("norm_eps", 1e-6),
            relative_attention_num_buckets=values.get("position_bias_num_buckets", 32),
            relative_attention_max_distance=values.get("position_bias_max_distance", 128),
            tie_word_embeddings=values.get("tied", False), **choices)
    except (TypeError, ValueError) as e:
        raise UserError(f"{source}: its values describe no CPM-2 we can build ({e}); repair config.json.") from None


def config_to_modelcenter(config: CPM2Config) -> dict:
    return {"vocab_size": config.vocab_size, "dim_model": config.embed_dim, "num_heads": config.num_heads,
            "dim_head": config.d_kv, "dim_ff": config.mlp_dim, "num_encoder_layers": config.num_layers,
            "num_decoder_layers": config.num_decoder_layers, "dropout_p": config.dropout_rate,
            "position_bias_num_buckets": config.relative_attention_num_buckets,
            "position_bias_max_distance": config.relative_attention_max_distance, "norm_eps": config.layer_norm_eps,
            "half": True, "tied": config.tie_word_embeddings, **FIXED}


class _Float32WhenTaken(dict):
    """A memory-mapped state_dict whose tensors become float32 numpy arrays one at a time, as they are taken."""

    def pop(self, name, *default):
        return super().pop(name, *default).float().numpy()


def read_modelcenter(src: str, choices: dict) -> tuple[CPM2Config, dict]:
    import torch

    paths = {name: os.path.join(src, name) for name in (CONFIG, WEIGHTS)}
    for path in paths.values():
        if not os.path.isfile(path):
            raise UserError(f"{path} does not exist; from-modelcenter expects ModelCenter's cpm2 folder "
                            f"({CONFIG}, {WEIGHTS}, and {VOCAB} for the tokenizer).")
    try:
        with open(paths[CONFIG], encoding="utf-8") as f:
            config = config_from_modelcenter(json.load(f), paths[CONFIG], **choices)
        state = torch.load(paths[WEIGHTS], map_location="cpu", mmap=True, weights_only=True)
    except (json.JSONDecodeError, UnicodeDecodeError, RuntimeError, OSError) as e:
        raise UserError(f"{src}: not a readable ModelCenter checkpoint ({type(e).__name__}: {e}).") from None
    return config, _Float32WhenTaken(state)


def from_modelcenter(src: str, dst: str, *, step: int = 0, **choices) -> str:
    """ModelCenter's CPM-2 folder `src` -> a params-only checkpoint dst/checkpoints/<step>, recording the
    folder's vocab.txt as the tokenizer (CPM-2's); returns the checkpoint's path."""
    from t5x_like.convert import hf  # not at import: hf discovers this module among the converters

    config, tensors = read_modelcenter(src, choices)
    tokenizer = hf.hf_tokenizer_record(src, config) if os.path.isfile(os.path.join(src, VOCAB)) else None
    flat = mapping.from_hf_tensors(tensors, config, *modelcenter_layout(config), src)
    if tensors:
        raise UserError(f"{src}: {WEIGHTS} holds tensors a CPM-2 of its config.json has not ({sorted(tensors)[:3]}); "
                        "is this a CPM-2 checkpoint?")
    params = jax.tree.map(jax.numpy.asarray, mapping.unflatten(flat))
    del flat
    store.save_params(dst, step, params, {"config": dataclasses.asdict(config), "tokenizer": tokenizer})
    if tokenizer is None:
        hf.note_no_tokenizer(src, VOCAB)
    return os.path.join(dst, store.CHECKPOINT_SUBDIR, str(step))


def to_modelcenter(src: str, out: str, tokenizer: str | None = None) -> list[str]:
    """Our CPM-2 checkpoint -> out/{config.json, pytorch_model.pt (float16), vocab.txt}; returns the files. The
    vocab.txt is `tokenizer`'s (--tokenizer), else the recorded tokenizer's; decided before anything is written."""
    import torch

    from t5x_like.convert import hf  # not at import: hf discovers this module among the converters

    config, recorded = loading.read_config(src)
    if config.family != "cpm2":
        raise UserError(f"{src} holds a {config.family} model; to-modelcenter writes CPM-2 checkpoints "
                        "(use to-hf for the others).")
    vocab = modelcenter_vocab(src, config, recorded, tokenizer)
    flat = mapping.flatten(hf.restore_on_host(src, config))
    state = {name: torch.from_numpy(np.array(array, np.float32)).to(torch.float16)
             for name, array in mapping.to_hf_tensors(flat, config, *modelcenter_layout(config))}
    os.makedirs(out, exist_ok=True)
    torch.save(state, os.path.join(out, WEIGHTS))
    del state
    hf.write_json(os.path.join(out, CONFIG), config_to_modelcenter(config))
    if vocab is None:
        note(f"no {VOCAB} written: {src} records no tokenizer; add --tokenizer=PATH/{VOCAB} (the CPM-2 vocabulary "
             "the model's ids follow) for ModelCenter's CPM2Tokenizer.")
        return [CONFIG, WEIGHTS]
    with open(os.path.join(out, VOCAB), "wb") as f:
        f.write(vocab)
    return [CONFIG, WEIGHTS, VOCAB]


def modelcenter_vocab(src: str, config: CPM2Config, recorded, override: str | None) -> bytes | None:
    """The vocab.txt to-modelcenter writes: --tokenizer's, else the recorded tokenizer's (None: none recorded). A
    tokenizer that is not a CPM-2 vocab.txt is refused: ModelCenter's CPM2Tokenizer reads only that."""
    if override is None and not recorded:
        return None
    tokenizer = loading.checkpoint_tokenizer(src, config, override)
    files = tokenizer.hf_files()
    if VOCAB in files:
        return files[VOCAB]
    if override:
        raise UserError(f"--tokenizer={override} is not a CPM-2 {VOCAB}; ModelCenter's CPM2Tokenizer reads only that: "
                        f"give the CPM-2 {VOCAB} the model's ids follow.")
    raise UserError(f"{src} records a tokenizer that is not a CPM-2 {VOCAB} ({recorded}; e.g. the builtin corpus's "
                    f"BPE), and ModelCenter's CPM2Tokenizer reads only that, so this model's ids cannot go to "
                    f"ModelCenter with their meaning: export it with to-hf (which writes its tokenizer), or pass "
                    f"--tokenizer=PATH/{VOCAB} if its ids do follow a CPM-2 vocabulary.")


def add_import_command(commands) -> argparse.ArgumentParser:
    """`from-modelcenter SRC DST` (convert/__main__.py adds the options every import shares)."""
    command = commands.add_parser("from-modelcenter", help="ModelCenter CPM-2 folder -> params-only checkpoint")
    command.add_argument("src", help=f"ModelCenter's cpm2 folder: {CONFIG}, {WEIGHTS} (and {VOCAB})")
    command.add_argument("dst", help="output MODEL_DIR (the checkpoint goes to DST/checkpoints/<step>)")
    command.set_defaults(run_import=lambda args: from_modelcenter(
        args.src, args.dst, step=args.step, scan_layers=args.scan_layers, vocab_pad_multiple=args.vocab_pad_multiple,
        dtype=args.dtype))
    return command


def add_export_command(commands) -> argparse.ArgumentParser:
    """`to-modelcenter CKPT OUT`."""
    command = commands.add_parser("to-modelcenter", help="CPM-2 checkpoint -> ModelCenter folder")
    command.add_argument("src", help="MODEL_DIR (latest step) or a step directory of a CPM-2 model")
    command.add_argument("dst", help=f"output folder ({CONFIG}, {WEIGHTS} in float16, {VOCAB})")
    command.add_argument("--tokenizer", default=None,
                         help=f"the CPM-2 {VOCAB} to write (default: the one the checkpoint records)")
    command.set_defaults(run_export=lambda args: f"{args.dst} "
                                                 f"({', '.join(to_modelcenter(args.src, args.dst, args.tokenizer))})")
    return command
