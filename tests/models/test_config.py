"""models/config.py: the decoder-only kind's config holds what every decoder-only family shares and no switch
for one family's option; each option lives in its family's config as a field a checkpoint's config.json records."""
import dataclasses
import json

import pytest

import models
from models.config import DecoderOnlyConfig, FamilyConfig
from models.gpt2 import GPT2Config
from models.llama import LlamaConfig
from models.neox import NeoXConfig

FAMILY_OPTIONS = ("mlp_activation", "gated_mlp", "norm", "qkv_bias", "out_bias", "mlp_bias", "use_parallel_residual",
                  "tie_word_embeddings", "sliding_window")
"""Options once declared as class-level switches on DecoderOnlyConfig for the shared block to read."""


def class_variables(cls) -> set[str]:
    return {name for klass in cls.__mro__ for name, kind in vars(klass).get("__annotations__", {}).items()
            if str(kind).startswith(("ClassVar", "typing.ClassVar"))}


def test_the_decoder_only_config_declares_no_switches():
    assert class_variables(DecoderOnlyConfig) == class_variables(FamilyConfig) == {
        "POSITIVE_FIELDS", "RUN_FIELDS", "HEAD_FIELDS", "HEAD_PARAMS", "ABSENT"}
    assert [name for name in FAMILY_OPTIONS if hasattr(DecoderOnlyConfig, name)] == []
    assert [name for name in FAMILY_OPTIONS if hasattr(GPT2Config(), name)] == []


@pytest.mark.parametrize("config, options", [
    (NeoXConfig(use_parallel_residual=False), {"use_parallel_residual": False}),
    (LlamaConfig(qkv_bias=True, tie_word_embeddings=True), {"qkv_bias": True, "tie_word_embeddings": True}),
    (LlamaConfig(sliding_window=8), {"sliding_window": 8}),
])
def test_a_family_option_is_its_config_field_and_round_trips(config, options):
    fields = {field.name for field in dataclasses.fields(config)}
    assert set(options) <= fields
    assert [name for name in FAMILY_OPTIONS if hasattr(config, name) and name not in fields] == []
    restored = models.config_from_dict(json.loads(json.dumps(dataclasses.asdict(config))))
    assert restored == config and {name: getattr(restored, name) for name in options} == options


def test_families_count_what_their_blocks_hold():
    """A gated MLP has three matrices; a sliding window W < T attends T·W - W(W-1)/2 pairs; the summary notes them."""
    sizes = dict(num_layers=2, num_heads=4, embed_dim=32, mlp_dim=48, vocab_size=100)
    gpt2, llama = GPT2Config(**sizes), LlamaConfig(**sizes)
    assert (gpt2.mlp_params(), llama.mlp_params()) == (2 * 32 * 48, 3 * 32 * 48)
    assert llama.matmul_params() - gpt2.matmul_params() == 2 * 32 * 48
    assert gpt2.attention_pairs(16) == llama.attention_pairs(16) == 128
    assert dataclasses.replace(llama, sliding_window=4).attention_pairs(16) == 16 * 4 - 6
    assert (gpt2.block_notes(), NeoXConfig(**sizes).block_notes()) == ("", ", parallel residual")
