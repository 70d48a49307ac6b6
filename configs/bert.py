"""BERT and RoBERTa model presets (ml_collections) with the published shapes (transformers'
bert-base-uncased, bert-large-cased, bert-base-chinese, roberta-base, roberta-large configs).

    bert_base, bert_large                    uncased WordPiece vocabulary (30522 ids)
    bert_base_cased, bert_large_cased        cased vocabulary (28996 ids)
    bert_base_chinese                        Chinese character vocabulary (21128 ids)
    roberta_base, roberta_large              GPT-2 byte-level BPE (50265 ids), 514 positions (2 offset)
    bert_tiny                                the CPU quickstart: 4 layers, 256 wide, 4 heads, over the
                                             builtin corpus's 8192-id tokenizer + [CLS], [SEP], [MASK]
                                             (8195), 256 positions

All have the masked-LM head; fine-tuning sets model_config.overrides={'head': 'classification',
'num_labels': N}.
"""
import ml_collections

from configs.errors import PresetError

UNCASED, CASED, CHINESE, ROBERTA = 30522, 28996, 21128, 50265
TINY = 8192 + 3
"""The builtin corpus's BPE plus the [CLS], [SEP] and [MASK] ids masked-LM training adds above it."""

_SIZES = {
    #                      family     layers heads embed  mlp   vocab    positions
    "bert_tiny": ("bert", 4, 4, 256, 1024, TINY, 256),
    "bert_base": ("bert", 12, 12, 768, 3072, UNCASED, 512),
    "bert_base_cased": ("bert", 12, 12, 768, 3072, CASED, 512),
    "bert_base_chinese": ("bert", 12, 12, 768, 3072, CHINESE, 512),
    "bert_large": ("bert", 24, 16, 1024, 4096, UNCASED, 512),
    "bert_large_cased": ("bert", 24, 16, 1024, 4096, CASED, 512),
    "roberta_base": ("roberta", 12, 12, 768, 3072, ROBERTA, 514),
    "roberta_large": ("roberta", 24, 16, 1024, 4096, ROBERTA, 514),
}

PRESETS = tuple(_SIZES)


def preset(name: str) -> ml_collections.ConfigDict:
    """The preset of this name (see PRESETS)."""
    if name not in _SIZES:
        raise PresetError(f"BERT / RoBERTa preset {name!r} is unknown; choose one of {PRESETS}.")
    family, num_layers, num_heads, embed_dim, mlp_dim, vocab_size, max_len = _SIZES[name]
    values = dict(family=family, vocab_size=vocab_size, max_len=max_len, num_layers=num_layers, num_heads=num_heads,
                  embed_dim=embed_dim, mlp_dim=mlp_dim, dropout_rate=0.1, attention_dropout_rate=0.1, init_std=0.02)
    if family == "roberta":
        values.update(type_vocab_size=1, position_offset=2, pad_token_id=1, layer_norm_eps=1e-5)
    else:
        values.update(type_vocab_size=2, position_offset=0, pad_token_id=0, layer_norm_eps=1e-12)
    return ml_collections.ConfigDict(values)
