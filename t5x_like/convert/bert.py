"""BERT / RoBERTa <-> Hugging Face `BertForMaskedLM`, `BertForSequenceClassification`,
`RobertaForMaskedLM`, `RobertaForSequenceClassification`: a name map plus four transforms.

What differs from ours:
  - HF linear weights are [out, in]; ours are [in, out], with the attention heads split out:
    q/k/v [embed, heads, head_dim] <-> [embed, embed] (+ biases [heads, head_dim] <-> [embed]), the
    attention output [heads, head_dim, embed] <-> [embed, embed];
  - our word embeddings and the MLM output bias have padded_vocab_size rows; HF gets exactly
    vocab_size and the padding rows come back as zeros (they never take probability);
  - the MLM output is tied to the word embeddings on both sides (`cls.predictions.decoder` /
    `lm_head.decoder` share `word_embeddings` and the head's `bias`);
  - BERT's pooler + classifier and RoBERTa's classification head (dense + out_proj) are both our
    `classifier_head/{pooler, classifier}`.
Which head a Hugging Face directory has comes from its config's `architectures`.
RoBERTa's converter module (t5x_like/convert/roberta.py) is this one with its own names.
"""
from __future__ import annotations

import numpy as np

from models.bert import BertConfig, RobertaConfig
from t5x_like.convert.mapping import VOCAB_ROWS, Entry, Stack, Transform
from t5x_like.errors import UserError

HF_MODEL_TYPE = "bert"
TIED = {"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
        "cls.predictions.decoder.bias": "cls.predictions.bias"}
"""HF names that share another tensor (the MLM head's): written by to-torch, omitted by to-hf."""
BASE_MODEL_PREFIX = "bert"
UNUSED_HF_TENSORS = {
    r"(bert|roberta)\.embeddings\.position_ids": "",
    r"(bert|roberta)\.pooler\.dense\.(weight|bias)": "the pretraining pooler (a masked-LM model has none; a "
                                                       "classification run from this checkpoint starts its own)",
    r"cls\.seq_relationship\.(weight|bias)": "the next-sentence head (pretraining here is masked-LM only)"}
"""The position-id buffer older transformers saved, and BertForPreTraining's parts a masked-LM model has no place
for (the pooler is read by a classification head's layout)."""


TRANSPOSED = Transform(lambda ours, c: ours[0].T, lambda theirs, c: [theirs.T])
HEADS_OUT = Transform(lambda ours, c: ours[0].reshape(c.embed_dim, -1).T,
                      lambda theirs, c: [theirs.T.reshape(c.embed_dim, c.num_heads, c.head_dim)])
HEADS_BIAS = Transform(lambda ours, c: ours[0].reshape(-1),
                       lambda theirs, c: [theirs.reshape(c.num_heads, c.head_dim)])
HEADS_IN = Transform(lambda ours, c: ours[0].reshape(-1, c.embed_dim).T,
                     lambda theirs, c: [theirs.T.reshape(c.num_heads, c.head_dim, c.embed_dim)])


class Names:
    """One family's Hugging Face names: the model prefix, its MLM head and its classification head."""

    def __init__(self, model_type: str, prefix: str, mlm: dict[str, str], classification: dict[str, str],
                 architectures: tuple[str, str]):
        self.model_type, self.prefix = model_type, prefix
        self.mlm, self.classification, self.architectures = mlm, classification, architectures


BERT_NAMES = Names(
    "bert", "bert.",
    mlm={"bias": "cls.predictions.bias", "dense": "cls.predictions.transform.dense",
         "norm": "cls.predictions.transform.LayerNorm"},
    classification={"pooler": "bert.pooler.dense", "classifier": "classifier"},
    architectures=("BertForMaskedLM", "BertForSequenceClassification"))
ROBERTA_NAMES = Names(
    "roberta", "roberta.",
    mlm={"bias": "lm_head.bias", "dense": "lm_head.dense", "norm": "lm_head.layer_norm"},
    classification={"pooler": "classifier.dense", "classifier": "classifier.out_proj"},
    architectures=("RobertaForMaskedLM", "RobertaForSequenceClassification"))


def linear(hf: str, ours: str) -> tuple[Entry, Entry]:
    return Entry(f"{hf}.weight", (f"{ours}/kernel",), TRANSPOSED), Entry(f"{hf}.bias", (f"{ours}/bias",))


def layer_norm(hf: str, ours: str) -> tuple[Entry, Entry]:
    return Entry(f"{hf}.weight", (f"{ours}/scale",)), Entry(f"{hf}.bias", (f"{ours}/bias",))


BLOCK = (
    *(entry for h, o in (("query", "query"), ("key", "key"), ("value", "value"))
      for entry in (Entry(f"attention.self.{h}.weight", (f"attention/{o}_kernel",), HEADS_OUT),
                    Entry(f"attention.self.{h}.bias", (f"attention/{o}_bias",), HEADS_BIAS))),
    Entry("attention.output.dense.weight", ("attention/out_kernel",), HEADS_IN),
    Entry("attention.output.dense.bias", ("attention/out_bias",)),
    *layer_norm("attention.output.LayerNorm", "attention_norm"),
    Entry("intermediate.dense.weight", ("mlp/fc_kernel",), TRANSPOSED),
    Entry("intermediate.dense.bias", ("mlp/fc_bias",)),
    Entry("output.dense.weight", ("mlp/proj_kernel",), TRANSPOSED),
    Entry("output.dense.bias", ("mlp/proj_bias",)),
    *layer_norm("output.LayerNorm", "mlp_norm"),
)


def renamed_tensors(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The checkpoint's tensors under today's names: Google's original BERT weights, as published on
    the Hub (bert-base-uncased's own model.safetensors), call the LayerNorm parameters `gamma` and
    `beta`, which transformers renames to `weight` and `bias` when it loads them."""
    legacy = {".LayerNorm.gamma": ".LayerNorm.weight", ".LayerNorm.beta": ".LayerNorm.bias"}
    renamed = {}
    for name, tensor in tensors.items():
        old = next((suffix for suffix in legacy if name.endswith(suffix)), None)
        renamed[name[:-len(old)] + legacy[old] if old else name] = tensor
    return renamed


def names_for(config: BertConfig) -> Names:
    return ROBERTA_NAMES if config.family == "roberta" else BERT_NAMES


def layout_with(names: Names, config: BertConfig) -> tuple[tuple[Entry, ...], list[Stack]]:
    p = names.prefix
    top = (
        Entry(f"{p}embeddings.word_embeddings.weight", ("embeddings/word/embedding",), VOCAB_ROWS),
        Entry(f"{p}embeddings.position_embeddings.weight", ("embeddings/position/embedding",)),
        Entry(f"{p}embeddings.token_type_embeddings.weight", ("embeddings/token_type/embedding",)),
        *layer_norm(f"{p}embeddings.LayerNorm", "embeddings/norm"),
    )
    if config.head == "mlm":
        top += (Entry(names.mlm["bias"], ("mlm_head/bias",), VOCAB_ROWS), *linear(names.mlm["dense"], "mlm_head/dense"),
                *layer_norm(names.mlm["norm"], "mlm_head/norm"))
    else:
        top += (*linear(names.classification["pooler"], "classifier_head/pooler"),
                *linear(names.classification["classifier"], "classifier_head/classifier"))
    return top, [Stack("", f"{p}encoder.layer.{{}}.", BLOCK, config.num_layers)]


def layout(config: BertConfig) -> tuple[tuple[Entry, ...], list[Stack]]:
    """(top-level entries, [the block stack]) of this config."""
    return layout_with(names_for(config), config)


def tied(config: BertConfig) -> dict[str, str]:
    """The tied HF names of this config's model: the MLM head's, none with a classification head."""
    if config.head != "mlm":
        return {}
    names = names_for(config)
    decoder = names.mlm["bias"].rsplit(".", 1)[0] + ".decoder"
    return {f"{decoder}.weight": f"{names.prefix}embeddings.word_embeddings.weight",
            f"{decoder}.bias": names.mlm["bias"]}


SPECIAL_TOKENS = {
    "bert": {"cls_token": "[CLS]", "sep_token": "[SEP]", "mask_token": "[MASK]", "pad_token": "[PAD]",
             "unk_token": "[UNK]"},
    "roberta": {"bos_token": "<s>", "cls_token": "<s>", "eos_token": "</s>", "sep_token": "</s>",
                "mask_token": "<mask>", "pad_token": "<pad>", "unk_token": "<unk>"},
}


def tokenizer_config(config: BertConfig, tokenizer) -> dict:
    """tokenizer_config.json entries besides tokenizer_class: the family's special tokens."""
    return {**SPECIAL_TOKENS[config.family], "model_max_length": config.max_input_length()}


def config_to_hf(config: BertConfig, eod_id: int | None) -> dict:
    """config.json for transformers' BertConfig / RobertaConfig (HF sees the unpadded vocabulary)."""
    names = names_for(config)
    hf = {
        "model_type": names.model_type,
        "architectures": [names.architectures[config.head == "classification"]],
        "vocab_size": config.vocab_size,
        "hidden_size": config.embed_dim,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "intermediate_size": config.mlp_dim,
        "hidden_act": "gelu",
        "hidden_dropout_prob": config.dropout_rate,
        "attention_probs_dropout_prob": config.attention_dropout_rate,
        "max_position_embeddings": config.max_len,
        "type_vocab_size": config.type_vocab_size,
        "initializer_range": config.init_std,
        "layer_norm_eps": config.layer_norm_eps,
        "pad_token_id": config.pad_token_id,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
    }
    if config.head == "classification":
        names = list(config.labels) or [f"LABEL_{i}" for i in range(config.num_labels)]
        hf["id2label"] = {str(i): name for i, name in enumerate(names)}
        hf["label2id"] = {name: i for i, name in enumerate(names)}
    if config.family == "roberta":  # the end token is the exported tokenizer's, else RoBERTa's </s>
        hf.update(bos_token_id=0, eos_token_id=2 if eod_id is None else eod_id)
    return hf


def head_from_hf(hf: dict, names: Names, source: str) -> dict:
    """Our head fields from the HF architectures: a *ForSequenceClassification gets the
    classification head with its labels, anything else the masked-LM head."""
    architectures = hf.get("architectures") or [names.architectures[0]]
    if not any(a.endswith("ForSequenceClassification") for a in architectures):
        return {"head": "mlm"}
    id2label = {int(i): str(name) for i, name in (hf.get("id2label") or {}).items()}
    num_labels = len(id2label) if id2label else hf.get("num_labels", 2)
    if hf.get("problem_type") not in (None, "single_label_classification"):
        raise UserError(f"{source}: problem_type={hf['problem_type']!r}; only single-label classification is "
                        "supported.")
    generic = all(name == f"LABEL_{i}" for i, name in id2label.items())
    ordered = sorted(id2label) == list(range(num_labels))
    labels = tuple(id2label[i] for i in range(num_labels)) if ordered and not generic else ()
    return {"head": "classification", "num_labels": num_labels, "labels": labels}


def config_from_hf_with(names: Names, config_cls: type[BertConfig], hf: dict, source: str, **choices) -> BertConfig:
    unsupported = {
        "hidden_act": (hf.get("hidden_act", "gelu"), ("gelu",)),
        "position_embedding_type": (hf.get("position_embedding_type", "absolute"), ("absolute",)),
        "is_decoder": (hf.get("is_decoder", False), (False,)),
        "add_cross_attention": (hf.get("add_cross_attention", False), (False,)),
    }
    for name, (value, allowed) in unsupported.items():
        if value not in allowed:
            raise UserError(f"{source}: {name}={value!r} is not supported by our {names.model_type} "
                            f"(supported: {allowed}).")
    pad = hf.get("pad_token_id", config_cls.pad_token_id)
    return config_cls(
        vocab_size=hf["vocab_size"], max_len=hf["max_position_embeddings"], num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"], embed_dim=hf["hidden_size"], mlp_dim=hf["intermediate_size"],
        type_vocab_size=hf.get("type_vocab_size", config_cls.type_vocab_size),
        position_offset=pad + 1 if names is ROBERTA_NAMES else 0, pad_token_id=pad,
        dropout_rate=hf.get("hidden_dropout_prob", 0.1),
        attention_dropout_rate=hf.get("attention_probs_dropout_prob", 0.1),
        layer_norm_eps=hf.get("layer_norm_eps", config_cls.layer_norm_eps), init_std=hf.get("initializer_range", 0.02),
        **head_from_hf(hf, names, source), **choices)


def config_from_hf(hf: dict, source: str, **choices) -> BertConfig:
    """Our config from a HF BERT config.json; `choices` are ours alone (scan_layers, dtype, ...)."""
    return config_from_hf_with(BERT_NAMES, BertConfig, hf, source, **choices)


def roberta_config_from_hf(hf: dict, source: str, **choices) -> RobertaConfig:
    """Our config from a HF RoBERTa config.json (positions start past pad_token_id)."""
    return config_from_hf_with(ROBERTA_NAMES, RobertaConfig, hf, source, **choices)
