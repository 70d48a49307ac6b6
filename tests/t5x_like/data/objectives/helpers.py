"""What the objectives' tests share: a word-level tokenizer ('w5 w7' -> [5, 7]), sources with small defaults,
and ways to look into rows."""
import numpy as np
import tokenizers
from tokenizers import models, pre_tokenizers

from t5x_like.data.objectives import seq2seq, span_corruption
from t5x_like.data.objectives.common import SourceRequest
from t5x_like.data.objectives.encoder_decoder import NUM_EXTRA_IDS
from t5x_like.data.tokenizer import load_tokenizer

VOCAB = 1000  # synthetic word-level vocabulary: <pad> 0, </s> 1, <unk> 2, w3 .. w999
SENTINEL_0 = VOCAB + NUM_EXTRA_IDS - 1
SMALL = {"inputs": 64, "targets": 14}  # raw examples of 70 tokens (random_spans_helper)


def word_tokenizer(path, extra_ids=()):
    """A word-level tokenizer.json: 'w5 w7' -> [5, 7]; `extra_ids` names pieces placed at the given ids."""
    vocab = {"<pad>": 0, "</s>": 1, "<unk>": 2, **{f"w{i}": i for i in range(3, VOCAB)}}
    for name, piece_id in extra_ids:
        vocab = {k: v for k, v in vocab.items() if v != piece_id} | {name: piece_id}
    tokenizer = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.save(str(path))
    return str(path)


def made_with(tokenizer_path):
    loaded = load_tokenizer(tokenizer_path)
    return {"path": tokenizer_path, "sha256": loaded.sha256, "vocab_size": loaded.vocab_size, "eod_id": loaded.eod_id}


def request(split="train", *, batch_size, feature_lengths, seed=0, shard_index=0, shard_count=1, **common):
    """A SourceRequest; `common` holds its other fields (data_path, tokenizer, packing, ...)."""
    return SourceRequest(split, batch_size=batch_size, feature_lengths=feature_lengths, seed=seed,
                         shard_index=shard_index, shard_count=shard_count, **common)


def span_source(prefix, split="train", *, batch_size=8, feature_lengths=SMALL, **configured):
    return span_corruption.make_source(request(split, batch_size=batch_size, feature_lengths=feature_lengths,
                                               data_path=prefix, **configured))


def pair_source(data_path, split="train", *, batch_size=4, feature_lengths=SMALL, **configured):
    return seq2seq.make_source(request(split, batch_size=batch_size, feature_lengths=feature_lengths,
                                       data_path=data_path, **configured))


def take(src, steps):
    return [next(src) for _ in range(steps)]


def assert_same_batches(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for key in x:
            np.testing.assert_array_equal(x[key], y[key], err_msg=key)


def segments_of(batch, row, side):
    """[tokens of example 1, tokens of example 2, ...] of one row's encoder or decoder (id 0 is only padding)."""
    tokens = batch["encoder_input_tokens" if side == "encoder" else "decoder_target_tokens"][row]
    segment_ids = batch[f"{side}_segment_ids"][row] if f"{side}_segment_ids" in batch else (tokens != 0)
    return [tokens[segment_ids == s] for s in range(1, segment_ids.max() + 1)]


def reconstruct(inputs, targets, first_sentinel=SENTINEL_0):
    """The original tokens: every sentinel of `inputs` replaced by the span after it in `targets`."""
    is_sentinel = lambda t: first_sentinel - 100 < t <= first_sentinel  # noqa: E731
    assert inputs[-1] == 1 and targets[-1] == 1, "both end with EOS"
    inputs, targets = inputs[:-1].tolist(), targets[:-1].tolist()
    spans, sentinel_at = {}, [i for i, t in enumerate(targets) if is_sentinel(t)]
    for start, end in zip(sentinel_at, sentinel_at[1:] + [len(targets)]):
        spans[targets[start]] = targets[start + 1:end]
    out = []
    for token in inputs:
        out.extend(spans.pop(token) if is_sentinel(token) else [token])
    assert not any(spans.values()), "every sentinel of the targets with a span appears in the inputs"
    return out

