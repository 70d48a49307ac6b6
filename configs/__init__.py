"""Model presets by name: '<family>_<size>', e.g. 'gpt2_small'."""
import ml_collections

from configs import gpt2
from t5x_like.errors import UserError

_FAMILIES = {"gpt2": gpt2}


def get_model_config(name: str) -> ml_collections.ConfigDict:
    """The preset named '<family>_<size>' (e.g. 'gpt2_tiny', 'gpt2_xl')."""
    family, _, size = name.partition("_")
    if family not in _FAMILIES:
        known = [f"{f}_{s}" for f, module in _FAMILIES.items() for s in module.SIZES]
        raise UserError(f"model preset {name!r} is unknown; known presets: {known}.")
    return _FAMILIES[family].get_config(size)
