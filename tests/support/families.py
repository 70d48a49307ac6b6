"""One tiny configuration per registered family (models.FAMILIES), the lengths its kind reads, and batches for it.

Tests that check something every family must do (train, shard, save, convert) take the family's model from here,
so the suite compiles one model per family where it used to compile dozens of near-identical ones, and a new
family joins those tests by adding its line (tests/t5x_like/test_every_family.py fails until it does).
Sizes: 2 layers; the decoder-only families 64 wide with 8 heads of 8 (Llama: 4 key/value heads) and an MLP of 128,
so tensor=8 splits them; T5 and BERT 32 wide with 4 heads of 8 and an MLP of 64. A 256-id vocabulary padded to a
multiple of 128, float32, no dropout.
"""
from __future__ import annotations


import numpy as np

import models
from models.bert import BertConfig, RobertaConfig
from models.gpt2 import GPT2Config
from models.llama import LlamaConfig
from models.neox import NeoXConfig
from models.t5 import T5Config

VOCAB = 256
SIZES = dict(vocab_size=VOCAB, num_layers=2, num_heads=4, embed_dim=32, mlp_dim=64, dropout_rate=0.0,
             vocab_pad_multiple=128, dtype="float32")
DECODER = dict(SIZES, max_len=16, attention_dropout_rate=0.0, num_heads=8, embed_dim=64, mlp_dim=128)
ENCODER = dict(SIZES, max_len=32, attention_dropout_rate=0.0)

TINY: dict[str, models.FamilyConfig] = {
    "gpt2": GPT2Config(**DECODER),
    "neox": NeoXConfig(**DECODER),
    "llama": LlamaConfig(**DECODER, num_key_value_heads=4),
    "t5": T5Config(**SIZES, num_decoder_layers=2, d_kv=8, feed_forward="gated-gelu", tie_word_embeddings=False),
    "bert": BertConfig(**ENCODER),
    "roberta": RobertaConfig(**{**ENCODER, "max_len": 34}),
}
"""family -> its tiny config."""

LENGTHS = {"decoder_only": {"targets": 16}, "encoder_decoder": {"inputs": 16, "targets": 8},
           "encoder_only": {"inputs": 16}}
"""kind -> the feature lengths a tiny model of that kind trains on."""
TOTAL_STEPS = 20
"""The schedule's length for every run (whatever its number of steps), so runs on one mesh share a compiled step."""


def lengths_of(config: models.FamilyConfig) -> dict[str, int]:
    return dict(LENGTHS[models.family_of(config).kind])


def batches(lm, lengths: dict[str, int], batch_size: int, count: int, seed: int = 0) -> list[dict[str, np.ndarray]]:
    """`count` packed batches for any kind of model: each row holds two documents side by side (segment ids 1 and
    2, positions restarting at 0; an encoder-decoder's k-th encoder document pairs with its k-th decoder one), each
    counting up from a random start by a random stride (1-3) through the ids 1..vocab-1, a target the id after its
    input, every token scored."""
    rng = np.random.default_rng(seed)
    spec = lm.batch_spec(lengths, batch_size, packed=True)
    vocab = lm.config.vocab_size
    out = []
    for _ in range(count):
        starts, strides = rng.integers(1, vocab, (batch_size, 2)), rng.integers(1, 4, (batch_size, 2))
        out.append({name: _feature(name, s.shape, s.dtype, starts, strides, vocab) for name, s in spec.items()})
    return out


def _feature(name: str, shape, dtype, starts: np.ndarray, strides: np.ndarray, vocab: int) -> np.ndarray:
    rows, length = shape
    half = length // 2
    segment = np.where(np.arange(length) < half, 0, 1)  # which document each position holds
    position = np.arange(length) - half * segment
    if np.dtype(dtype) == np.float32:  # loss weights
        return np.ones(shape, np.float32)
    if "segment_ids" in name:
        return np.broadcast_to(segment + 1, shape).astype(np.int32)
    if "positions" in name:
        return np.broadcast_to(position, shape).astype(np.int32)
    if "token_types" in name:
        return np.zeros(shape, np.int32)
    offset = 1 if "target" in name else 0
    ids = starts[:, segment] - 1 + strides[:, segment] * (position + offset)
    return (1 + ids % (vocab - 1)).astype(np.int32)


def train(config: models.FamilyConfig, mesh, rules: str, data: list[dict[str, np.ndarray]], **settings):
    """Train `config` on `data` (one batch a step) on `mesh`: (per-step metrics as floats, the final state)."""
    import jax

    from t5x_like import optim
    from t5x_like.experiment import build_experiment

    optimizer = optim.make_optimizer(learning_rate=3e-3, warmup_steps=0, total_steps=TOTAL_STEPS)
    batch_size = len(next(iter(data[0].values())))
    exp = build_experiment(model=config, mesh=mesh, rules=rules, optimizer=optimizer, batch_size=batch_size,
                           feature_lengths=lengths_of(config), **settings)
    state = exp.init_state()
    history = []
    with exp.partitioner.activate():
        for batch in data:
            state, metrics = exp.train_step(state, exp.global_batch(batch))
            history.append({k: float(v) for k, v in jax.device_get(metrics).items() if np.ndim(v) == 0})
    return history, state

