"""CPM-1's tokenizer as CPM-Generate implements it (jieba words, U+2582 / U+2583 for spaces and newlines, then
sentencepiece), from a `.model` or a directory holding one (`cpm:PATH`, or a folder whose tokenizer_config.json
names CpmTokenizer)."""
from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import sentencepiece

from t5x_like.data.tokenizer_base import Tokenizer, decode_runs, split_special, tokenizer_config
from t5x_like.errors import UserError


CPM_SPECIAL_TOKENS = ("<s>", "</s>", "<unk>", "<sep>", "<pad>", "<cls>", "<mask>", "<eop>", "<eod>")
"""The special tokens of transformers' CpmTokenizer (XLNet's); text holding them encodes them as their ids."""


CPM_TOKENIZER_CLASSES = ("CpmTokenizer", "CpmTokenizerFast")
CPM_SPACE, CPM_NEWLINE = "\u2582", "\u2583"
CPM_TRANSLATION = str.maketrans(" \n", CPM_SPACE + CPM_NEWLINE)


class CpmTokenizer(Tokenizer):
    """CPM-1's tokenizer as CPM-Generate implements it: text is cut into words by jieba
    (`jieba.cut(text, cut_all=False)`), spaces and newlines inside the words become U+2582 and U+2583, the
    words are joined by spaces and encoded by sentencepiece; decoding removes the spaces and maps U+2582 /
    U+2583 back. Special tokens (CPM_SPECIAL_TOKENS and the added tokens, which may have ids past the
    sentencepiece pieces) are ids of their own, in text and in decoding; `<eod>` ends a document."""

    def __init__(self, model_file: str, path: str, added_tokens: dict[str, int]):
        self._jieba = import_jieba()
        self._processor = sentencepiece.SentencePieceProcessor(model_file=model_file)
        self.path = path
        pieces = self._processor.get_piece_size()
        self._added = dict(added_tokens)
        self.vocab_size = max([pieces, *(i + 1 for i in self._added.values())])
        self._special = {token: i for token in CPM_SPECIAL_TOKENS + tuple(self._added)
                         if (i := self.token_to_id(token)) is not None}
        self._special_names = {i: token for token, i in self._special.items()}
        if "<eod>" not in self._special:
            raise UserError(f"{model_file}: a CPM tokenizer needs an <eod> token (a sentencepiece piece or an added "
                            "token in tokenizer_config.json's added_tokens_decoder); train it with "
                            "`train_tokenizer --type=cpm`, which adds one")
        self.eod_id = self._special["<eod>"]
        identity = self._processor.serialized_model_proto() + json.dumps(sorted(self._added.items())).encode()
        self.sha256 = hashlib.sha256(b"cpm:" + identity).hexdigest()

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self._encode(text) for text in texts]

    def _encode(self, text: str) -> list[int]:
        ids = []
        for part in split_special(text, self._special.get):
            ids.extend([part] if isinstance(part, int) else self._encode_words(part))
        return ids

    def _encode_words(self, text: str) -> list[int]:
        words = (word.translate(CPM_TRANSLATION) for word in self._jieba.cut(text, cut_all=False))
        return self._processor.encode(" ".join(words))

    def decode(self, ids: Sequence[int]) -> str:
        return decode_runs(ids, self._special_names.get, self._decode_pieces)

    def _decode_pieces(self, ids: list[int], first: bool) -> str:
        del first
        pieces = self._processor.get_piece_size()
        text = self._processor.decode([i if i < pieces else self._processor.unk_id() for i in ids])
        return text.replace(" ", "").replace(CPM_SPACE, " ").replace(CPM_NEWLINE, "\n")

    def token_to_id(self, token: str) -> int | None:
        if token in self._added:
            return self._added[token]
        piece_id = self._processor.piece_to_id(token)
        return piece_id if self._processor.id_to_piece(piece_id) == token else None

    def id_to_token(self, token_id: int) -> str:
        return self._special_names.get(token_id) or self._processor.id_to_piece(token_id)

    def hf_files(self) -> dict[str, bytes]:
        return {"spiece.model": self._processor.serialized_model_proto()}

    def hf_tokenizer_config(self) -> dict:
        unk = self._processor.id_to_piece(self._processor.unk_id())
        added = {str(i): {"content": token, "lstrip": False, "normalized": False, "rstrip": False,
                          "single_word": False, "special": True} for token, i in sorted(self._added.items())}
        return {"tokenizer_class": "CpmTokenizer", "bos_token": "<eod>", "eos_token": "<eod>", "unk_token": unk,
                "additional_special_tokens": ["<eop>", "<eod>"], "added_tokens_decoder": added}


def import_jieba():
    try:
        import jieba
    except ImportError:
        raise UserError("the CPM tokenizer needs jieba (Chinese word segmentation): "
                        "pip install 't5x_like[chinese]' (or pip install jieba)") from None
    import logging
    jieba.setLogLevel(logging.WARNING)  # not "Building prefix dict ..." on every process start
    return jieba


def cpm_tokenizer(path: str) -> CpmTokenizer:
    """CPM's tokenizer over `path`: a sentencepiece .model, or a directory with one (spiece.model preferred);
    added tokens come from the directory's tokenizer_config.json (added_tokens_decoder) and added_tokens.json."""
    p = Path(path)
    model_file = p if p.is_file() else p / "spiece.model"
    if not model_file.is_file():
        models_there = sorted(p.glob("*.model")) if p.is_dir() else []
        if len(models_there) != 1:
            raise UserError(f"--tokenizer=cpm:{path}: expected a sentencepiece .model file or a directory with "
                            "spiece.model (CPM's tokenizer)")
        model_file = models_there[0]
    return CpmTokenizer(str(model_file), path if p.is_dir() else str(p), added_tokens(model_file.parent))


def added_tokens(directory: Path) -> dict[str, int]:
    """Tokens added to a Hugging Face tokenizer: tokenizer_config.json's added_tokens_decoder, added_tokens.json."""
    found = {}
    for token_id, token in tokenizer_config(directory).get("added_tokens_decoder", {}).items():
        found[token["content"] if isinstance(token, dict) else str(token)] = int(token_id)
    if (directory / "added_tokens.json").is_file():
        found.update(json.loads((directory / "added_tokens.json").read_text(encoding="utf-8")))
    return found
