"""One tokenizer interface over GPT-2 BPE files, Hugging Face tokenizer.json and sentencepiece models.

`load_tokenizer(path)` picks the implementation from what the path holds, first match wins:
  - a directory with `tokenizer.json`, or a `*.json` file (Hugging Face `tokenizers`; a Hugging Face model
    directory holds the complete description here, even when it also has the files below),
  - a directory with `vocab.json` + `merges.txt` or `encoder.json` + `vocab.bpe` (OpenAI GPT-2 BPE),
  - a directory with exactly one `*.model`, or a `*.model` file (sentencepiece).
Documents are encoded without special tokens; the end-of-document id is the tokenizer's own
(`<|endoftext|>` or `</s>`) and is appended by the caller.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import sentencepiece
import tokenizers
from tokenizers import decoders, models, pre_tokenizers

from t5x_like.errors import UserError

EOD_TOKENS = ("<|endoftext|>", "</s>")
OPENAI_BPE_FILE_PAIRS = (("vocab.json", "merges.txt"), ("encoder.json", "vocab.bpe"))


class Tokenizer:
    """Text <-> ids. `sha256` identifies the vocabulary (stored in token-file metadata and checked)."""

    path: str
    vocab_size: int
    eod_id: int
    sha256: str

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        raise NotImplementedError

    def decode(self, ids: Sequence[int]) -> str:
        raise NotImplementedError

    def token_to_id(self, token: str) -> int | None:
        """The id of the piece spelled `token`, None when the vocabulary has no such piece."""
        raise NotImplementedError

    def encode_documents(self, texts: Sequence[str], append_eod: bool) -> tuple[np.ndarray, np.ndarray]:
        """The documents' ids back to back (EOD after each when `append_eod`) and their lengths."""
        encoded = self.encode_batch(texts)
        if append_eod:
            encoded = [ids + [self.eod_id] for ids in encoded]
        lengths = np.fromiter(map(len, encoded), np.int64, len(encoded))
        ids = np.fromiter(itertools.chain.from_iterable(encoded), np.int64, int(lengths.sum()))
        return ids, lengths


class HuggingFaceTokenizer(Tokenizer):
    """A `tokenizers.Tokenizer` (byte-level BPE for GPT-2 and GPT-NeoX)."""

    def __init__(self, tokenizer: tokenizers.Tokenizer, path: str):
        self._tokenizer = tokenizer
        self.path = path
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self.eod_id = _find_eod(path, tokenizer.token_to_id)
        # The vocabulary, not the JSON serialisation, which varies with the `tokenizers` version.
        vocabulary = sorted(tokenizer.get_vocab(with_added_tokens=True).items(), key=lambda item: item[1])
        self.sha256 = hashlib.sha256(json.dumps(vocabulary).encode()).hexdigest()

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        encodings = self._tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)
        return [e.ids for e in encodings]

    def decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=False)

    def token_to_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)


class SentencePieceTokenizer(Tokenizer):
    """A sentencepiece `.model` (e.g. T5's spiece.model); EOD is the model's `</s>`."""

    def __init__(self, model_file: str, path: str):
        self._processor = sentencepiece.SentencePieceProcessor(model_file=model_file)
        self.path = path
        self.vocab_size = self._processor.get_piece_size()
        self.eod_id = self._processor.eos_id()
        if self.eod_id < 0:
            raise UserError(f"{model_file}: sentencepiece model has no end-of-sentence piece; "
                            "train it with eos_id >= 0 (train_tokenizer does)")
        self.sha256 = hashlib.sha256(self._processor.serialized_model_proto()).hexdigest()

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return self._processor.encode(list(texts), out_type=int)

    def decode(self, ids: Sequence[int]) -> str:
        return self._processor.decode(list(ids))

    def token_to_id(self, token: str) -> int | None:
        piece_id = self._processor.piece_to_id(token)  # the unknown piece's id when there is no such piece
        return piece_id if self._processor.id_to_piece(piece_id) == token else None


def _find_eod(path: str, token_to_id) -> int:
    for token in EOD_TOKENS:
        token_id = token_to_id(token)
        if token_id is not None:
            return token_id
    raise UserError(f"{path}: tokenizer has no end-of-document token (one of {EOD_TOKENS}); "
                    "add one as a special token")


def openai_bpe(vocab_file: str, merges_file: str) -> tokenizers.Tokenizer:
    """OpenAI's byte-level BPE (GPT-2's tokenizer) built from its two files (encodes as tiktoken's GPT-2 encoding does)."""
    tokenizer = tokenizers.Tokenizer(models.BPE.from_file(vocab_file, merges_file))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens([EOD_TOKENS[0]])
    return tokenizer


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """Loads the tokenizer at `path` (see the module docstring for what it may be)."""
    path = str(path)
    p = Path(path)
    if p.is_dir():
        if (p / "tokenizer.json").is_file():
            return HuggingFaceTokenizer(tokenizers.Tokenizer.from_file(str(p / "tokenizer.json")), path)
        for vocab, merges in OPENAI_BPE_FILE_PAIRS:
            if (p / vocab).is_file() and (p / merges).is_file():
                return HuggingFaceTokenizer(openai_bpe(str(p / vocab), str(p / merges)), path)
        sp_models = sorted(p.glob("*.model"))
        if len(sp_models) == 1:
            return SentencePieceTokenizer(str(sp_models[0]), path)
    elif p.is_file() and p.suffix == ".json":
        return HuggingFaceTokenizer(tokenizers.Tokenizer.from_file(path), path)
    elif p.is_file() and p.suffix == ".model":
        return SentencePieceTokenizer(path, path)
    raise UserError(
        f"--tokenizer={path}: not a tokenizer. Expected a directory with a tokenizer.json (Hugging Face), "
        "vocab.json+merges.txt or encoder.json+vocab.bpe (GPT-2 BPE) or one *.model (sentencepiece), "
        "or the path of such a .json/.model file")
