"""RoBERTa <-> Hugging Face `RobertaForMaskedLM` / `RobertaForSequenceClassification`: BERT's converter
(t5x_like/convert/bert.py) with RoBERTa's names (`roberta.`, `lm_head`, `classifier.dense` /
`classifier.out_proj`) and positions offset past its padding id."""
from __future__ import annotations

from t5x_like.convert.bert import (ROBERTA_NAMES, config_to_hf, layout, renamed_tensors, roberta_config_from_hf,
                                   tied, tokenizer_config)

HF_MODEL_TYPE = ROBERTA_NAMES.model_type
TIED = {"lm_head.decoder.weight": "roberta.embeddings.word_embeddings.weight", "lm_head.decoder.bias": "lm_head.bias"}
"""HF names that share another tensor (the MLM head's): written by to-torch, omitted by to-hf."""
config_from_hf = roberta_config_from_hf

__all__ = ["HF_MODEL_TYPE", "TIED", "config_from_hf", "config_to_hf", "layout", "renamed_tensors", "tied",
           "tokenizer_config"]
