"""The training objectives, one module each, found by name (OBJECTIVE): what turns a corpus into the rows of
features a LanguageModel's loss reads (t5x_like/features.py names them).

    causal_lm        decoder-only next-token prediction           FEATURE_LENGTHS {'targets': T}
    span_corruption  T5's pre-training                            {'inputs': N, 'targets': M}
    seq2seq          input/target pairs (T5 fine-tuning)          {'inputs': N, 'targets': M}
    mlm              BERT's masked-LM pre-training                {'inputs': N}
    classification   labelled text (BERT/RoBERTa fine-tuning)     {'inputs': N}

An objective module defines `make_source(request: SourceRequest, *, <its own settings>) -> BatchSource` (the
request, common.py, holds what every objective takes: split, batch size, FEATURE_LENGTHS, seed, the host's shard,
DATA_PATH, BLEND_WEIGHTS, TOKENIZER, DATA_SPLIT, PACKING, worker_count; rows -> loader.split_pass ->
common.combined_source) and `vocab_size(*, data_path, tokenizer, ...)`; adding one is a module here and a line
in OBJECTIVES (docs/add_an_objective.md).
"""
from __future__ import annotations

from types import ModuleType

from t5x_like.data.objectives import causal_lm, classification, mlm, seq2seq, span_corruption
from t5x_like.errors import UserError

OBJECTIVES: dict[str, ModuleType] = {
    "causal_lm": causal_lm,
    "span_corruption": span_corruption,
    "seq2seq": seq2seq,
    "mlm": mlm,
    "classification": classification,
}


def objective(name: str) -> ModuleType:
    """The module of objective `name` (OBJECTIVE); unknown names are refused in one line."""
    if name not in OBJECTIVES:
        raise UserError(f"OBJECTIVE={name!r} is unknown; choose one of {tuple(OBJECTIVES)}.")
    return OBJECTIVES[name]
