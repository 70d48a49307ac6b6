"""`make_source`: the one entry point the trainer and eval tools call for batches, for every objective (the
objective's module in t5x_like/data/objectives/ makes them from a SourceRequest and its own settings)."""
from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable, Mapping
from typing import Any

from t5x_like.data.loader import BatchSource
from t5x_like.data.objectives import objective as objective_module
from t5x_like.data.objectives.common import SourceRequest
from t5x_like.data.rampup import BatchRampup
from t5x_like.errors import UserError
from t5x_like.features import PairEnds


@dataclasses.dataclass(frozen=True, init=False)
class SourceSettings:
    """What a run's data is read with (gin: data.make_source.*): OBJECTIVE, DATA_PATH, BLEND_WEIGHTS, TOKENIZER,
    DATA_SPLIT, PACKING, the loader's worker processes, and the objective's own settings (`options`: span
    corruption's noise_density, masked-LM's mask_rate, classification's labels, causal-LM's tfds_name, ...)."""

    objective: str
    data_path: str | list[str] | dict | None
    blend_weights: list[float] | None
    tokenizer: str | None
    data_split: str
    packing: bool
    worker_count: int
    options: Mapping[str, Any]

    def __init__(self, *, objective: str = "causal_lm", data_path: str | list[str] | dict | None = None,
                 blend_weights: list[float] | None = None, tokenizer: str | None = None, data_split: str = "949,50,1",
                 packing: bool = False, worker_count: int = 0, **options):
        values = dict(objective=objective, data_path=data_path, blend_weights=blend_weights, tokenizer=tokenizer,
                      data_split=data_split, packing=packing, worker_count=worker_count, options=options)
        for name, value in values.items():
            object.__setattr__(self, name, value)


def make_source(split: str, settings: SourceSettings | None = None, *, batch_size: int,
                feature_lengths: dict[str, int], seed: int, shard_index: int, shard_count: int,
                rampup: BatchRampup | None = None, pair_ends: Callable[[int], PairEnds] | None = None) -> BatchSource:
    """This host's batches of `split` ('train' | 'validation' | 'test'): `batch_size` rows of every global
    batch, made by OBJECTIVE's module from the data `settings` (default: the builtin corpus, causal LM; every
    objective takes DATA_PATH, BLEND_WEIGHTS, TOKENIZER, DATA_SPLIT, PACKING, worker_count, and each its own
    options). `rampup`: the training split's batch-size ramp-up (BATCH_SIZE_RAMPUP, of the global batch).
    `pair_ends`: the model's (its LanguageModel's source_settings give it; see features.PairEnds)."""
    settings = settings or SourceSettings()
    module = objective_module(settings.objective)
    check_settings(module, settings.objective, settings.options)
    request = SourceRequest(split, batch_size=batch_size, feature_lengths=feature_lengths, seed=seed,
                            shard_index=shard_index, shard_count=shard_count, data_path=settings.data_path,
                            blend_weights=settings.blend_weights, tokenizer=settings.tokenizer,
                            data_split=settings.data_split, packing=settings.packing,
                            worker_count=settings.worker_count, rampup=rampup, pair_ends=pair_ends)
    return module.make_source(request, **settings.options)


def check_settings(module, objective: str, settings: dict) -> None:
    """A setting the objective does not take is named with the ones it does, instead of a TypeError."""
    own = [name for name in inspect.signature(module.make_source).parameters if name != "request"]
    unknown = sorted(set(settings) - set(own))
    if unknown:
        raise UserError(f"data.make_source.{unknown[0]}: OBJECTIVE={objective!r} has no setting {unknown[0]!r}; its "
                        f"own settings: {', '.join(own) or 'none'} (besides DATA_PATH, TOKENIZER, DATA_SPLIT, "
                        "BLEND_WEIGHTS, PACKING).")


def tokenizer_vocab_size(*, objective: str = "causal_lm", data_path=None, tokenizer: str | None = None,
                         **settings) -> int:
    """The vocabulary size of `make_source`'s batches for these arguments, without reading any batch: the
    tokenizer's, plus what the objective adds (T5's sentinels, masked-LM's [CLS]/[SEP]/[MASK])."""
    module = objective_module(objective)
    wanted = inspect.signature(module.vocab_size).parameters
    return module.vocab_size(data_path=data_path, tokenizer=tokenizer,
                             **{k: v for k, v in settings.items() if k in wanted})


def check_model_vocabulary(model_vocab_size: int, data_vocab_size: int, tokenizer: str | None) -> None:
    """UserError when the data's ids (`tokenizer`'s, with what the objective adds) do not all fit the model's
    vocabulary: training and --print_config refuse such a run alike."""
    if data_vocab_size > model_vocab_size:
        raise UserError(
            f"the tokenizer ({tokenizer}) has {data_vocab_size} ids but the model's vocab_size is {model_vocab_size}; "
            f"give the model the tokenizer's vocabulary (--gin.model_config.vocab_from_tokenizer=True, or "
            f"--gin.model_config.overrides=\"{{'vocab_size': {data_vocab_size}}}\") or use the model's own tokenizer.")
