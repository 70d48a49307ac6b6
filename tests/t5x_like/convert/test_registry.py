"""The three registries are derived from the family modules (issue 42) and agree.

models.FAMILIES, configs' presets and convert's converters are found by importing the modules of their packages
and reading what each declares (models/registry.py): a module dropped into a package joins its registry, one
that declares nothing is no family. Every family has presets and a converter, every preset and converter names
a registered family, and a family's presets live in the configs module named as its models module."""
import dataclasses
import importlib
import re
import sys
import textwrap

import pytest

import configs
import models
import t5x_like.convert
from models import registry
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


def module_name(module) -> str:
    return module.__name__.rpartition(".")[2]


@pytest.mark.parametrize("name", configs.PRESETS)
def test_every_preset_builds_a_config_of_the_models_module_named_as_its_presets_module(name):
    config = models.config_from_dict(configs.get_model_config(name).to_dict())
    assert isinstance(config, models.FAMILIES[config.family].config)
    assert dataclasses.asdict(config)["family"] == config.family
    presets_module = configs.owners(configs.preset_modules())[name]
    assert module_name(presets_module) == module_name(importlib.import_module(type(config).__module__))


@pytest.mark.parametrize("name", ["pythia_20b", "neox_70m", "gpt2_160m", "llama_7b", "llama3_13b", "pythia"])
def test_unknown_presets_are_refused_with_the_sorted_list(name):
    with pytest.raises(ValueError, match=r"unknown; known presets: \[.*'neox_20b'.*'pythia_160m'") as error:
        configs.get_model_config(name)
    listed = re.findall(r"'([^']+)'", str(error.value).partition("known presets:")[2])
    assert listed == sorted(configs.PRESETS)


def test_an_unknown_family_is_refused_with_the_sorted_list():
    with pytest.raises(ValueError, match=re.escape(f"known families: {sorted(models.FAMILIES)}")):
        models.config_from_dict({"family": "gemma"})


FAMILY_MODULE = '''
    import dataclasses

    import flax.linen as nn

    from models.config import DecoderOnlyConfig
    from models.registry import Family


    @dataclasses.dataclass(frozen=True)
    class DroppedConfig(DecoderOnlyConfig):
        family: str = "{name}"
        vocab_size: int = 16


    class Dropped(nn.Module):
        config: DroppedConfig


    FAMILIES = {{"{name}": Family(DroppedConfig, Dropped, "{kind}")}}
    '''


@pytest.fixture
def dropped(tmp_path, monkeypatch):
    """drop(package, module, source): `module` written to a folder added to `package`'s path, as if it were a
    file of the package; forgotten (by sys.modules and the package) after the test."""
    dropped_modules = []

    def drop(package, module: str, source: str) -> None:
        folder = tmp_path / package.__name__
        folder.mkdir(exist_ok=True)
        (folder / f"{module}.py").write_text(textwrap.dedent(source))
        if str(folder) not in package.__path__:
            monkeypatch.setattr(package, "__path__", [*package.__path__, str(folder)])
        importlib.invalidate_caches()
        dropped_modules.append((package, module))

    yield drop
    for package, module in dropped_modules:
        sys.modules.pop(f"{package.__name__}.{module}", None)
        if hasattr(package, module):
            delattr(package, module)


def test_a_family_module_dropped_into_models_joins_the_registry_and_a_module_declaring_none_does_not(dropped):
    dropped(models, "zz_family", FAMILY_MODULE.format(name="zz", kind="decoder_only"))
    dropped(models, "zz_helpers", "WIDTH = 3\n")
    families = registry.discover_families("models")
    assert families == {**models.FAMILIES, "zz": families["zz"]} and list(families) == sorted(families)
    assert families["zz"].config.__name__ == "DroppedConfig" and families["zz"].kind == "decoder_only"
    declaring = registry.declaring_modules("models", registry.DECLARATION)
    assert "zz_family" in declaring and "zz_helpers" not in declaring
    assert not {"attention", "config", "registry", "layers", "kernels"} & set(declaring)


@pytest.mark.parametrize("name, kind, says", [
    ("zz", "decoder", r"kind 'decoder'; choose one of \['decoder_only', 'encoder_decoder', 'encoder_only'\]"),
    ("yy", "decoder_only", r"family 'zz' is declared with DroppedConfig, whose `family` default is 'yy'"),
    ("gpt2", "decoder_only", r"declares family 'gpt2', which another module declares too"),
])
def test_a_wrong_declaration_is_refused_naming_its_module(dropped, name, kind, says):
    source = FAMILY_MODULE.format(name=name, kind=kind)
    if name == "yy":  # the entry's name and its config's `family` differ
        source = source.replace('FAMILIES = {"yy"', 'FAMILIES = {"zz"')
    dropped(models, "zz_family", source)
    with pytest.raises((ValueError, TypeError), match=says) as error:
        registry.discover_families("models")
    assert "models.zz_family" in str(error.value)


def test_a_presets_module_dropped_into_configs_joins_the_presets(dropped):
    dropped(configs, "zz", """
        import ml_collections

        PRESETS = ("zz_tiny",)


        def preset(name):
            return ml_collections.ConfigDict(dict(family="zz"))
        """)
    owners = configs.owners(configs.preset_modules())
    assert set(owners) == set(configs.PRESETS) | {"zz_tiny"}
    assert owners["zz_tiny"].preset("zz_tiny").family == "zz"
    assert "configs.errors" not in {module.__name__ for module in configs.preset_modules()}


def test_a_preset_two_modules_declare_is_refused(dropped):
    dropped(configs, "zz", "PRESETS = ('gpt2_tiny',)\n")
    with pytest.raises(ValueError, match=r"preset 'gpt2_tiny' is declared by both configs.gpt2 and configs.zz"):
        configs.owners(configs.preset_modules())


def test_a_converter_dropped_into_convert_joins_the_converters(dropped):
    dropped(t5x_like.convert, "zz", "HF_MODEL_TYPE = 'zz_model'\n")
    converters = registry.declaring_modules("t5x_like.convert", "HF_MODEL_TYPE")
    assert set(converters) == set(hf.FAMILIES) | {"zz"} and converters["zz"].HF_MODEL_TYPE == "zz_model"
    assert not {"hf", "mapping", "__main__"} & set(converters)
