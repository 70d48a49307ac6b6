"""Train a byte-level BPE (tokenizer.json) or sentencepiece (.model) tokenizer on a corpus.

    python -m t5x_like.data.train_tokenizer --input=corpus/ --output=tok/tokenizer.json --vocab_size=32000
    python -m t5x_like.data.train_tokenizer --input=train.jsonl.zst --type=sentencepiece \\
        --output=tok/spiece.model --vocab_size=32000

Inputs and formats are those of `t5x_like.data.preprocess`. The EOD token is `<|endoftext|>` (BPE) or
`</s>` (sentencepiece). Pass the output path as `--tokenizer` to preprocess, train, eval and generate.
"""
from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterable
from pathlib import Path

import sentencepiece
import tokenizers
from absl import app, flags
from tokenizers import decoders, models, pre_tokenizers, trainers

from t5x_like.data import formats
from t5x_like.data.tokenizer import EOD_TOKENS
from t5x_like.errors import UserError, exit_on_user_error

FLAGS = flags.FLAGS
SENTENCEPIECE_MAX_LINES = 10_000_000  # sentencepiece holds its training lines in memory


def train_byte_level_bpe(texts: Iterable[str], vocab_size: int) -> tokenizers.Tokenizer:
    """A GPT-2-style byte-level BPE with `<|endoftext|>` as id 0 and at most `vocab_size` ids."""
    tokenizer = tokenizers.Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOD_TOKENS[0]], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer


def train_sentencepiece(texts: Iterable[str], vocab_size: int, output: str) -> None:
    """A sentencepiece unigram model with T5's special ids (<pad>=0, </s>=1, <unk>=2) written to `output`,
    trained on the texts' non-empty lines (a sample of SENTENCEPIECE_MAX_LINES of them when there are more)."""
    if not output.endswith(".model"):
        raise UserError(f"--output={output}: a sentencepiece model path must end in .model")
    lines = (line for text in texts for line in text.splitlines() if line.strip())
    with tempfile.TemporaryDirectory(dir=Path(output).parent) as tmp:
        try:
            sentencepiece.SentencePieceTrainer.train(
                sentence_iterator=lines, model_prefix=os.path.join(tmp, "model"), vocab_size=vocab_size,
                model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1, byte_fallback=True,
                input_sentence_size=SENTENCEPIECE_MAX_LINES, shuffle_input_sentence=True, minloglevel=1)
        except RuntimeError as e:
            largest = re.search(r"Vocabulary size too high \(\d+\)\. Please set it to a value <= (\d+)", str(e))
            if not largest:
                raise
            raise UserError(f"--vocab_size={vocab_size}: this corpus yields at most {largest[1]} sentencepiece ids; "
                            f"pass --vocab_size={largest[1]} or less, or train on more text.") from None
        os.replace(os.path.join(tmp, "model.model"), output)


@exit_on_user_error
def main(argv: list[str]) -> None:
    del argv
    texts = formats.read_documents(formats.expand_inputs(FLAGS.input), FLAGS.format, FLAGS.json_keys,
                                   FLAGS.decode_errors)
    Path(FLAGS.output).parent.mkdir(parents=True, exist_ok=True)
    if FLAGS.type == "bpe":
        tokenizer = train_byte_level_bpe(texts, FLAGS.vocab_size)
        tmp = f"{FLAGS.output}.tmp{os.getpid()}"
        tokenizer.save(tmp)
        os.replace(tmp, FLAGS.output)
        size = tokenizer.get_vocab_size()
    else:
        train_sentencepiece(texts, FLAGS.vocab_size, FLAGS.output)
        size = FLAGS.vocab_size
    print(f"wrote {FLAGS.output}: {FLAGS.type}, {size} ids")
    if size < FLAGS.vocab_size:
        print(f"note: fewer ids than --vocab_size={FLAGS.vocab_size}: the corpus has no more merges to learn. "
              f"A model for it needs vocab_size >= {size} (model_config.vocab_from_tokenizer=True takes it).")


def define_flags() -> None:
    flags.DEFINE_list("input", None, "Files, directories or globs (comma-separated).", required=True)
    flags.DEFINE_string("output", None, "tokenizer.json (bpe) or NAME.model (sentencepiece).", required=True)
    flags.DEFINE_enum("type", "bpe", ["bpe", "sentencepiece"], "Byte-level BPE or sentencepiece unigram.")
    flags.DEFINE_integer("vocab_size", 32000, "Number of ids, special tokens included.")
    flags.DEFINE_enum("format", "auto", formats.FORMATS, "Input format (see preprocess).")
    flags.DEFINE_list("json_keys", ["text"], "JSON keys whose values form a document.")
    flags.DEFINE_enum("decode_errors", "strict", ["strict", "replace"], "Undecodable bytes: error or U+FFFD.")


if __name__ == "__main__":
    define_flags()
    app.run(exit_on_user_error(main))
