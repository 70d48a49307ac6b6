"""Tokenize a corpus once into a token file (P.bin + P.idx + P.json) that training reads many times.

    python -m t5x_like.data.preprocess --input=pile/train/*.jsonl.zst --output_prefix=data/pile \\
        --tokenizer=/data/gpt-neox-20b-tokenizer/20B_tokenizer.json --workers=16

Inputs are files, directories (searched recursively) and globs, comma-separated; `.gz` / `.zst` are read
transparently; formats are those of `t5x_like.data.formats`. The corpus is streamed: memory stays bounded
whatever its size. Documents are tokenized in `--workers` processes (one tokenizer thread each) while this
process reads and writes; output order is input order. Writing is atomic: an interrupted or failed run
leaves no token file that opens as complete.

Each document is written as Megatron-LM's tools/preprocess_data.py writes it with the same tokenizer: the
tokenizer's beginning-of-text id first where it has one (Tokenizer.bos_id: the `<s>` / `<|begin_of_text|>` a
tokenizer.json's post-processor puts first, which Megatron's HuggingFaceTokenizer gets from transformers' default
encoding; `--no_bos` leaves it out), the text's ids, then its end-of-document id (`--noappend_eod` leaves it out).
"""
from __future__ import annotations

import collections
import contextlib
import multiprocessing
import os
import signal
import time
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import tqdm
from absl import flags

from t5x_like import checks
from t5x_like.data import formats
from t5x_like.data.token_file import TokenFileError, TokenFileWriter, token_dtype
from t5x_like.data.tokenizer import Tokenizer, load_tokenizer, load_user_tokenizer
from t5x_like.data.tokenizer_files import tokenizer_record
from t5x_like.errors import UserError, exit_on_user_error, run_absl_app

FLAGS = flags.FLAGS
CHUNK_CHARS = 1 << 20  # characters of text per task sent to a worker
CHUNK_DOCUMENTS = 4096

_worker_tokenizer: Tokenizer | None = None


def chunks(documents: Iterable[str]) -> Iterator[list[str]]:
    """Consecutive documents grouped into lists of about CHUNK_CHARS characters."""
    chunk, size = [], 0
    for document in documents:
        chunk.append(document)
        size += len(document)
        if size >= CHUNK_CHARS or len(chunk) >= CHUNK_DOCUMENTS:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


def _init_worker(tokenizer_path: str) -> None:
    global _worker_tokenizer
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one thread per worker: --workers decides the cores
    _worker_tokenizer = load_tokenizer(tokenizer_path)


def _encode_chunk(texts: list[str], append_eod: bool, add_bos: bool,
                  dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    ids, lengths = _worker_tokenizer.encode_documents(texts, append_eod, add_bos)
    return ids.astype(dtype), lengths


@contextlib.contextmanager
def workers_ignoring_ctrl_c() -> Iterator[None]:
    """Workers started inside are born ignoring SIGINT (an ignored signal stays ignored across exec, and Python
    then installs no KeyboardInterrupt handler; spawn's children do not keep a blocked mask), so Ctrl-C, which
    reaches the whole process group, is the parent's alone: it stops them. The parent ignores it only while the
    workers are launched (milliseconds; a Ctrl-C then is dropped, and the next one acts)."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def encode_in_workers(documents: Iterable[str], tokenizer_path: str, append_eod: bool, add_bos: bool,
                      dtype: np.dtype, workers: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """(ids, lengths) per chunk of documents, in order, with at most 2 chunks per worker in flight."""
    context = multiprocessing.get_context("spawn")
    with workers_ignoring_ctrl_c():
        pool = context.Pool(workers, initializer=_init_worker, initargs=(tokenizer_path,))
    with pool:
        pending: collections.deque = collections.deque()
        for chunk in chunks(documents):
            pending.append(pool.apply_async(_encode_chunk, (chunk, append_eod, add_bos, dtype)))
            if len(pending) >= 2 * workers:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


class VocabularyCheckedWriter(TokenFileWriter):
    """A TokenFileWriter that refuses to finish a file holding an id outside the tokenizer's vocabulary."""

    def __init__(self, prefix: str, dtype: np.dtype, metadata: dict, tokenizer: Tokenizer):
        super().__init__(prefix, dtype, metadata)
        self.tokenizer = tokenizer

    def _finish(self) -> None:
        if self.max_id >= self.tokenizer.vocab_size:
            raise TokenFileError(f"{self.prefix}: the tokenizer {self.tokenizer.path} produced id {self.max_id}, "
                                 f"outside its own {self.tokenizer.vocab_size}-id vocabulary; nothing was written")
        super()._finish()


OUTPUT_SUFFIXES = (".bin", ".idx", ".json")


def refuse_writing_over_inputs(output_prefix: str, paths: Sequence[str]) -> None:
    """Refuse an --output_prefix whose files would replace one of the files being read (`--input=arr.json
    --output_prefix=arr` would write the metadata over its own input)."""
    inputs = {os.path.realpath(p): p for p in paths}
    for suffix in OUTPUT_SUFFIXES:
        if (read := inputs.get(os.path.realpath(output_prefix + suffix))) is not None:
            raise UserError(f"--output_prefix={output_prefix} would write {output_prefix}{suffix} over the input "
                            f"{read}; choose another prefix, e.g. --output_prefix={output_prefix}_tokens")


def preprocess(inputs: Sequence[str], output_prefix: str, tokenizer_path: str, *, fmt: str = "auto",
               json_keys: Sequence[str] = ("text",), append_eod: bool = True, bos: bool = True,
               workers: int = 1, decode_errors: str = "strict", progress: bool = False) -> dict:
    """Tokenizes `inputs` into the token file `output_prefix` (each document after the tokenizer's beginning-of-text
    id when `bos` and it has one); returns its metadata plus timing."""
    checks.positive_int("--workers", workers)
    checks.output_prefix("--output_prefix", output_prefix, OUTPUT_SUFFIXES)
    paths = formats.expand_inputs(inputs)
    refuse_writing_over_inputs(output_prefix, paths)
    tokenizer = load_user_tokenizer("--tokenizer", tokenizer_path)
    dtype = token_dtype(tokenizer.vocab_size)
    add_bos = bos and tokenizer.bos_id is not None
    metadata = {"tokenizer": tokenizer_record(tokenizer), "append_eod": append_eod, "add_bos": add_bos,
                "sources": [os.path.abspath(p) for p in paths]}
    stats = collections.Counter()
    documents = formats.read_documents(paths, fmt, json_keys, decode_errors, stats)
    start = time.perf_counter()
    with VocabularyCheckedWriter(output_prefix, dtype, metadata, tokenizer) as writer, \
            tqdm.tqdm(unit=" docs", disable=not progress, smoothing=0.1) as bar:
        for ids, lengths in encode_in_workers(documents, tokenizer_path, append_eod, add_bos, dtype, workers):
            writer.write(ids, lengths)
            bar.update(len(lengths))
            bar.set_postfix_str(f"{writer.num_tokens / max(bar.format_dict['elapsed'], 1e-9):,.0f} tokens/s",
                                refresh=False)
    seconds = time.perf_counter() - start
    return {"num_documents": writer.num_documents, "num_tokens": writer.num_tokens, "seconds": seconds,
            "dtype": dtype.name, "files": len(paths), "max_id": writer.max_id, "vocab_size": tokenizer.vocab_size,
            "byte_order_marks": stats["bom"], "nul_warning": formats.nul_warning(stats, "were tokenized as text"),
            "document_layout": document_layout(tokenizer, append_eod, add_bos)}


def document_layout(tokenizer: Tokenizer, append_eod: bool, add_bos: bool) -> str:
    """What each document holds, for the summary: 'each document: <s> (BOS, id 1), its text, </s> (EOD, id 2) ...'."""
    if tokenizer.bos_id is None:
        parts, note = [], "; the tokenizer has no beginning-of-text token"
    else:
        bos = f"{tokenizer.id_to_token(tokenizer.bos_id)} (BOS, id {tokenizer.bos_id})"
        parts, note = ([bos], " (--no_bos leaves the BOS out)") if add_bos else ([], f"; --no_bos left out {bos}")
    parts.append("its text")
    if append_eod:
        parts.append(f"{tokenizer.id_to_token(tokenizer.eod_id)} (EOD, id {tokenizer.eod_id})")
    return "each document: " + ", ".join(parts) + note


def unusual_characters(summary: dict) -> list[str]:
    """Lines for the summary about what the corpus held that users rarely mean to train on."""
    lines = []
    if summary["byte_order_marks"]:
        lines.append(f"note: {summary['byte_order_marks']:,} UTF-8 byte-order marks (U+FEFF) opening files or "
                     "documents were dropped, as utf-8-sig readers drop them")
    if summary["nul_warning"]:
        lines.append(summary["nul_warning"])
    return lines


@exit_on_user_error
def main(argv: list[str]) -> None:
    del argv
    summary = preprocess(FLAGS.input, FLAGS.output_prefix, FLAGS.tokenizer, fmt=FLAGS.format,
                         json_keys=FLAGS.json_keys, append_eod=FLAGS.append_eod, bos=not FLAGS.no_bos,
                         workers=FLAGS.workers, decode_errors=FLAGS.decode_errors, progress=True)
    seconds = summary["seconds"]
    print(f"{FLAGS.output_prefix}.bin/.idx/.json: {summary['num_documents']:,} documents, "
          f"{summary['num_tokens']:,} tokens ({summary['dtype']}, ids 0..{summary['max_id']} of the "
          f"{summary['vocab_size']:,}-id vocabulary) from {summary['files']} files in "
          f"{seconds:.1f}s: {summary['num_documents'] / seconds:,.0f} documents/s, "
          f"{summary['num_tokens'] / seconds:,.0f} tokens/s")
    print(summary["document_layout"])
    for line in unusual_characters(summary):
        print(line)


def define_flags() -> None:
    flags.DEFINE_list("input", None, "Files, directories or globs (comma-separated).", required=True)
    flags.DEFINE_string("output_prefix", None, "Writes PREFIX.bin, PREFIX.idx, PREFIX.json.", required=True)
    flags.DEFINE_string("tokenizer", None, "GPT-2 BPE dir, tokenizer.json or sentencepiece .model.",
                        required=True)
    flags.DEFINE_enum("format", "auto", formats.FORMATS, "Input format; auto decides from file names.")
    flags.DEFINE_list("json_keys", ["text"], "JSON keys whose values (joined by a blank line) form a document.")
    flags.DEFINE_bool("append_eod", True, "Append the tokenizer's end-of-document id to every document.")
    flags.DEFINE_bool("no_bos", False, "Leave out the beginning-of-text id that otherwise opens every document when "
                      "the tokenizer has one (a tokenizer whose post-processor puts a BOS such as <s> or "
                      "<|begin_of_text|> first).")
    flags.DEFINE_integer("workers", max(1, (os.cpu_count() or 2) - 1), "Tokenizer processes.")
    flags.DEFINE_enum("decode_errors", "strict", ["strict", "replace"],
                      "Bytes that are not UTF-8: stop with an error naming file:line, or replace with U+FFFD.")


if __name__ == "__main__":
    define_flags()
    run_absl_app(exit_on_user_error(main))
