"""The family registry (models.FAMILIES), the presets (configs/) and the converters (convert/hf.py)
agree: every family has presets and a converter, every preset and converter names a registered family."""
import dataclasses

import pytest

import configs
import models
from t5x_like.convert import hf

# What convert/hf.py asks of every family's converter module.
CONVERTER_INTERFACE = ("HF_MODEL_TYPE", "TIED", "layout", "config_to_hf", "config_from_hf", "tokenizer_config")


def test_every_family_has_presets_and_a_converter_and_nothing_else():
    preset_families = {configs.get_model_config(name).family for name in configs.PRESETS}
    assert preset_families == set(models.FAMILIES)
    assert set(hf.FAMILIES) == set(models.FAMILIES)
    for name, converter in hf.FAMILIES.items():
        missing = [f for f in CONVERTER_INTERFACE if not hasattr(converter, f)]
        assert not missing, f"t5x_like/convert/{name}.py lacks {missing}"
    hf_types = [t for converter in hf.FAMILIES.values() for t in hf.hf_model_types(converter)]
    assert len(set(hf_types)) == len(hf_types)


@pytest.mark.parametrize("name", configs.PRESETS)
def test_every_preset_builds_its_familys_config(name):
    config = models.config_from_dict(configs.get_model_config(name).to_dict())
    assert isinstance(config, models.FAMILIES[config.family].config)
    assert dataclasses.asdict(config)["family"] == config.family
    assert name.partition("_")[0] in (config.family, "pythia", "cpm", "llama2", "llama3", "mistral", "qwen2")


@pytest.mark.parametrize("name", ["pythia_20b", "neox_70m", "gpt2_160m", "llama_7b", "llama3_13b", "pythia"])
def test_unknown_presets_are_refused_with_the_list(name):
    with pytest.raises(ValueError, match=r"unknown; known presets: \[.*'pythia_160m'.*'neox_20b'"):
        configs.get_model_config(name)
