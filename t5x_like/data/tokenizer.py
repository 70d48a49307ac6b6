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
  - a directory with CPM-2's `vocab.txt` (it ends with the sentinels `<s_0>` ... `<s_189>`), or that file:
    CPM-2's tokenizer (ModelCenter's CPM2Tokenizer: jieba words, then the longest pieces of the vocabulary),
  - a directory with `vocab.txt`, or a `*.txt` vocabulary file (BERT WordPiece, as transformers'
    BertTokenizerFast; lower-cased unless a tokenizer_config.json beside it says `"do_lower_case": false`),
  - a directory with exactly one `*.model`, or a `*.model` file (sentencepiece).
`gpt2_chinese:PATH` (a vocab.txt or its directory) reads and writes documents in GPT2-Chinese's layout
(t5x_like/data/layouts.py). Documents are encoded without special tokens; the end-of-document id is the tokenizer's own
(`<|endoftext|>`, `</s>`, else `[SEP]`; CPM's `<eod>`) and is appended by the caller.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path

import sentencepiece
import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers

from t5x_like.data import cpm2_tokenizer, layouts
from t5x_like.data.cpm2_tokenizer import CPM2Tokenizer, cpm2_vocab_file
from t5x_like.data.cpm_tokenizer import CPM_TOKENIZER_CLASSES, cpm_tokenizer
from t5x_like.data.tokenizer_base import (EOD_TOKENS, Tokenizer, decode_runs, find_eod, split_special,
                                          tokenizer_config)
from t5x_like.data.tokenizer_files import T5_TOKENIZER_CLASS
from t5x_like.errors import UserError


OPENAI_BPE_FILE_PAIRS = (("vocab.json", "merges.txt"), ("encoder.json", "vocab.bpe"),
                         ("gpt2-vocab.json", "gpt2-merges.txt"))


WORDPIECE_SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


WORDPIECE_REQUIRED_TOKENS = ("[UNK]", "[CLS]", "[SEP]", "[MASK]")


NUM_SENTINELS = 100
"""T5's sentinels above a sentencepiece model's pieces: `<extra_id_i>` = pieces + NUM_SENTINELS - 1 - i."""


SENTINEL = re.compile(r"<extra_id_(\d+)>")


KEPT_CONFIG = ("tokenizer_class", "bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token",
               "mask_token", "additional_special_tokens", "add_bos_token", "add_eos_token", "chat_template",
               "model_max_length")
"""The entries of a tokenizer folder's tokenizer_config.json that a tokenizer.json loaded from it keeps, and writes
again wherever it is saved (a checkpoint's record, `convert to-hf`): its class, its special tokens, how they are
added and its length, so an import followed by an export keeps every special token (Llama's `<s>`, `</s>`,
`<unk>`) and adds none the original lacked."""


class HuggingFaceTokenizer(Tokenizer):
    """A `tokenizers.Tokenizer` (byte-level BPE for GPT-2 and GPT-NeoX)."""

    def __init__(self, tokenizer: tokenizers.Tokenizer, path: str, eos_token: str | None = None,
                 folder_config: dict | None = None):
        self._tokenizer = tokenizer
        self.path = path
        self._kept_config = {k: v for k, v in (folder_config or {}).items() if k in KEPT_CONFIG}
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        specials = frozenset(t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special)
        self.eod_id = find_eod(path, tokenizer.token_to_id, eos_token, specials)
        self.bos_id = leading_special_id(tokenizer)
        # The vocabulary, not the JSON serialisation, which varies with the `tokenizers` version.
        vocabulary = sorted(tokenizer.get_vocab(with_added_tokens=True).items(), key=lambda item: item[1])
        self.sha256 = hashlib.sha256(json.dumps(vocabulary).encode()).hexdigest()

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        encodings = self._tokenizer.encode_batch_fast(list(texts), add_special_tokens=False)
        return [e.ids for e in encodings]

    def encode_prompt(self, text: str) -> list[int]:
        """With the tokenizer's post-processor (Llama's tokenizer.json puts its BOS first, as transformers does)."""
        return self._tokenizer.encode(text, add_special_tokens=True).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=False)

    def token_to_id(self, token: str) -> int | None:
        return self._tokenizer.token_to_id(token)

    def id_to_token(self, token_id: int) -> str:
        return self._tokenizer.id_to_token(token_id)

    @property
    def own_special_tokens(self) -> bool:
        """Whether its folder's tokenizer_config.json said which special tokens it has (more than its class)."""
        return bool(set(self._kept_config) - {"tokenizer_class"})

    def hf_files(self) -> dict[str, bytes]:
        return {"tokenizer.json": self._tokenizer.to_str().encode()}

    def hf_tokenizer_config(self) -> dict:
        return {"tokenizer_class": "PreTrainedTokenizerFast", **self._kept_config}


def leading_special_id(tokenizer: tokenizers.Tokenizer) -> int | None:
    """The id the post-processor puts before a text and nothing else (Llama's `<s>` / `<|begin_of_text|>`); None
    when it adds nothing (GPT-2, GPT-NeoX) or more than a first token (BERT's [CLS] text [SEP])."""
    bare = tokenizer.encode(_PROBE, add_special_tokens=False).ids
    processed = tokenizer.encode(_PROBE, add_special_tokens=True).ids
    return processed[0] if len(processed) == len(bare) + 1 and processed[1:] == bare else None


_PROBE = "Hello world"


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
        for part in split_special(text, self._sentinel_id):
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
        return decode_runs(ids, self._sentinel_name, self._decode_pieces)

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


def wordpiece_tokenizer(vocab_file: Path, path: str) -> WordPieceTokenizer:
    """A vocab.txt, lower-cased as transformers' default unless a tokenizer_config.json beside it says not."""
    check_bert_vocab(vocab_file)
    config = tokenizer_config(vocab_file.parent)
    options = {"do_lower_case": config.get("do_lower_case", True), "strip_accents": config.get("strip_accents"),
               "tokenize_chinese_chars": config.get("tokenize_chinese_chars", True)}
    tokenizer = bert_wordpiece(str(vocab_file), options["do_lower_case"], options["strip_accents"],
                               options["tokenize_chinese_chars"])
    return WordPieceTokenizer(tokenizer, path, str(vocab_file), options)


def check_bert_vocab(vocab_file: Path) -> None:
    """A vocab.txt that is not CPM-2's is read as BERT's: one that is not BERT's either is named with what each
    vocabulary holds, or with what CPM-2's does when it was meant as CPM-2's (cpm2_tokenizer.meant_as_cpm2)."""
    pieces = cpm2_tokenizer.read_vocab(vocab_file)
    lacks = [token for token in WORDPIECE_REQUIRED_TOKENS if token not in set(pieces)]
    if not lacks or not pieces:
        return
    if cpm2_tokenizer.meant_as_cpm2(pieces, vocab_file.parent):
        raise UserError(f"{vocab_file}: not CPM-2's vocabulary: {cpm2_tokenizer.shortfall(pieces)[0]}; "
                        f"{cpm2_tokenizer.EXPECTED}. Give that file, or a folder holding it.")
    raise UserError(f"{vocab_file}: neither a BERT vocab.txt (it lacks {', '.join(lacks)}: BERT's holds "
                    f"{', '.join(WORDPIECE_REQUIRED_TOKENS)}, one a line) nor CPM-2's ({cpm2_tokenizer.EXPECTED}); "
                    "pass the model's own vocab.txt (train_tokenizer --type=wordpiece or --type=char writes a BERT "
                    "one).")


def huggingface_tokenizer(json_file: str, path: str) -> HuggingFaceTokenizer:
    try:
        tokenizer = tokenizers.Tokenizer.from_file(json_file)
    except Exception as e:  # tokenizers raises a bare Exception for JSON that is no tokenizer
        raise UserError(f"--tokenizer={path}: {json_file} is not a Hugging Face tokenizer.json ({str(e)[:120]}); "
                        "pass a tokenizer.json, or GPT-2's vocab.json with its merges.txt beside it") from None
    if isinstance(tokenizer.model, models.WordPiece):
        return WordPieceTokenizer(tokenizer, path)
    folder = Path(json_file).parent
    return HuggingFaceTokenizer(tokenizer, path, configured_eos_token(folder), tokenizer_config(folder))


def configured_eos_token(directory: Path) -> str | None:
    """The eos_token of the tokenizer_config.json beside a tokenizer.json (a string, or {"content": ...})."""
    eos = tokenizer_config(directory).get("eos_token")
    return eos.get("content") if isinstance(eos, dict) else eos


def _bpe_pair(p: Path) -> tuple[Path, Path] | None:
    """(vocab, merges) of GPT-2 BPE files in directory `p`, or beside the file `p` (either of the pair)."""
    directory = p if p.is_dir() else p.parent
    for vocab, merges in OPENAI_BPE_FILE_PAIRS:
        if (p.is_dir() or p.name in (vocab, merges)) and (directory / vocab).is_file() and \
                (directory / merges).is_file():
            return directory / vocab, directory / merges
    return None


def load_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """Loads the tokenizer at `path` (see the module docstring for what it may be), in the document layout a
    `gpt2_chinese:` prefix or its tokenizer_config.json's `document_layout` names (t5x_like/data/layouts.py)."""
    layout, path = layouts.split_prefix(str(path))
    tokenizer = _load(path)
    layout = layout or layouts.configured(path)
    return tokenizer if layout is None else layouts.with_layout(tokenizer, layout, f"{layout}:{path}")


def load_user_tokenizer(name: str, path: str) -> Tokenizer:
    """`load_tokenizer(path)` for a path the user gave as `name`: a file the tokenizer libraries cannot read is
    a UserError naming it, not a traceback."""
    try:
        return load_tokenizer(path)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - tokenizers / sentencepiece raise plain Exceptions for bad files
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"{name}={path}: not a readable tokenizer ({reason}); give the tokenizer.json, GPT-2 "
                        "BPE files, vocab.txt or sentencepiece .model the data was made with.") from None


def _load(path: str) -> Tokenizer:
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
    if p.exists() and (cpm2_vocab := cpm2_vocab_file(p)):
        return CPM2Tokenizer(cpm2_vocab, path)
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
