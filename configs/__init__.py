"""Model presets by name, e.g. 'gpt2_small', 'pythia_160m', 'neox_20b', 't5_base', 't5_1_1_xl' (T5 v1.1
sizes are named '1_1_<size>' within the t5 family), 'bert_base', 'roberta_large', 'llama3_8b', 'mistral_7b', 'qwen2_0_5b'. A name's prefix picks
the family's preset module (configs/<family>.py, which lists its full names in PRESETS)."""
import functools

import ml_collections

from configs import bert, gpt2, llama, neox, t5
from configs.errors import PresetError

_MODULES = {"gpt2": gpt2, "cpm": gpt2, "pythia": neox, "neox": neox, "t5": t5, "bert": bert, "roberta": bert,
            **{prefix: llama for prefix in llama.PREFIXES}}
"""Preset-name prefix -> the module holding those presets."""
_GETTERS = {"gpt2": gpt2.get_config, "cpm": gpt2.get_config, "pythia": neox.get_config, "neox": neox.get_config,
            "t5": t5.get_config, "bert": bert.bert_config, "roberta": bert.roberta_config,
            **{prefix: functools.partial(llama.get_config, prefix) for prefix in llama.PREFIXES}}
"""Preset-name prefix -> the function giving the preset of a size (the name's rest)."""

PRESETS = tuple(name for module in dict.fromkeys(_MODULES.values()) for name in module.PRESETS)


def get_model_config(name: str) -> ml_collections.ConfigDict:
    """The preset named '<prefix>_<size>' (e.g. 'gpt2_tiny', 'pythia_1.4b', 'neox_20b', 't5_1_1_base', 'cpm_1')."""
    prefix, _, size = name.partition("_")
    module = _MODULES.get(prefix)
    if module is None or name not in module.PRESETS:
        raise PresetError(f"model preset {name!r} is unknown; known presets: {list(PRESETS)}.")
    return _GETTERS[prefix](size)
