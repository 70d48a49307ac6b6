"""Tiny random transformers models and the tokenizers beside them, as the conversion, beam-search and BOS tests
build them: T5 (v1.0 and v1.1) with our config and parameters converted from it, the Llama-class decoders, and
GPT-NeoX's 20B tokenizer with a beginning-of-text token (read from ../shared/data, or the test skips).

Import it after `pytest.importorskip("transformers")` (and "torch" where the test needs torch): it imports
transformers, and the functions that build a model import torch."""
import jax
import jax.numpy as jnp
import transformers

from models.t5 import T5Config
from t5x_like.convert import mapping
from t5x_like.convert import t5 as t5_convert
from tests.support.shared_data import shared_file

# T5: odd sizes on purpose (tests/models/test_t5.py's docstring): d_kv 7 with 3 heads (inner 21) on width 24,
# 2 encoder and 3 decoder layers, 8 relative buckets up to distance 20.
HF_SIZES = dict(vocab_size=200, d_model=24, d_kv=7, d_ff=40, num_layers=2, num_decoder_layers=3, num_heads=3,
                relative_attention_num_buckets=8, relative_attention_max_distance=20, dropout_rate=0.0)
VERSIONS = {"v1.0": dict(feed_forward_proj="relu", tie_word_embeddings=True),
            "v1.1": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False)}


def random_hf_model(version: str, seed: int = 0, sizes: dict = HF_SIZES):
    """A T5ForConditionalGeneration whose every tensor (norms and relative biases too) is random;
    v1.1 gets its own lm_head. `sizes`: the T5Config's sizes (HF_SIZES unless given)."""
    import torch

    torch.manual_seed(seed)
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(**sizes, **VERSIONS[version]))
    if not VERSIONS[version]["tie_word_embeddings"]:
        model.lm_head.weight = torch.nn.Parameter(torch.empty_like(model.shared.weight))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return model.eval()


def our_config(hf_model) -> T5Config:
    """As from-hf reads it: the config file, then the weights (transformers 5 writes tie_word_embeddings: true
    for an lm_head of its own)."""
    config = t5_convert.config_from_hf(hf_model.config.to_dict(), "test", vocab_pad_multiple=64)
    return t5_convert.config_for_tensors(config, {n: p.detach().numpy() for n, p in hf_model.state_dict().items()})


def params_from_hf(hf_model, config):
    tensors = {n: p.detach().numpy().copy() for n, p in hf_model.state_dict().items()}
    flat = mapping.from_hf_tensors(tensors, config, *t5_convert.layout(config), "test")
    return jax.tree.map(jnp.asarray, mapping.unflatten(flat))


def hf_and_ours_for(version):
    model = random_hf_model(version)
    config = our_config(model)
    return model, config, params_from_hf(model, config)


# Llama-class decoders (tests/t5x_like/convert/test_llama.py).
VOCAB = 1000
SHAPE = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=88, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=128, rms_norm_eps=1e-6, attention_dropout=0.0)
VARIANTS = {
    "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM, dict(rope_theta=10000.0)),
    "llama3.1": (transformers.LlamaConfig, transformers.LlamaForCausalLM, dict(rope_scaling=dict(
        rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
        original_max_position_embeddings=32))),
    "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM, dict(tie_word_embeddings=True,
                                                                             rope_theta=1e6)),
    "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM, dict(sliding_window=8)),
}


# Qwen3 (tests/t5x_like/convert/test_qwen3.py): heads wider than the width / heads (4 x 24 or 4 x 32 on 64).
QWEN3_VARIANTS = {
    "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, dict(head_dim=24, rope_theta=1e6)),
    "qwen3-tied": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM, dict(head_dim=32, rope_theta=1e6,
                                                                                 tie_word_embeddings=True)),
}


def random_model(variant: str, scale: float = 0.3, seed: int = 0, **shape):
    """A transformers model of `variant` (VARIANTS or QWEN3_VARIANTS) with every tensor perturbed by `scale`
    (spread logits: no near-ties)."""
    import torch

    config_class, model_class, options = {**VARIANTS, **QWEN3_VARIANTS}[variant]
    torch.manual_seed(seed)
    model = model_class(config_class(**{**SHAPE, **shape}, **options)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)
    return model


def hf_logits(model, tokens):
    """A transformers model's logits on int tokens [batch, length], as numpy."""
    import torch

    with torch.no_grad():
        return model(torch.tensor(tokens)).logits.numpy()


def bos_tokenizer(folder):
    """GPT-NeoX's 20B tokenizer with a beginning-of-text token its post-processor puts first, as Llama's
    tokenizer.json does, saved into `folder` as transformers saves a tokenizer; returns it (transformers').
    Skips the calling test when ../shared/data has no GPT-NeoX tokenizer."""
    import tokenizers

    tokenizer = tokenizers.Tokenizer.from_file(str(shared_file("gpt-neox-20b-tokenizer", "20B_tokenizer.json")))
    tokenizer.add_special_tokens(["<s>"])
    tokenizer.post_processor = tokenizers.processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tokenizer.token_to_id("<s>"))])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>",
                                                eos_token="<|endoftext|>")
    fast.save_pretrained(folder)
    return fast
