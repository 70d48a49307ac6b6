"""Llama-class decoders <-> Hugging Face `LlamaForCausalLM`, `MistralForCausalLM` and `Qwen2ForCausalLM`:
a name map plus a few transforms. A config with a sliding window exports as Mistral, one with query/key/value
biases as Qwen2, the rest as Llama; all three import.

HF stores torch Linear weights [out, in]; ours are [in, out], per head where there are heads:
  - q_proj [heads * head_dim, embed] is our query_kernel [embed, heads, head_dim] (k_proj, v_proj: key/value
    heads); Qwen2's biases [heads * head_dim] are ours [heads, head_dim];
  - o_proj [embed, heads * head_dim] is our out_kernel [heads, head_dim, embed];
  - the MLP's gate_proj / up_proj / down_proj are our gate / fc / proj kernels transposed;
  - both vocabulary tables (`model.embed_tokens`, `lm_head`) have padded_vocab_size rows here and exactly
    vocab_size rows in HF; padding rows come back as zeros on import. A tied head has no `lm_head` tensor.
transformers' rotate-half rotary layout is ours (models.layers.Rotary): no permutation of q/k.
"""
from __future__ import annotations

from t5x_like.convert import gpt2, mapping, neox
from t5x_like.convert.mapping import VOCAB_ROWS, Entry, Stack, Transform
from t5x_like.errors import UserError
from models.llama import LlamaConfig

HF_MODEL_TYPE = "llama"
HF_MODEL_TYPES = ("llama", "mistral", "qwen2")
"""The model types from-hf takes (config_to_hf writes the one a config needs)."""
HF_BLOCK_PREFIX = "model.layers.{}."
TIED: dict[str, str] = {}
"""Untied by default; tied(config) names the tied head."""
BASE_MODEL_PREFIX = "model"
UNUSED_HF_TENSORS = {r"model\.(layers\.\d+\.self_attn\.)?rotary_emb\.inv_freq": ""}
"""The rotary inverse frequencies older transformers saved (a buffer it recomputes)."""
ROPE_TYPES = ("default", "llama3")
"""The rotary types we take (models.llama.Llama3Rotary is 'llama3')."""

HEADS_OUT = Transform(lambda ours, c: ours[0].reshape(ours[0].shape[0], -1).T,
                      lambda theirs, c: [theirs.T.reshape(theirs.shape[1], -1, c.head_dim)])
HEAD_BIAS = Transform(lambda ours, c: ours[0].reshape(-1), lambda theirs, c: [theirs.reshape(-1, c.head_dim)])
HEADS_IN = Transform(lambda ours, c: ours[0].reshape(-1, ours[0].shape[-1]).T,
                     lambda theirs, c: [theirs.T.reshape(-1, c.head_dim, theirs.shape[0])])
BLOCK = (
    Entry("input_layernorm.weight", ("ln_1/scale",)),
    *(Entry(f"self_attn.{p}_proj.weight", (f"attn/{ours}_kernel",), HEADS_OUT)
      for p, ours in (("q", "query"), ("k", "key"), ("v", "value"))),
    Entry("self_attn.o_proj.weight", ("attn/out_kernel",), HEADS_IN),
    Entry("post_attention_layernorm.weight", ("ln_2/scale",)),
    Entry("mlp.gate_proj.weight", ("mlp/gate_kernel",), neox.TRANSPOSED),
    Entry("mlp.up_proj.weight", ("mlp/fc_kernel",), neox.TRANSPOSED),
    Entry("mlp.down_proj.weight", ("mlp/proj_kernel",), neox.TRANSPOSED),
)
QKV_BIASES = tuple(Entry(f"self_attn.{p}_proj.bias", (f"attn/{ours}_bias",), HEAD_BIAS)
                   for p, ours in (("q", "query"), ("k", "key"), ("v", "value")))
tokenizer_config = gpt2.tokenizer_config
"""The end-of-document token as bos, eos and unk (a folder's own tokenizer_config.json is copied over it)."""


def layout(config: LlamaConfig) -> tuple[tuple[Entry, ...], list[Stack]]:
    """(top-level entries, block stacks) of this config."""
    top = (Entry("model.embed_tokens.weight", ("embed_in/embedding",), VOCAB_ROWS),
           Entry("model.norm.weight", ("ln_f/scale",)))
    if not config.tie_word_embeddings:
        top += (Entry("lm_head.weight", ("embed_out/embedding",), VOCAB_ROWS),)
    block = BLOCK + (QKV_BIASES if config.qkv_bias else ())
    return top, [Stack("", HF_BLOCK_PREFIX, block, config.num_layers)]


def tied(config: LlamaConfig) -> dict[str, str]:
    return {"lm_head.weight": "model.embed_tokens.weight"} if config.tie_word_embeddings else {}


def hf_model_type(config: LlamaConfig) -> str:
    """Qwen2 with query/key/value biases, Mistral with a sliding window (never both: LlamaConfig refuses that)."""
    return "qwen2" if config.qkv_bias else "mistral" if config.sliding_window else "llama"


def rope_parameters(config: LlamaConfig) -> dict:
    if config.rope_scaling_factor is None:
        return {"rope_type": "default", "rope_theta": config.rope_theta}
    return {"rope_type": "llama3", "rope_theta": config.rope_theta, "factor": config.rope_scaling_factor,
            "low_freq_factor": config.rope_low_freq_factor, "high_freq_factor": config.rope_high_freq_factor,
            "original_max_position_embeddings": config.rope_original_max_len}


def config_to_hf(config: LlamaConfig, eod_id: int | None) -> dict:
    """config.json contents for transformers' LlamaConfig / MistralConfig / Qwen2Config (unpadded vocabulary)."""
    model_type = hf_model_type(config)
    hf = {
        "model_type": model_type,
        "architectures": [{"llama": "Llama", "mistral": "Mistral", "qwen2": "Qwen2"}[model_type] + "ForCausalLM"],
        "vocab_size": config.vocab_size,
        "hidden_size": config.embed_dim,
        "intermediate_size": config.mlp_dim,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "num_key_value_heads": config.num_kv_heads,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_len,
        "rms_norm_eps": config.layer_norm_eps,
        "rope_theta": config.rope_theta,
        "rope_parameters": rope_parameters(config),
        "initializer_range": config.init_std,
        "attention_dropout": config.attention_dropout_rate,
        "tie_word_embeddings": config.tie_word_embeddings,
        "bos_token_id": eod_id,
        "eos_token_id": eod_id,
        "torch_dtype": "float32",
    }
    if model_type == "llama":
        hf.update(attention_bias=False, mlp_bias=False)
    if model_type == "mistral":
        hf["sliding_window"] = config.sliding_window
    if model_type == "qwen2":
        hf.update(use_sliding_window=False, sliding_window=None)
    return hf


def checked_heads(hf: dict, source: str) -> int:
    heads = hf["num_attention_heads"]
    if isinstance(heads, bool) or not isinstance(heads, int) or heads < 1:
        raise UserError(f"{source}: num_attention_heads={heads!r} must be a positive integer; re-download or repair "
                        "the model's config.json.")
    return heads


def refuse_unsupported(source: str, model_type: str, unsupported: dict) -> None:
    """`unsupported`: {HF option: (its value, the values we take)}; one line names the first we do not take."""
    for name, (value, allowed) in unsupported.items():
        if value not in allowed:
            raise UserError(f"{source}: {name}={value!r} is not supported by our {model_type} (supported: {allowed}).")


def shared_fields(hf: dict, rope: dict, rope_type: str) -> dict:
    """Our LlamaConfig fields that every Llama-class config.json gives alike (sizes, rotary, norms, tying)."""
    scaling = {} if rope_type == "default" else dict(
        rope_scaling_factor=rope["factor"], rope_low_freq_factor=rope["low_freq_factor"],
        rope_high_freq_factor=rope["high_freq_factor"],
        rope_original_max_len=rope["original_max_position_embeddings"])
    return dict(
        vocab_size=hf["vocab_size"], max_len=hf["max_position_embeddings"], num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"], num_key_value_heads=hf.get("num_key_value_heads"),
        embed_dim=hf["hidden_size"], mlp_dim=hf["intermediate_size"],
        rope_theta=rope.get("rope_theta", hf.get("rope_theta", 10000.0)), **scaling,
        tie_word_embeddings=hf.get("tie_word_embeddings", False), layer_norm_eps=hf.get("rms_norm_eps", 1e-6),
        init_std=hf.get("initializer_range", 0.02), attention_dropout_rate=hf.get("attention_dropout", 0.0))


def config_from_hf(hf: dict, source: str, **choices) -> LlamaConfig:
    """Our config from a HF Llama / Mistral / Qwen2 config.json (rotary settings in 4.x's rope_theta and
    rope_scaling or 5.x's rope_parameters); `choices` are ours alone (scan_layers, dtype, ...)."""
    model_type = hf["model_type"]
    heads = checked_heads(hf, source)
    rope, rope_type = mapping.rope_of(hf, source)
    unsupported = {
        "hidden_act": (hf.get("hidden_act", "silu"), ("silu",)),
        "attention_bias": (hf.get("attention_bias", False), (False,)),
        "mlp_bias": (hf.get("mlp_bias", False), (False,)),
        "rope_type": (rope_type, ROPE_TYPES),
        "use_sliding_window": (hf.get("use_sliding_window", False) if model_type == "qwen2" else False, (False,)),
    }
    width = hf["hidden_size"]
    if hf.get("head_dim") not in (None, width // heads) or width % heads:
        raise UserError(f"{source}: head_dim={hf.get('head_dim')}, hidden_size={width}, num_attention_heads={heads}: "
                        "our llama needs heads of hidden_size / num_attention_heads, a whole number; re-download or "
                        "repair the model's config.json.")
    refuse_unsupported(source, model_type, unsupported)
    window = hf.get("sliding_window") if model_type == "mistral" else None
    return LlamaConfig(**shared_fields(hf, rope, rope_type), sliding_window=window, qkv_bias=model_type == "qwen2",
                       **choices)
