"""WikiText perplexity as Megatron-LM's zero-shot evaluation computes it (its detokenizer, overlapping windows,
the GPT-2 paper's word-level adjusted perplexity), and the loss over a preprocessed token file."""
from __future__ import annotations

import re

import numpy as np

from t5x_like.data import loader
from t5x_like.errors import UserError
from t5x_like.eval.scoring import Scorer, safe_exp, score_stream

_WIKITEXT_RULES: tuple[tuple[str, str, bool], ...] = (
    # (pattern, replacement, is_regex), applied in order; Megatron-LM's zero-shot detokenizer.
    ("s '", "s'", False),
    (" @-@ ", "-", False),
    (" @,@ ", ",", False),
    (" @.@ ", ".", False),
    (" : ", ": ", False),
    (" ; ", "; ", False),
    (" . ", ". ", False),
    (" ! ", "! ", False),
    (" ? ", "? ", False),
    (" , ", ", ", False),
    (r"\(\s*([^\)]*?)\s*\)", r"(\1)", True),
    (r"\[\s*([^\]]*?)\s*\]", r"[\1]", True),
    (r"{\s*([^}]*?)\s*}", r"{\1}", True),
    (r"\"\s*([^\"]*?)\s*\"", r'"\1"', True),
    (r"'\s*([^']*?)\s*'", r"'\1'", True),
    ("= = = =", "====", False),
    ("= = =", "===", False),
    ("= =", "==", False),
    (" \u00b0 ", "\u00b0", False),
    (" \n", "\n", False),
    ("\n ", "\n", False),
    (" N ", " 1 ", False),
    (" 's", "'s", False),
)


def wikitext_detokenize(text: str) -> str:
    """Undo WikiText's tokenization (@-@ number separators, spaced punctuation, brackets, quotes,
    '= = heading = =' markers), as Megatron-LM does before GPT-2 tokenization."""
    for pattern, replacement, is_regex in _WIKITEXT_RULES:
        text = re.sub(pattern, replacement, text) if is_regex else text.replace(pattern, replacement)
    return text


def count_original_tokens(text: str) -> int:
    """WikiText's own token count (the denominator of the GPT-2 paper's perplexities)."""
    return len(text.strip().split(" "))


def evaluate_wikitext(scorer: Scorer, tokenizer, path: str, seq_len: int, stride: int,
                      max_windows: int | None = None, bos_id: int | None = None) -> dict:
    """Perplexity of the detokenized text in strided windows. With `bos_id` (the tokenizer's beginning-of-text
    id) the text is scored as its tokenizer's users encode it, that id first (transformers' perplexity guide,
    lm-eval's rolling windows, Megatron with a Llama tokenizer): the text's first token is predicted from it
    and is scored too; the later windows start inside the text."""
    text = read_text(path)
    num_original = count_original_tokens(text)
    tokens = np.asarray(tokenizer.encode(wikitext_detokenize(text)), np.int32)
    stream = tokens if bos_id is None else np.concatenate([np.asarray([bos_id], np.int32), tokens])
    nll, scored = score_stream(scorer, stream, seq_len, stride, "wikitext", max_windows)
    loss = nll / scored
    words_scored = num_original - (1 if bos_id is None else 0)  # the first word is predicted only after a BOS
    result = {"task": "wikitext", "loss": loss, "ppl": safe_exp(loss), "adjusted_ppl": safe_exp(nll / words_scored),
              "num_tokenized_tokens": len(tokens), "num_original_tokens": num_original,
              "seq_len": seq_len, "stride": stride}
    if scored < len(stream) - 1:  # a partial pass has no word-level count to compare with
        result.update(adjusted_ppl=None, num_scored_tokens=scored)
    return result


def evaluate_tokens(scorer: Scorer, prefix: str, seq_len: int, stride: int, vocab_size: int, *,
                    split: str | None = None, data_split: str | None = None, max_windows: int | None = None) -> dict:
    """Loss over a token file's documents back to back: all of them, or one split of them under
    `data_split` (the training run's DATA_SPLIT), or its first `max_windows` windows."""
    from t5x_like.data import open_token_file

    file = open_token_file(prefix)
    tokens = file.tokens
    if split is not None:
        first, last = loader.split_documents(data_split, file.num_documents, split, prefix)
        tokens = tokens[file.offsets[first]:file.offsets[last]]
    largest = int(tokens.max(initial=0))
    if largest >= vocab_size:
        raise UserError(f"token file {prefix} holds id {largest} but the model's vocab_size is {vocab_size}; "
                        "it was made with another tokenizer. Re-run preprocess with the model's tokenizer.")
    nll, scored = score_stream(scorer, tokens, seq_len, stride, "tokens", max_windows)
    loss = nll / scored
    result = {"task": "tokens", "loss": loss, "ppl": safe_exp(loss), "num_tokens": len(tokens),
              "num_scored_tokens": scored, "seq_len": seq_len, "stride": stride}
    if split is not None:
        result.update(split=split, data_split=data_split)
    return result


def read_text(path: str) -> str:
    """The file's text; bytes that are not UTF-8 (a binary file) are a user error naming the file."""
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except UnicodeDecodeError as e:
        raise UserError(f"--data={path}: byte {e.start} is not UTF-8 (a binary file?); give a UTF-8 text file "
                        "(a token file is --task=tokens with its prefix).") from None
