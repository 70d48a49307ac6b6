"""Train a tokenizer on a corpus: byte-level BPE (tokenizer.json), sentencepiece (.model), BERT WordPiece or a
character vocabulary (vocab.txt), or CPM's jieba + sentencepiece (spiece.model).

    python -m t5x_like.data.train_tokenizer --input=corpus/ --output=tok/tokenizer.json --vocab_size=32000
    python -m t5x_like.data.train_tokenizer --input=train.jsonl.zst --type=sentencepiece \\
        --output=tok/spiece.model --vocab_size=32000
    python -m t5x_like.data.train_tokenizer --input=corpus/ --type=wordpiece --output=tok/vocab.txt --vocab_size=30522
    python -m t5x_like.data.train_tokenizer --input=train.json --type=char --output=tok/vocab.txt --min_count=2
    python -m t5x_like.data.train_tokenizer --input=zh/ --type=cpm --output=cpm_tok/spiece.model --vocab_size=30000

Inputs and formats are those of `t5x_like.data.preprocess`. The EOD token is `<|endoftext|>` (BPE), `</s>`
(sentencepiece), `[SEP]` (vocab.txt) or `<eod>` (cpm). Pass the output path as `--tokenizer` to preprocess,
train, eval and generate (`cpm:PATH` or the directory for cpm: a tokenizer_config.json naming CpmTokenizer is
written beside the model).
"""
from __future__ import annotations

import collections
import json
import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import sentencepiece
import tokenizers
from absl import app, flags, logging
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from t5x_like import checks
from t5x_like.data import formats
from t5x_like.data.cpm_tokenizer import CPM_TRANSLATION, import_jieba
from t5x_like.data.tokenizer import WORDPIECE_SPECIAL_TOKENS, bert_wordpiece
from t5x_like.data.tokenizer_base import EOD_TOKENS
from t5x_like.errors import UserError, exit_on_user_error

FLAGS = flags.FLAGS
SENTENCEPIECE_MAX_LINES = 10_000_000  # sentencepiece holds its training lines in memory
SENTENCEPIECE_MAX_BYTES = 4192  # sentencepiece's max_sentence_length: it skips longer lines (all: an INTERNAL error)


def train_byte_level_bpe(texts: Iterable[str], vocab_size: int) -> tokenizers.Tokenizer:
    """A GPT-2-style byte-level BPE with `<|endoftext|>` as id 0 and at most `vocab_size` ids."""
    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOD_TOKENS[0]], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


NUL_BECOMES = {"bpe": "were trained on as the byte 0x00",
               "sentencepiece": "have no piece of their own: the model encodes each as the byte piece <0x00>",
               "cpm": "have no piece of their own: the model encodes each as the byte piece <0x00>",
               "wordpiece": "were dropped by BERT's normaliser, as it drops them when it encodes",
               "char": "were dropped by BERT's normaliser, as it drops them when it encodes"}
"""What becomes of NUL characters (U+0000) in the training text, by --type (measured on each trainer)."""
T5_SPECIAL_IDS = dict(pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
CPM_SPECIAL_IDS = dict(unk_id=0, bos_id=1, eos_id=2, pad_id=-1)
CPM_USER_SYMBOLS = ("\u2583", "<sep>", "<pad>", "<mask>", "<eod>", "<eop>", "<cls>")
"""CPM's vocabulary begins <unk>, <s>, </s>, U+2583 (newline), <sep>, <pad>, <mask>, <eod> (CPM-Generate's
chinese_vocab.vocab); <eop> and <cls> complete transformers' CpmTokenizer specials."""


def train_sentencepiece(texts: Iterable[str], vocab_size: int, output: str, special_ids: dict = T5_SPECIAL_IDS,
                        user_symbols: tuple[str, ...] = ()) -> None:
    """A sentencepiece unigram model with T5's special ids (<pad>=0, </s>=1, <unk>=2) written to `output`,
    trained on the texts' non-empty lines (a sample of SENTENCEPIECE_MAX_LINES of them when there are more)."""
    if not output.endswith(".model"):
        raise UserError(f"--output={output}: a sentencepiece model path must end in .model")
    split = [0]
    lines = bounded_lines(texts, SENTENCEPIECE_MAX_BYTES, split)
    with tempfile.TemporaryDirectory(dir=Path(output).parent) as tmp:
        try:
            sentencepiece.SentencePieceTrainer.train(
                sentence_iterator=lines, model_prefix=os.path.join(tmp, "model"), vocab_size=vocab_size,
                model_type="unigram", byte_fallback=True, user_defined_symbols=list(user_symbols),
                input_sentence_size=SENTENCEPIECE_MAX_LINES, shuffle_input_sentence=True, minloglevel=1,
                max_sentence_length=SENTENCEPIECE_MAX_BYTES, **special_ids)
        except RuntimeError as e:
            smallest = re.search(r"Vocabulary size is smaller than required_chars\. \d+ vs (\d+)", str(e))
            if smallest:
                raise UserError(f"--vocab_size={vocab_size}: this corpus needs at least {smallest[1]} sentencepiece "
                                f"ids (its characters, the 256 byte pieces and the special ones); pass "
                                f"--vocab_size={smallest[1]} or more.") from None
            largest = re.search(r"Vocabulary size too high \(\d+\)\. Please set it to a value <= (\d+)", str(e))
            if not largest:
                raise
            raise UserError(f"--vocab_size={vocab_size}: this corpus yields at most {largest[1]} sentencepiece ids; "
                            f"pass --vocab_size={largest[1]} or less, or train on more text.") from None
        os.replace(os.path.join(tmp, "model.model"), output)
    if split[0]:
        logging.warning("%d lines longer than %d bytes (sentencepiece's limit) were cut into pieces at spaces to "
                        "train on", split[0], SENTENCEPIECE_MAX_BYTES)


def bounded_lines(texts: Iterable[str], max_bytes: int, split: list[int]) -> Iterator[str]:
    """The texts' non-empty lines, each of at most `max_bytes` UTF-8 bytes: a longer line is cut at its last
    space before the limit (inside a character-only run, between characters); split[0] counts cut lines."""
    for text in texts:
        for line in text.splitlines():
            if not line.strip():
                continue
            if len(line) * 4 <= max_bytes or len(line.encode()) <= max_bytes:
                yield line
                continue
            split[0] += 1
            data, start = line.encode(), 0
            while start < len(data):
                end = min(start + max_bytes, len(data))
                if end < len(data):
                    space = data.rfind(b" ", start + 1, end)
                    end = space if space > start else end
                    while end > start and data[end] & 0xC0 == 0x80:  # not inside a character's bytes
                        end -= 1
                piece = data[start:end].decode().strip()
                if piece:
                    yield piece
                start = end


def cpm_segmented(texts: Iterable[str]) -> Iterator[str]:
    """The texts as CPM's tokenizer hands them to sentencepiece: jieba words, spaces and newlines inside them
    as U+2582 / U+2583, joined by spaces (one training line per text line, newlines kept as U+2583)."""
    jieba = import_jieba()
    for text in texts:
        for line in text.splitlines(keepends=True):
            yield " ".join(word.translate(CPM_TRANSLATION) for word in jieba.cut(line, cut_all=False))


def train_cpm(texts: Iterable[str], vocab_size: int, output: str) -> None:
    """CPM's tokenizer: sentencepiece trained on jieba-segmented, mapped text (as CPM built its vocabulary),
    and a tokenizer_config.json naming CpmTokenizer beside it, so the directory loads as CPM's tokenizer."""
    train_sentencepiece(cpm_segmented(texts), vocab_size, output, CPM_SPECIAL_IDS, CPM_USER_SYMBOLS)
    write_tokenizer_config(Path(output).parent, {"tokenizer_class": "CpmTokenizer", "eos_token": "<eod>",
                                                 "bos_token": "<eod>", "unk_token": "<unk>"})


def train_wordpiece(texts: Iterable[str], vocab_size: int, lowercase: bool) -> list[str]:
    """A BERT WordPiece vocabulary (BERT's normaliser and pre-tokeniser; [PAD] [UNK] [CLS] [SEP] [MASK] first)."""
    tokenizer = tokenizers.Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(vocab_size=vocab_size, special_tokens=list(WORDPIECE_SPECIAL_TOKENS),
                                        show_progress=False)
    tokenizer.train_from_iterator(texts, trainer)
    return [token for token, _ in sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])]


def character_vocabulary(texts: Iterable[str], vocab_size: int, min_count: int, lowercase: bool) -> list[str]:
    """GPT2-Chinese's character vocabulary: the BERT specials, then every character of the (BERT-normalised)
    corpus seen at least `min_count` times, most frequent first, then `##c` for the characters seen inside a
    word (Latin words and numbers are spelled character by character instead of becoming [UNK])."""
    normalizer, pre_tokenizer = normalizers.BertNormalizer(lowercase=lowercase), pre_tokenizers.BertPreTokenizer()
    counts, inner = collections.Counter(), collections.Counter()
    for text in texts:
        for word, _ in pre_tokenizer.pre_tokenize_str(normalizer.normalize_str(text)):
            counts.update(word)
            inner.update(word[1:])
    by_count = lambda counter: sorted((c for c, n in counter.items() if n >= min_count),  # noqa: E731
                                      key=lambda c: (-counter[c], c))
    vocab = list(WORDPIECE_SPECIAL_TOKENS) + by_count(counts) + [f"##{c}" for c in by_count(inner)]
    return vocab[:vocab_size]


def write_vocab_txt(vocab: list[str], output: str, lowercase: bool) -> None:
    """vocab.txt (one token a line) and a tokenizer_config.json beside it recording the lower-casing."""
    tmp = f"{output}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write("".join(f"{token}\n" for token in vocab))
    os.replace(tmp, output)
    write_tokenizer_config(Path(output).parent, {"tokenizer_class": "BertTokenizer", "do_lower_case": lowercase})
    bert_wordpiece(output, lowercase)  # it loads (a vocabulary without its specials would be named here)


def write_tokenizer_config(directory: Path, config: dict) -> None:
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def fewest_ids(kind: str) -> tuple[int, str]:
    """The fewest ids a tokenizer of `kind` (--type) has, whatever the corpus, and what they are."""
    specials = {"sentencepiece": ["<pad>", "</s>", "<unk>"], "cpm": ["<unk>", "<s>", "</s>", *CPM_USER_SYMBOLS]}
    if kind == "bpe":
        return len(pre_tokenizers.ByteLevel.alphabet()) + 1, f"the 256 byte ids and {EOD_TOKENS[0]}"
    if kind in specials:
        return 256 + len(specials[kind]), (f"the 256 byte pieces and its {len(specials[kind])} special ones; one "
                                           "more per character of the corpus")
    return len(WORDPIECE_SPECIAL_TOKENS) + 1, (f"its special tokens {', '.join(WORDPIECE_SPECIAL_TOKENS)} and a "
                                               "character; one more per character of the corpus")


def check_vocab_size(kind: str, vocab_size: int) -> None:
    """A --vocab_size below what `kind` can give is refused before the corpus is read (or a folder made)."""
    checks.positive_int("--vocab_size", vocab_size)
    fewest, what = fewest_ids(kind)
    if vocab_size < fewest:
        raise UserError(f"--vocab_size={vocab_size}: a --type={kind} tokenizer has at least {fewest} ids ({what}); "
                        f"pass --vocab_size={fewest} or more.")


def train(texts: Iterable[str], kind: str, vocab_size: int, output: str, *, min_count: int = 1,
          lowercase: bool = True) -> int:
    """Trains a tokenizer of `kind` (--type) on `texts`, writes it to `output` and returns its number of ids."""
    if kind == "bpe":
        tokenizer = train_byte_level_bpe(texts, vocab_size)
        tmp = f"{output}.tmp{os.getpid()}"
        tokenizer.save(tmp)
        os.replace(tmp, output)
        return tokenizer.get_vocab_size()
    if kind in ("wordpiece", "char"):
        vocab = train_wordpiece(texts, vocab_size, lowercase) if kind == "wordpiece" else \
            character_vocabulary(texts, vocab_size, min_count, lowercase)
        if len(vocab) > vocab_size:
            raise UserError(f"--vocab_size={vocab_size}: WordPiece keeps every character of this corpus (alone and "
                            f"as ##c) besides its {len(WORDPIECE_SPECIAL_TOKENS)} special tokens, {len(vocab)} ids in "
                            f"all; pass --vocab_size={len(vocab)} or more. Nothing was written.")
        write_vocab_txt(vocab, output, lowercase)
        return len(vocab)
    (train_cpm if kind == "cpm" else train_sentencepiece)(texts, vocab_size, output)
    return vocab_size


@exit_on_user_error
def main(argv: list[str]) -> None:
    del argv
    check_vocab_size(FLAGS.type, FLAGS.vocab_size)
    checks.positive_int("--min_count", FLAGS.min_count)
    checks.output_file("--output", FLAGS.output)
    stats = collections.Counter()
    texts = formats.read_documents(formats.expand_inputs(FLAGS.input), FLAGS.format, FLAGS.json_keys,
                                   FLAGS.decode_errors, stats)
    size = train(texts, FLAGS.type, FLAGS.vocab_size, FLAGS.output, min_count=FLAGS.min_count,
                 lowercase=FLAGS.lowercase)
    print(f"wrote {FLAGS.output}: {FLAGS.type}, {size} ids")
    if warning := formats.nul_warning(stats, NUL_BECOMES[FLAGS.type]):
        print(warning)
    if size < FLAGS.vocab_size:
        reason = "characters" if FLAGS.type == "char" else "merges to learn"
        print(f"note: fewer ids than --vocab_size={FLAGS.vocab_size}: the corpus has no more {reason}. "
              f"A model for it needs vocab_size >= {size} (model_config.vocab_from_tokenizer=True takes it).")


def define_flags() -> None:
    flags.DEFINE_list("input", None, "Files, directories or globs (comma-separated).", required=True)
    flags.DEFINE_string("output", None, "tokenizer.json (bpe), NAME.model (sentencepiece, cpm) or vocab.txt "
                        "(wordpiece, char).", required=True)
    flags.DEFINE_enum("type", "bpe", ["bpe", "sentencepiece", "wordpiece", "char", "cpm"],
                      "Byte-level BPE, sentencepiece unigram, BERT WordPiece, a character vocab.txt "
                      "(GPT2-Chinese), or CPM's jieba + sentencepiece.")
    flags.DEFINE_integer("vocab_size", 32000, "Number of ids, special tokens included (char: at most).")
    flags.DEFINE_integer("min_count", 1, "char: keep the characters seen at least this often.")
    flags.DEFINE_bool("lowercase", True, "wordpiece, char: lower-case (and strip accents), as BERT uncased.")
    flags.DEFINE_enum("format", "auto", formats.FORMATS, "Input format (see preprocess).")
    flags.DEFINE_list("json_keys", ["text"], "JSON keys whose values form a document.")
    flags.DEFINE_enum("decode_errors", "strict", ["strict", "replace"], "Undecodable bytes: error or U+FFFD.")


if __name__ == "__main__":
    define_flags()
    app.run(exit_on_user_error(main))
