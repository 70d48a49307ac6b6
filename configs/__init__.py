"""Model presets by name, e.g. 'gpt2_small', 'pythia_160m', 'neox_20b', 't5_base', 't5_1_1_xl' (T5 v1.1
sizes are named '1_1_<size>' within the t5 family). A name's prefix picks the family's preset module
(configs/<family>.py, which lists its full names in PRESETS)."""
import ml_collections

from configs import gpt2, neox, t5

_MODULES = {"gpt2": gpt2, "pythia": neox, "neox": neox, "t5": t5}
"""Preset-name prefix -> the module holding those presets."""

PRESETS = tuple(name for module in dict.fromkeys(_MODULES.values()) for name in module.PRESETS)


def get_model_config(name: str) -> ml_collections.ConfigDict:
    """The preset named '<prefix>_<size>' (e.g. 'gpt2_tiny', 'pythia_1.4b', 'neox_20b', 't5_1_1_base')."""
    prefix, _, size = name.partition("_")
    module = _MODULES.get(prefix)
    if module is None or name not in module.PRESETS:
        raise ValueError(f"model preset {name!r} is unknown; known presets: {list(PRESETS)}.")
    return module.get_config(size)
