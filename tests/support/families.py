"""One tiny configuration per registered family (models.FAMILIES), the lengths its kind reads, and batches for it.

Tests that check something every family must do (train, shard, save, convert) take the family's model from here,
so the suite compiles one model per family where it used to compile dozens of near-identical ones. Nothing here
names a family: a family's tiny model is its smallest preset (configs/<family>.py; so its own options, e.g. T5
v1.1's gated MLP and untied head) at its kind's sizes, and a new family joins those tests as soon as it registers.
Sizes: 2 layers; the decoder-only families 64 wide with 8 heads of 8 (4 key/value heads where the family groups
them) and an MLP of 128, so tensor=8 splits them; encoder-decoders and encoders 32 wide with 4 heads of 8 and an
MLP of 64. A 256-id vocabulary padded to a multiple of 128, float32, no dropout.
"""
from __future__ import annotations

import dataclasses

import numpy as np

import configs
import models

VOCAB = 256
SIZES = dict(vocab_size=VOCAB, num_layers=2, num_heads=4, embed_dim=32, mlp_dim=64, dropout_rate=0.0,
             vocab_pad_multiple=128, dtype="float32")
DECODER = dict(SIZES, max_len=16, attention_dropout_rate=0.0, num_heads=8, embed_dim=64, mlp_dim=128)
ENCODER = dict(SIZES, max_len=32, attention_dropout_rate=0.0)
SHAPES = {"decoder_only": DECODER, "encoder_decoder": SIZES, "encoder_only": ENCODER}
"""kind -> the sizes of its tiny models."""


def smallest_preset(family: str) -> dict:
    """The values of the family's preset with the fewest layers, then the narrowest (the first such)."""
    presets = [configs.get_model_config(name).to_dict() for name in configs.PRESETS]
    return min((p for p in presets if p["family"] == family), key=lambda p: (p["num_layers"], p["embed_dim"]))


def tiny(family: str) -> models.FamilyConfig:
    """The family's smallest preset at its kind's sizes, with what those sizes imply for the fields a family
    may have: half as many key/value heads as heads, a decoder stack as deep as the encoder's, heads as wide as
    embed_dim / num_heads, and positions past the padding id's offset."""
    entry = models.FAMILIES[family]
    fields = {f.name for f in dataclasses.fields(entry.config)}
    values = {**smallest_preset(family), **SHAPES[entry.kind]}
    implied = {"num_key_value_heads": values["num_heads"] // 2, "num_decoder_layers": values["num_layers"],
               "d_kv": values["embed_dim"] // values["num_heads"],
               "max_len": values.get("max_len", 0) + values.get("position_offset", 0)}
    return models.config_from_dict({**values, **{k: v for k, v in implied.items() if k in fields}})


TINY: dict[str, models.FamilyConfig] = {family: tiny(family) for family in models.FAMILIES}
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
    from t5x_like.experiment import ExperimentSettings, build_experiment

    optimizer = optim.OptimizerSettings(learning_rate=3e-3, warmup_steps=0)
    batch_size = len(next(iter(data[0].values())))
    exp = build_experiment(ExperimentSettings(model=config, mesh=mesh, rules=rules, optimizer=optimizer,
                                              batch_size=batch_size, feature_lengths=lengths_of(config), **settings),
                           train_steps=TOTAL_STEPS)
    state = exp.init_state()
    history = []
    with exp.partitioner.activate():
        for batch in data:
            state, metrics = exp.train_step(state, exp.global_batch(batch))
            history.append({k: float(v) for k, v in jax.device_get(metrics).items() if np.ndim(v) == 0})
    return history, state

