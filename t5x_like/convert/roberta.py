"""RoBERTa <-> Hugging Face `RobertaForMaskedLM` / `RobertaForSequenceClassification`: BERT's converter
(t5x_like/convert/bert.py) with RoBERTa's names (`roberta.`, `lm_head`, `classifier.dense` /
`classifier.out_proj`) and positions offset past its padding id."""
from __future__ import annotations

from t5x_like.convert.bert import (ROBERTA_NAMES, UNUSED_HF_TENSORS, config_to_hf, layout, renamed_tensors,
                                   roberta_config_from_hf, tied, tokenizer_config)

HF_MODEL_TYPE = ROBERTA_NAMES.model_type
TIED = {"lm_head.decoder.weight": "roberta.embeddings.word_embeddings.weight", "lm_head.decoder.bias": "lm_head.bias"}
"""HF names that share another tensor (the MLM head's): written by to-torch, omitted by to-hf."""
BASE_MODEL_PREFIX = "roberta"
config_from_hf = roberta_config_from_hf

__all__ = ["BASE_MODEL_PREFIX", "HF_MODEL_TYPE", "TIED", "UNUSED_HF_TENSORS", "config_from_hf", "config_to_hf",
           "layout", "renamed_tensors", "tied", "tokenizer_config"]
