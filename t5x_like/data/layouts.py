"""Document layouts: how a tokenizer lays a document out in token files and reads generated ids back.

Every tokenizer's own layout is a document's ids followed by its end-of-document id (after its beginning-of-text
id where it has one: Tokenizer.bos_id). GPT2-Chinese's (`gpt2_chinese`, for a character / WordPiece vocab.txt)
is its train.py's `build_files` (github.com/Morizeyao/GPT2-Chinese): each newline of an article becomes `[SEP]`
(`line.replace('\\n', ' [SEP] ')`), and the article is wrapped as `[MASK]` (its start) ... `[CLS]` (its end); its
generate.py prints `[MASK]` as nothing, `[SEP]` as a newline and `[CLS]` as a blank line. Here `[CLS]` is the
end-of-document id (generation stops there), `[MASK]` starts an empty prompt, prompts are encoded with newlines
as `[SEP]` (and no `[MASK]`, as its generate.py), and decoding gives the newlines back. A model trained by
GPT2-Chinese (converted from its Hugging Face files) and one trained here on the same layout then read and write
the same ids.

Choose it with the tokenizer path `gpt2_chinese:PATH` (PATH a vocab.txt or a directory holding one) wherever a
tokenizer is named (preprocess, TOKENIZER, convert, generate); the tokenizer's files carry it on in
tokenizer_config.json (`"document_layout": "gpt2_chinese"`), so token files and checkpoints keep it.
"""
from __future__ import annotations

import hashlib
import itertools
from pathlib import Path
from typing import Sequence

import numpy as np

from t5x_like.data.tokenizer_base import Tokenizer, tokenizer_config
from t5x_like.errors import UserError

GPT2_CHINESE = "gpt2_chinese"
LAYOUTS = (GPT2_CHINESE,)
CONFIG_KEY = "document_layout"
"""The tokenizer_config.json entry that names a layout."""
START, END, NEWLINE = "[MASK]", "[CLS]", "[SEP]"


def configured(path: str) -> str | None:
    """The layout a tokenizer's tokenizer_config.json names (`document_layout`), None when it names none."""
    if ":" in path.split("/")[0]:  # cpm:PATH
        return None
    directory = Path(path) if Path(path).is_dir() else Path(path).parent
    return tokenizer_config(directory).get(CONFIG_KEY)


def split_prefix(path: str) -> tuple[str | None, str]:
    """('gpt2_chinese', PATH) for 'gpt2_chinese:PATH', else (None, path)."""
    for name in LAYOUTS:
        if path.startswith(f"{name}:"):
            return name, path[len(name) + 1:]
    return None, path


class GPT2ChineseLayout(Tokenizer):
    """A WordPiece tokenizer read and written in GPT2-Chinese's layout (the module docstring). Everything else
    (vocabulary, files, pieces) is the wrapped tokenizer's; its sha256 differs, so token files of the two
    layouts are never mixed."""

    def __init__(self, inner, path: str):
        ids = {token: inner.token_to_id(token) for token in (START, END, NEWLINE)}
        missing = [token for token, i in ids.items() if i is None]
        if missing:
            raise UserError(f"{path}: GPT2-Chinese's layout needs {', '.join(missing)} in the vocabulary; give its "
                            "vocab.txt (BERT's specials), e.g. one made by train_tokenizer --type=char.")
        self.inner, self.path = inner, path
        self.vocab_size = inner.vocab_size
        self.eod_id, self.document_start_id, self.newline_id = ids[END], ids[START], ids[NEWLINE]
        self.sha256 = hashlib.sha256(f"{inner.sha256}:{GPT2_CHINESE}".encode()).hexdigest()

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Each text's lines encoded, joined by [SEP] (no [MASK] / [CLS]: encode_documents adds them)."""
        lines = [text.split("\n") for text in texts]
        flat = iter(self.inner.encode_batch([line for text in lines for line in text]))
        out = []
        for text in lines:
            ids: list[int] = []
            for k in range(len(text)):
                ids += ([self.newline_id] if k else []) + next(flat)
            out.append(ids)
        return out

    def encode_documents(self, texts: Sequence[str], append_eod: bool,
                         add_bos: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Articles as GPT2-Chinese's build_files writes them: [MASK] ids [CLS] (without `append_eod`: the ids).
        The layout has no `bos_id` ([MASK] opens an article), so no caller asks for `add_bos`."""
        encoded = self.encode_batch(texts)
        if append_eod:
            encoded = [[self.document_start_id, *ids, self.eod_id] for ids in encoded]
        lengths = np.fromiter(map(len, encoded), np.int64, len(encoded))
        return np.fromiter(itertools.chain.from_iterable(encoded), np.int64, int(lengths.sum())), lengths

    def decode(self, ids: Sequence[int]) -> str:
        """As GPT2-Chinese's generate.py prints ids: the pieces joined without spaces (but between two Latin
        words), `##` dropped, [MASK] as nothing, [SEP] as a newline, [CLS] as a blank line."""
        shown = {START: "", NEWLINE: "\n", END: "\n\n"}
        tokens = [self.inner.id_to_token(int(i)) for i in ids]
        text = [token + " " if is_word(token) and is_word(after) else token
                for token, after in zip(tokens, tokens[1:] + [""])]
        return "".join(shown.get(token, token) for token in text).replace("##", "")

    def token_to_id(self, token: str) -> int | None:
        return self.inner.token_to_id(token)

    def id_to_token(self, token_id: int) -> str:
        return self.inner.id_to_token(token_id)

    def hf_files(self) -> dict[str, bytes]:
        return self.inner.hf_files()

    def hf_tokenizer_config(self) -> dict:
        return {**self.inner.hf_tokenizer_config(), CONFIG_KEY: GPT2_CHINESE}


def is_word(token: str) -> bool:
    """GPT2-Chinese's generate.py `is_word`: lower-case Latin letters only (a space goes between two such)."""
    return bool(token) and all(c in "qwertyuiopasdfghjklzxcvbnm" for c in token)


def with_layout(tokenizer, layout: str | None, path: str):
    """`tokenizer` in `layout` (None: as it is); only WordPiece vocabularies have another layout."""
    if layout is None:
        return tokenizer
    if layout not in LAYOUTS:
        raise UserError(f"{path}: document_layout {layout!r} is unknown; the layouts are {LAYOUTS}.")
    if tokenizer.hf_tokenizer_config().get("tokenizer_class") != "BertTokenizer":
        raise UserError(f"{path}: GPT2-Chinese's layout is for a character / WordPiece vocab.txt, not this "
                        f"{type(tokenizer).__name__}.")
    return GPT2ChineseLayout(tokenizer, path)
