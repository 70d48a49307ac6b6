"""A tokenizer as files: the Hugging Face tokenizer directory `convert to-hf` writes (transformers' AutoTokenizer
and `load_tokenizer` both load it as the same tokenizer), and the record checkpoints and token files keep (its
files inside it, unpacked into a cache when read), so a run or a corpus keeps its tokenizer wherever it moves."""
from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from t5x_like.data.tokenizer_base import Tokenizer


RECORD_FORMAT = "t5x_like.tokenizer/1"


T5_TOKENIZER_CLASS = "T5Tokenizer"


def cache_root() -> Path:
    """Where t5x_like caches what it builds or unpacks: `$T5X_LIKE_CACHE`, default `~/.cache/t5x_like`."""
    return Path(os.environ.get("T5X_LIKE_CACHE") or Path.home() / ".cache" / "t5x_like")


def hf_tokenizer_files(tokenizer: Tokenizer, family_config: dict | None = None) -> dict[str, bytes]:
    """The files of a Hugging Face tokenizer directory for `tokenizer`, tokenizer_config.json included: the
    tokenizer's own entries over `family_config` (a model family's special tokens and length; none of those for a
    tokenizer with its own, `own_special_tokens`, so an export adds nothing the original lacked). Its `extra_ids`
    (T5's sentinels above the tokenizer's ids, `<extra_id_0>` the highest) stay as T5Tokenizer's `extra_ids`, and
    become added tokens at those ids for every other tokenizer class."""
    config = dict(family_config or {})
    extra_ids = config.pop("extra_ids", 0)
    if tokenizer.own_special_tokens:  # the original's special tokens and length, nothing added
        config = {}
    config.update(tokenizer.hf_tokenizer_config())
    if config["tokenizer_class"] == T5_TOKENIZER_CLASS:
        config["extra_ids"] = extra_ids
    elif extra_ids:
        config["added_tokens_decoder"] = {
            **config.get("added_tokens_decoder", {}),
            **{str(tokenizer.vocab_size + extra_ids - 1 - i): _added_token(f"<extra_id_{i}>") for i in range(extra_ids)}}
    return {**tokenizer.hf_files(), "tokenizer_config.json": (json.dumps(config, indent=2) + "\n").encode()}


def _added_token(content: str) -> dict:
    return {"content": content, "lstrip": False, "normalized": False, "rstrip": False, "single_word": False,
            "special": True}


def save_tokenizer(tokenizer: Tokenizer, directory: str | os.PathLike, family_config: dict | None = None) -> None:
    """Write `tokenizer` as a Hugging Face tokenizer directory (see hf_tokenizer_files)."""
    os.makedirs(directory, exist_ok=True)
    for name, contents in hf_tokenizer_files(tokenizer, family_config).items():
        Path(directory, name).write_bytes(contents)


def tokenizer_record(tokenizer: Tokenizer) -> dict:
    """What a checkpoint or a token file records of its tokenizer: where it was loaded from, its identity, and
    its files (a Hugging Face tokenizer directory), so it loads again wherever the run or the data moves."""
    files = hf_tokenizer_files(tokenizer)
    return {"format": RECORD_FORMAT, "path": _absolute(tokenizer.path), "sha256": tokenizer.sha256,
            "vocab_size": tokenizer.vocab_size, "eod_id": tokenizer.eod_id,
            "files": {name: base64.b64encode(contents).decode("ascii") for name, contents in files.items()}}


def _absolute(path: str) -> str:
    """The path made absolute, a kind prefix (`cpm:`, `gpt2_chinese:`) kept."""
    prefix = next((p for p in ("cpm:", "gpt2_chinese:") if path.startswith(p)), "")
    return prefix + os.path.abspath(path[len(prefix):])


def recorded_tokenizer_path(record: dict | str | None) -> str | None:
    """A path `load_tokenizer` opens for a recorded tokenizer: its files unpacked once into the cache
    (`cache_root()/tokenizers/<hash of the files>`), or, for records older than the files, the path it recorded."""
    if record is None or isinstance(record, str):
        return record
    if "files" not in record:
        return record["path"]
    # keyed by the files themselves: one vocabulary (one sha256) may come with other tokenizer_config.json entries
    key = hashlib.sha256(json.dumps(record["files"], sort_keys=True).encode()).hexdigest()
    directory = cache_root() / "tokenizers" / key
    if not directory.is_dir():
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=directory.parent)
        for name, contents in record["files"].items():
            Path(tmp, name).write_bytes(base64.b64decode(contents))
        try:
            os.rename(tmp, directory)
        except OSError:  # another process unpacked it first
            shutil.rmtree(tmp, ignore_errors=True)
    return str(directory)
