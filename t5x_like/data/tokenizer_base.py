"""What every tokenizer offers (text <-> ids, its end-of-document id, its identity, its Hugging Face files), and the
helpers of the ones with special tokens inside text (T5's sentinels, CPM's specials)."""
from __future__ import annotations

import itertools
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from t5x_like.errors import UserError

EOD_TOKENS = ("<|endoftext|>", "<|end_of_text|>", "</s>", "[SEP]")  # GPT-2/NeoX/Qwen2, Llama 3, Llama 2/Mistral/T5, BERT


class Tokenizer:
    """Text <-> ids. `sha256` identifies the vocabulary (stored in token-file metadata and checked)."""

    path: str
    vocab_size: int
    eod_id: int
    sha256: str
    bos_id: int | None = None
    """The beginning-of-text id the tokenizer's own users get before every text (`encode_prompt`; a Llama
    tokenizer.json's post-processor puts it first, as transformers encodes), None where it adds none (GPT-2,
    GPT-NeoX, sentencepiece, CPM). Evaluation puts it before the texts it scores (t5x_like/eval/),
    preprocess before each document (`encode_documents(add_bos=True)`), as Megatron's preprocess_data.py does."""

    num_sentinels: int = 0
    """Sentinels the vocabulary holds itself as its last ids (CPM-2's `<s_0>` ... `<s_189>`); 0: none, and T5's
    objectives add theirs above it (objectives.encoder_decoder.vocabulary_with_sentinels)."""

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        raise NotImplementedError

    def encode_prompt(self, text: str) -> list[int]:
        """A prompt's ids as the tokenizer's own users encode it, special tokens included where the tokenizer
        adds some (a Llama tokenizer.json's beginning-of-text); documents (`encode`) never have them."""
        return self.encode(text)

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

    own_special_tokens: bool = False
    """Whether the tokenizer came with its own tokenizer_config.json saying which special tokens it has: an export
    then writes those (and adds no family defaults, e.g. a bos_token the original has not)."""

    def configured_token_id(self, name: str) -> int | None:
        """The id of the token its tokenizer_config.json entries name as `name` ('bos_token', ...); None without."""
        token = self.hf_tokenizer_config().get(name)
        token = token.get("content") if isinstance(token, dict) else token
        return self.token_to_id(token) if isinstance(token, str) else None

    def encode_documents(self, texts: Sequence[str], append_eod: bool,
                         add_bos: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """The documents' ids back to back (`bos_id` before each when `add_bos`, which needs one; EOD after each
        when `append_eod`) and their lengths."""
        encoded = self.encode_batch(texts)
        if add_bos:
            encoded = [[self.bos_id, *ids] for ids in encoded]
        if append_eod:
            encoded = [ids + [self.eod_id] for ids in encoded]
        lengths = np.fromiter(map(len, encoded), np.int64, len(encoded))
        ids = np.fromiter(itertools.chain.from_iterable(encoded), np.int64, int(lengths.sum()))
        return ids, lengths


def split_special(text: str, special_id: Callable[[str], int | None]) -> list[str | int]:
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


def decode_runs(ids: Sequence[int], special_name: Callable[[int], str | None],
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


def find_eod(path: str, token_to_id, eos_token: str | None = None, specials: frozenset[str] = frozenset()) -> int:
    """The end-of-document id: the folder's own `eos_token` (tokenizer_config.json, which transformers and
    Megatron's HuggingFaceTokenizer take as EOS/EOD) when the vocabulary has it, else the first of EOD_TOKENS that
    is a special token, else the first the vocabulary has at all."""
    if eos_token is not None and token_to_id(eos_token) is not None:
        return token_to_id(eos_token)
    for token in sorted(EOD_TOKENS, key=lambda token: token not in specials):
        token_id = token_to_id(token)
        if token_id is not None:
            return token_id
    raise UserError(f"{path}: tokenizer has no end-of-document token (its tokenizer_config.json's eos_token, or one "
                    f"of {EOD_TOKENS}); add one as a special token")


def tokenizer_config(directory: Path) -> dict:
    """The directory's tokenizer_config.json ({} when there is none)."""
    config_file = directory / "tokenizer_config.json"
    if not config_file.is_file():
        return {}
    try:
        return json.loads(config_file.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{config_file}: not valid JSON ({e}); repair it or remove it") from None
