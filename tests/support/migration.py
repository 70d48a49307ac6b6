"""What the migration tests share (tests/t5x_like/migration/): reading what `--print_config` shows, and a corpus
tokenized as Megatron's tools leave it."""
import ast
import re
from pathlib import Path

import numpy as np
import pydoc_data.topics


def printed_config(text: str) -> dict:
    """--print_config's values: macros, `configurable.parameter`s (macro references resolved) and the resolved
    model config's fields as `model.<field>`."""
    values = {}
    for line in text.splitlines():
        model = re.match(r"^#     (\w+) = (.*)$", line)
        binding = re.match(r"^([\w.]+) = (.*)$", line)
        if model:
            values[f"model.{model[1]}"] = model[2]
        elif binding:
            values[binding[1]] = binding[2]
    resolved = {}
    for name, raw in values.items():
        raw = values.get(raw[1:], raw) if raw.startswith("%") else raw
        try:
            resolved[name] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            resolved[name] = raw
    return resolved


def megatron_token_file(prefix: Path, tokenizer_path: Path) -> None:
    """Documents (Python's help topics) tokenized as Megatron's tools/preprocess_data.py leaves them: .bin and .idx,
    each document ending with the tokenizer's end-of-document id, no metadata beside them."""
    from t5x_like.data.token_file import TokenFileWriter, token_dtype
    from t5x_like.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_path)
    documents = [tokenizer.encode(text) + [tokenizer.eod_id] for text in list(pydoc_data.topics.topics.values())[:60]]
    with TokenFileWriter(prefix, token_dtype(tokenizer.vocab_size), {}) as writer:
        writer.write(np.concatenate(documents), np.asarray([len(d) for d in documents]))
    Path(f"{prefix}.json").unlink()
