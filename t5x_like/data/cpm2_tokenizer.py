"""CPM-2's tokenizer as ModelCenter's `CPM2Tokenizer` implements it (`model_center/tokenizer/cpm2_tokenizer.py`,
with the `▂` / `▃` space and line tokens its `from_pretrained` sets): jieba words, then a greedy longest match
over the vocabulary (vocab.txt, one piece a line, the line number its id); a space becomes `▂`, a newline `▃`;
a piece no match covers is `<unk>` (one per character). The last 190 ids are the sentinels `<s_0>` ... `<s_189>`;
one written in a text is its id (as T5's `<extra_id_0>` is), which ModelCenter's encode cuts into pieces (its users
put the ids in by hand, as CPM-2-Finetune's LCQMC ends its inputs with `<s_0>`).

A vocab.txt is CPM-2's when it ends with those sentinels and holds `<eod>`, `▂` and `▃` (CPM-2-Finetune's
bpe_cn/vocab.txt, ModelCenter's cpm2 folders): a directory holding one, or the file itself, loads as this
tokenizer wherever a tokenizer is taken.
"""
from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from pathlib import Path

from t5x_like.data.cpm_tokenizer import import_jieba
from t5x_like.data.tokenizer_base import Tokenizer, split_special, tokenizer_config
from t5x_like.errors import UserError

TOKENIZER_CLASS = "CPM2Tokenizer"
NUM_SENTINELS = 190
SENTINEL = re.compile(r"<s_\d+>")
SPACE, LINE = "\u2582", "\u2583"
_SPACE, _LINE = "\uFFF2", "\uFFF3"
"""The stand-ins CPM2Tokenizer puts for spaces and newlines before segmenting (its _space_token, _line_token)."""
MAX_WORD_CHARS = 200
"""A word longer than this is one `<unk>` (its WordpieceTokenizer's max_input_chars_per_word)."""
REQUIRED = ("<unk>", "<s>", "<eod>", "<pad>", SPACE, LINE)


def read_vocab(path: Path) -> list[str]:
    """The pieces of a vocab.txt as load_vocab reads them: lines (universal newlines), each stripped."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: not a UTF-8 vocabulary ({e})") from None
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    return [line.strip() for line in (lines[:-1] if text.endswith(("\n", "\r")) or not text else lines)]


EXPECTED = (f"CPM-2's vocab.txt holds {', '.join(REQUIRED)} and ends with the {NUM_SENTINELS} sentinels <s_0> ... "
            f"<s_{NUM_SENTINELS - 1}> (CPM-2-Finetune's bpe_cn/vocab.txt, the vocab.txt of ModelCenter's cpm2 folders)")


def shortfall(pieces: list[str]) -> list[str]:
    """What keeps `pieces` (a vocab.txt's) from being CPM-2's vocabulary, in words; [] when nothing does."""
    have = set(pieces)
    wanted = REQUIRED + tuple(f"<s_{i}>" for i in range(NUM_SENTINELS))
    missing = [p for p in wanted if p not in have]
    if missing:
        return [f"it lacks {', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''}"]
    if pieces[-1] != wanted[-1]:
        return [f"pieces follow {wanted[-1]} (the first: {pieces[pieces.index(wanted[-1]) + 1]!r})"]
    return []


def meant_as_cpm2(pieces: list[str], directory: Path) -> bool:
    """Whether a vocab.txt that is not CPM-2's was meant as CPM-2's: it holds a sentinel `<s_N>`, CPM-2's `▂` or
    `▃`, or the tokenizer_config.json beside it names CPM2Tokenizer."""
    return any(p in (SPACE, LINE) or SENTINEL.fullmatch(p) for p in pieces) or \
        tokenizer_config(directory).get("tokenizer_class") == TOKENIZER_CLASS


def is_cpm2_vocab(path: Path) -> bool:
    """Whether the vocab.txt at `path` is CPM-2's (it ends with the 190 sentinels and has its special pieces)."""
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - 64))
        if not f.read().rstrip().endswith(f"<s_{NUM_SENTINELS - 1}>".encode()):
            return False
    pieces = set(read_vocab(path))
    return all(p in pieces for p in REQUIRED) and all(f"<s_{i}>" in pieces for i in range(NUM_SENTINELS))


class CPM2Tokenizer(Tokenizer):
    """Text <-> ids as ModelCenter's CPM2Tokenizer.encode / decode."""

    num_sentinels = NUM_SENTINELS

    def __init__(self, vocab_file: Path, path: str):
        self._jieba = import_jieba()
        self.path = path
        self._vocab_bytes = vocab_file.read_bytes()
        pieces = read_vocab(vocab_file)
        self._encoder = {piece: i for i, piece in enumerate(pieces)}
        self._decoder = {i: piece for piece, i in self._encoder.items()}
        self.vocab_size = len(pieces)
        if problems := shortfall(pieces):
            raise UserError(f"{vocab_file}: not CPM-2's vocabulary: {problems[0]}; {EXPECTED}.")
        self.eod_id = self._encoder["<eod>"]
        self.unk_id, self.sod_id = self._encoder["<unk>"], self._encoder["<s>"]
        self._stand_ins = {_SPACE: self._encoder[SPACE], _LINE: self._encoder[LINE]}
        self._longest = max(map(len, self._encoder))
        self.sha256 = hashlib.sha256(b"cpm2:" + self._vocab_bytes).hexdigest()

    def sentinel_id(self, index: int) -> int:
        return self._encoder[f"<s_{index}>"]

    def encode(self, text: str) -> list[int]:
        """ModelCenter's ids, but for a sentinel written in the text (`<s_0>`), which is its id (as T5's
        `<extra_id_0>` is T5's) where ModelCenter's encode cuts it into five pieces."""
        if "<s_" not in text:
            return self._encode_text(text)
        return [i for part in split_special(text, self._sentinel) for i in
                ([part] if isinstance(part, int) else self._encode_text(part))]

    def _sentinel(self, name: str) -> int | None:
        return self._encoder[name] if SENTINEL.fullmatch(name) and name in self._encoder else None

    def _encode_text(self, text: str) -> list[int]:
        text = text.replace("\n", _LINE).replace(LINE, _LINE).replace(" ", _SPACE).replace(SPACE, _SPACE)
        ids = []
        for word in self._jieba.cut(text, cut_all=False):
            ids.extend(self._longest_matches(word))
        return ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [self.encode(text) for text in texts]

    def _longest_matches(self, word: str) -> list[int]:
        """WordpieceTokenizer.tokenize: from each start, the longest piece of the vocabulary, else `<unk>` for
        one character (the spaces' and newlines' stand-ins are `▂` and `▃`)."""
        if len(word) > MAX_WORD_CHARS:
            return [self.unk_id]
        ids, start = [], 0
        while start < len(word):
            for end in range(min(len(word), start + self._longest), start, -1):
                piece = word[start:end]
                token_id = self._stand_ins.get(piece, self._encoder.get(piece))
                if token_id is not None:
                    ids.append(token_id)
                    start = end
                    break
            else:
                ids.append(self.unk_id)
                start += 1
        return ids

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(self._decoder[int(i)] for i in ids).replace(SPACE, " ").replace(LINE, "\n")

    def token_to_id(self, token: str) -> int | None:
        return self._encoder.get(token)

    def id_to_token(self, token_id: int) -> str:
        return self._decoder[int(token_id)]

    def hf_files(self) -> dict[str, bytes]:
        return {"vocab.txt": self._vocab_bytes}

    def hf_tokenizer_config(self) -> dict:
        return {"tokenizer_class": TOKENIZER_CLASS, "bos_token": "<s>", "eos_token": "<eod>", "unk_token": "<unk>",
                "pad_token": "<pad>", "space_token": SPACE, "line_token": LINE}


def cpm2_vocab_file(path: Path) -> Path | None:
    """The CPM-2 vocab.txt that `path` is or holds, else None."""
    vocab = path / "vocab.txt" if path.is_dir() else path
    return vocab if vocab.is_file() and vocab.suffix == ".txt" and is_cpm2_vocab(vocab) else None
