"""Model presets by name: '<family>_<size>', e.g. 'gpt2_small', 't5_base', 't5_1_1_xl' (T5 v1.1
sizes are named '1_1_<size>' within the t5 family)."""
import ml_collections

from configs import gpt2, t5
from t5x_like.errors import UserError

_FAMILIES = {"gpt2": gpt2, "t5": t5}


def get_model_config(name: str) -> ml_collections.ConfigDict:
    """The preset named '<family>_<size>' (e.g. 'gpt2_tiny', 'gpt2_xl', 't5_1_1_base')."""
    family, _, size = name.partition("_")
    if family not in _FAMILIES:
        known = [f"{f}_{s}" for f, module in _FAMILIES.items() for s in module.SIZES]
        raise UserError(f"model preset {name!r} is unknown; known presets: {known}.")
    return _FAMILIES[family].get_config(size)
