"""One tokenizer interface over GPT-2 BPE files, Hugging Face tokenizer.json, BERT vocab.txt, sentencepiece
models and CPM's jieba + sentencepiece tokenizer.

`load_tokenizer(path)` picks the implementation from what the path holds, first match wins:
  - `cpm:PATH` (PATH a sentencepiece `.model` or a directory with one), or a directory whose
    tokenizer_config.json says `"tokenizer_class": "CpmTokenizer"`: CPM's tokenizer (CPM-Generate's encode
    and decode: jieba words, spaces and newlines as U+2582/U+2583, then sentencepiece),
  - a directory with `tokenizer.json`, or a `*.json` tokenizer file (Hugging Face `tokenizers`; a Hugging Face
    model directory holds the complete description here, even when it also has the files below),
  - a directory with `vocab.json` + `merges.txt`, `encoder.json` + `vocab.bpe` or Megatron's
    `gpt2-vocab.json` + `gpt2-merges.txt`, or one of those files (OpenAI GPT-2 BPE),
  - a directory with `vocab.txt`, or a `*.txt` vocabulary file (BERT WordPiece, as transformers'
    BertTokenizerFast; lower-cased unless a tokenizer_config.json beside it says `"do_lower_case": false`),
  - a directory with exactly one `*.model`, or a `*.model` file (sentencepiece).
Documents are encoded without special tokens; the end-of-document id is the tokenizer's own
(`<|endoftext|>`, `</s>`, else `[SEP]`; CPM's `<eod>`) and is appended by the caller.
"""
from __future__ import annotations

import base64
import hashlib
import itertools
import json
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import sentencepiece
import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers

from t5x_like.errors import UserError

EOD_TOKENS = ("<|endoftext|>", "</s>", "[SEP]")
OPENAI_BPE_FILE_PAIRS = (("vocab.json", "merges.txt"), ("encoder.json", "vocab.bpe"),
                         ("gpt2-vocab.json", "gpt2-merges.txt"))
WORDPIECE_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
WORDPIECE_REQUIRED_TOKENS = ("[UNK]", "[CLS]", "[SEP]", "[MASK]")
NUM_SENTINELS = 100
"""T5's sentinels above a sentencepiece model's pieces: `<extra_id_i>` = pieces + NUM_SENTINELS - 1 - i."""
SENTINEL = re.compile(r"<extra_id_(\d+)>")
CPM_SPECIAL_TOKENS = ("<s>", "</s>", "<unk>", "<sep>", "<pad>", "<cls>", "<mask>", "<eop>", "<eod>")
"""The special tokens of transformers' CpmTokenizer (XLNet's); text holding them encodes them as their ids."""
CPM_TOKENIZER_CLASSES = ("CpmTokenizer", "CpmTokenizerFast")
CPM_SPACE, CPM_NEWLINE = "\u2582", "\u2583"
CPM_TRANSLATION = str.maketrans(" \n", CPM_SPACE + CPM_NEWLINE)


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

    def id_to_token(self, token_id: int) -> str:
        """The spelling of piece `token_id` (a special token's name, e.g. `</s>`, where decoding gives "")."""
        raise NotImplementedError

    def hf_files(self) -> dict[str, bytes]:
        """The files of a Hugging Face tokenizer directory holding this tokenizer (name -> contents), besides
        tokenizer_config.json: what transformers' AutoTokenizer and `load_tokenizer` both load as this
        tokenizer (same ids, same sha256)."""
        raise NotImplementedError

    def hf_tokenizer_config(self) -> dict:
        """The tokenizer_config.json entries that go with `hf_files` (the tokenizer class, its own specials)."""
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

    def id_to_token(self, token_id: int) -> str:
        return self._tokenizer.id_to_token(token_id)

    def hf_files(self) -> dict[str, bytes]:
        return {"tokenizer.json": self._tokenizer.to_str().encode()}

    def hf_tokenizer_config(self) -> dict:
        return {"tokenizer_class": "PreTrainedTokenizerFast"}


class WordPieceTokenizer(HuggingFaceTokenizer):
    """A BERT WordPiece tokenizer (a vocab.txt, or a tokenizer.json with a WordPiece model). Decoding joins
    `##` pieces and writes CJK characters and full-width punctuation without spaces between them."""

    def __init__(self, tokenizer: tokenizers.Tokenizer, path: str, vocab_file: str | None = None,
                 options: dict | None = None):
        super().__init__(tokenizer, path)
        self._vocab_file, self._options = vocab_file, dict(options or {})

    def decode(self, ids: Sequence[int]) -> str:
        return _join_cjk(super().decode(ids))

    def hf_files(self) -> dict[str, bytes]:
        if not self._vocab_file:  # a tokenizer.json with a WordPiece model
            return super().hf_files()
        return {"vocab.txt": Path(self._vocab_file).read_bytes()}

    def hf_tokenizer_config(self) -> dict:
        if not self._vocab_file:
            return super().hf_tokenizer_config()
        return {"tokenizer_class": "BertTokenizer", **self._options, "unk_token": "[UNK]", "sep_token": "[SEP]",
                "pad_token": "[PAD]", "cls_token": "[CLS]", "mask_token": "[MASK]"}


_CJK = "\u2e80-\u9fff\uf900-\ufaff\uff00-\uffef\u2010-\u2027"  # ideographs, kana, CJK, full-width and
# general punctuation (“ ” — …): the characters Chinese text writes without spaces between them
_SPACE_BETWEEN_CJK = re.compile(rf"(?<=[{_CJK}]) (?=[{_CJK}])")


def _join_cjk(text: str) -> str:
    """WordPiece's decoder joins every token with a space; CJK text has none between its characters (a space
    between a CJK character and a Latin word stays)."""
    return _SPACE_BETWEEN_CJK.sub("", text)


class SentencePieceTokenizer(Tokenizer):
    """A sentencepiece `.model` (e.g. T5's spiece.model); EOD is the model's `</s>`.

    Ids past the model's pieces are T5's sentinels, as transformers' T5 tokenizer has them: `<extra_id_i>` =
    pieces + NUM_SENTINELS - 1 - i (32099 for <extra_id_0> with T5's 32000 pieces). They decode to their
    names and `<extra_id_i>` in text encodes to its id; `vocab_size` counts the pieces only (the objectives
    add the sentinels, see objectives.encoder_decoder.vocabulary_with_sentinels), so preprocess refuses a corpus holding
    literal `<extra_id_i>` text with this tokenizer (its ids lie past the pieces)."""

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
        if not any("<extra_id_" in text for text in texts):
            return self._processor.encode(list(texts), out_type=int)
        return [self._encode_with_sentinels(text) for text in texts]

    def _encode_with_sentinels(self, text: str) -> list[int]:
        ids = []
        for part in _split_special(text, self._sentinel_id):
            ids.extend([part] if isinstance(part, int) else self._processor.encode(part))
        return ids

    def _sentinel_id(self, name: str) -> int | None:
        match = SENTINEL.fullmatch(name)
        return self.vocab_size + NUM_SENTINELS - 1 - int(match[1]) if match and int(match[1]) < NUM_SENTINELS \
            else None

    def _sentinel_name(self, token_id: int) -> str | None:
        index = self.vocab_size + NUM_SENTINELS - 1 - token_id
        return f"<extra_id_{index}>" if token_id >= self.vocab_size and 0 <= index < NUM_SENTINELS else None

    def decode(self, ids: Sequence[int]) -> str:
        """Pieces as sentencepiece decodes them, sentinels by name (a space before pieces that follow one and
        start a word, as transformers writes them); ids past the sentinels as sentencepiece's unknown piece."""
        return _decode_runs(ids, self._sentinel_name, self._decode_pieces)

    def _decode_pieces(self, ids: list[int], first: bool) -> str:
        ids = [i if i < self.vocab_size else self._processor.unk_id() for i in ids]
        text = self._processor.decode(ids)
        starts_word = self._processor.id_to_piece(ids[0]).startswith("\u2581")
        return text if first or not starts_word else " " + text

    def token_to_id(self, token: str) -> int | None:
        piece_id = self._processor.piece_to_id(token)  # the unknown piece's id when there is no such piece
        return piece_id if self._processor.id_to_piece(piece_id) == token else None

    def id_to_token(self, token_id: int) -> str:
        return self._sentinel_name(token_id) or self._processor.id_to_piece(token_id)

    def _byte_fallback(self) -> bool:
        return any(self._processor.is_byte(i) for i in range(self.vocab_size))

    def hf_files(self) -> dict[str, bytes]:
        """T5's file name for a model T5Tokenizer encodes alike; a byte-fallback model (train_tokenizer's), which
        T5Tokenizer maps to <unk>, as `tokenizer.model`: transformers then converts the model by its own settings."""
        name = "tokenizer.model" if self._byte_fallback() else "spiece.model"
        return {name: self._processor.serialized_model_proto()}

    def hf_tokenizer_config(self) -> dict:
        unk = {"unk_token": self._processor.id_to_piece(self._processor.unk_id())}
        if self._byte_fallback():
            return {"tokenizer_class": "PreTrainedTokenizerFast", **unk}
        return {"tokenizer_class": T5_TOKENIZER_CLASS, **unk}


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
        for part in _split_special(text, self._special.get):
            ids.extend([part] if isinstance(part, int) else self._encode_words(part))
        return ids

    def _encode_words(self, text: str) -> list[int]:
        words = (word.translate(CPM_TRANSLATION) for word in self._jieba.cut(text, cut_all=False))
        return self._processor.encode(" ".join(words))

    def decode(self, ids: Sequence[int]) -> str:
        return _decode_runs(ids, self._special_names.get, self._decode_pieces)

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


def _split_special(text: str, special_id: Callable[[str], int | None]) -> list[str | int]:
    """`text` cut into plain-text parts and the ids of the special tokens in it (<...> spellings)."""
    parts, start = [], 0
    for match in re.finditer(r"<[^<>\s]+>", text):
        token_id = special_id(match[0])
        if token_id is None:
            continue
        if match.start() > start:
            parts.append(text[start:match.start()])
        parts.append(token_id)
        start = match.end()
    if start < len(text):
        parts.append(text[start:])
    return parts


def _decode_runs(ids: Sequence[int], special_name: Callable[[int], str | None],
                 decode_pieces: Callable[[list[int], bool], str]) -> str:
    """Special ids by name, the runs of ordinary ids between them by `decode_pieces(run, is_first)`."""
    out, run = [], []
    for token_id in map(int, ids):
        name = special_name(token_id)
        if name is None:
            run.append(token_id)
            continue
        if run:
            out.append(decode_pieces(run, not out))
            run = []
        out.append(name)
    if run:
        out.append(decode_pieces(run, not out))
    return "".join(out)


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


def bert_wordpiece(vocab_file: str, lowercase: bool = True, strip_accents: bool | None = None,
                   chinese_chars: bool = True) -> tokenizers.Tokenizer:
    """BERT's WordPiece tokenizer over `vocab_file` exactly as transformers' BertTokenizerFast builds it: the
    BERT normaliser (CJK characters split off, lower-casing and accent stripping), BERT's pre-tokeniser."""
    vocab = read_vocab_txt(vocab_file)
    missing = [token for token in WORDPIECE_REQUIRED_TOKENS if token not in vocab]
    if missing:
        raise UserError(f"{vocab_file}: a BERT vocab.txt needs the special tokens {list(WORDPIECE_REQUIRED_TOKENS)}, "
                        f"one per line; it lacks {missing}. Add them (train_tokenizer --type=wordpiece or "
                        "--type=char writes them) or pass the model's own vocab.txt")
    tokenizer = tokenizers.Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=chinese_chars,
                                                      strip_accents=strip_accents, lowercase=lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece(prefix="##")
    tokenizer.add_special_tokens([token for token in WORDPIECE_SPECIAL_TOKENS if token in vocab])
    return tokenizer


def read_vocab_txt(vocab_file: str) -> dict[str, int]:
    """vocab.txt: one token per line, its id the line number (as transformers' load_vocab reads it)."""
    try:
        with open(vocab_file, encoding="utf-8") as f:
            lines = f.read().split("\n")
    except UnicodeDecodeError as e:
        raise UserError(f"{vocab_file}: not a UTF-8 vocab.txt ({e}); pass a BERT vocab.txt, one token a line") from None
    if lines and lines[-1] == "":
        lines.pop()
    vocab = {}
    for index, token in enumerate(lines):
        vocab[token] = index  # transformers keeps the last id of a repeated line too
    return vocab


def tokenizer_config(directory: Path) -> dict:
    """The directory's tokenizer_config.json ({} when there is none)."""
    config_file = directory / "tokenizer_config.json"
    if not config_file.is_file():
        return {}
    try:
        return json.loads(config_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{config_file}: not valid JSON ({e}); repair it or remove it") from None


def wordpiece_tokenizer(vocab_file: Path, path: str) -> WordPieceTokenizer:
    """A vocab.txt, lower-cased as transformers' default unless a tokenizer_config.json beside it says not."""
    config = tokenizer_config(vocab_file.parent)
    options = {"do_lower_case": config.get("do_lower_case", True), "strip_accents": config.get("strip_accents"),
               "tokenize_chinese_chars": config.get("tokenize_chinese_chars", True)}
    tokenizer = bert_wordpiece(str(vocab_file), options["do_lower_case"], options["strip_accents"],
                               options["tokenize_chinese_chars"])
    return WordPieceTokenizer(tokenizer, path, str(vocab_file), options)


def huggingface_tokenizer(json_file: str, path: str) -> HuggingFaceTokenizer:
    try:
        tokenizer = tokenizers.Tokenizer.from_file(json_file)
    except Exception as e:  # tokenizers raises a bare Exception for JSON that is no tokenizer
        raise UserError(f"--tokenizer={path}: {json_file} is not a Hugging Face tokenizer.json ({str(e)[:120]}); "
                        "pass a tokenizer.json, or GPT-2's vocab.json with its merges.txt beside it") from None
    if isinstance(tokenizer.model, models.WordPiece):
        return WordPieceTokenizer(tokenizer, path)
    return HuggingFaceTokenizer(tokenizer, path)


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


def _bpe_pair(p: Path) -> tuple[Path, Path] | None:
    """(vocab, merges) of GPT-2 BPE files in directory `p`, or beside the file `p` (either of the pair)."""
    directory = p if p.is_dir() else p.parent
    for vocab, merges in OPENAI_BPE_FILE_PAIRS:
        if (p.is_dir() or p.name in (vocab, merges)) and (directory / vocab).is_file() and \
                (directory / merges).is_file():
            return directory / vocab, directory / merges
    return None


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """Loads the tokenizer at `path` (see the module docstring for what it may be)."""
    path = str(path)
    if path.startswith("cpm:"):
        tokenizer = cpm_tokenizer(path[len("cpm:"):])
        tokenizer.path = path
        return tokenizer
    p = Path(path)
    if p.is_dir() and tokenizer_config(p).get("tokenizer_class") in CPM_TOKENIZER_CLASSES:
        return cpm_tokenizer(path)
    if p.is_dir() and (p / "tokenizer.json").is_file():
        return huggingface_tokenizer(str(p / "tokenizer.json"), path)
    if p.exists() and (pair := _bpe_pair(p)):
        return HuggingFaceTokenizer(openai_bpe(str(pair[0]), str(pair[1])), path)
    if p.is_dir() and (p / "vocab.txt").is_file():
        return wordpiece_tokenizer(p / "vocab.txt", path)
    if p.is_dir():
        sp_models = sorted(p.glob("*.model"))
        if len(sp_models) == 1:
            return SentencePieceTokenizer(str(sp_models[0]), path)
    elif p.is_file() and p.suffix == ".json":
        return huggingface_tokenizer(path, path)
    elif p.is_file() and p.suffix == ".txt":
        return wordpiece_tokenizer(p, path)
    elif p.is_file() and p.suffix == ".model":
        return SentencePieceTokenizer(path, path)
    raise UserError(
        f"--tokenizer={path}: not a tokenizer. Expected a directory with a tokenizer.json (Hugging Face), "
        "vocab.json+merges.txt, encoder.json+vocab.bpe or gpt2-vocab.json+gpt2-merges.txt (GPT-2 BPE), "
        "vocab.txt (BERT WordPiece) or one *.model (sentencepiece), the path of such a file, "
        "or cpm:PATH for CPM's tokenizer")


RECORD_FORMAT = "t5x_like.tokenizer/1"
T5_TOKENIZER_CLASS = "T5Tokenizer"


def cache_root() -> Path:
    """Where t5x_like caches what it builds or unpacks: `$T5X_LIKE_CACHE`, default `~/.cache/t5x_like`."""
    return Path(os.environ.get("T5X_LIKE_CACHE") or Path.home() / ".cache" / "t5x_like")


def hf_tokenizer_files(tokenizer: Tokenizer, family_config: dict | None = None) -> dict[str, bytes]:
    """The files of a Hugging Face tokenizer directory for `tokenizer`, tokenizer_config.json included: the
    tokenizer's own entries over `family_config` (a model family's special tokens and length). Its `extra_ids`
    (T5's sentinels above the tokenizer's ids, `<extra_id_0>` the highest) stay as T5Tokenizer's `extra_ids`, and
    become added tokens at those ids for every other tokenizer class."""
    config = dict(family_config or {})
    extra_ids = config.pop("extra_ids", 0)
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
    prefix = "cpm:" if path.startswith("cpm:") else ""
    return prefix + os.path.abspath(path[len(prefix):])


def recorded_tokenizer_path(record: dict | str | None) -> str | None:
    """A path `load_tokenizer` opens for a recorded tokenizer: its files unpacked once into the cache
    (`cache_root()/tokenizers/<sha256>`), or, for records older than the files, the path it recorded."""
    if record is None or isinstance(record, str):
        return record
    if "files" not in record:
        return record["path"]
    directory = cache_root() / "tokenizers" / record["sha256"]
    if not directory.is_dir():
        directory.parent.mkdir(parents=True, exist_ok=True)
        tmp = tempfile.mkdtemp(prefix=f".{record['sha256'][:12]}-", dir=directory.parent)
        for name, contents in record["files"].items():
            Path(tmp, name).write_bytes(base64.b64decode(contents))
        try:
            os.rename(tmp, directory)
        except OSError:  # another process unpacked it first
            shutil.rmtree(tmp, ignore_errors=True)
    return str(directory)
