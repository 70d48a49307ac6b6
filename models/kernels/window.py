"""The sliding-window argument every attention path takes, checked in one place (kept apart from the Pallas
kernels so that checking it imports no Pallas)."""
from __future__ import annotations

import numbers


def check_window(window: int | None, causal: bool) -> int | None:
    """The window as an int, after checking that it is a positive integer on causal attention (every
    attention path, models.attention's included, checks it here)."""
    if window is None:
        return None
    if isinstance(window, bool) or not isinstance(window, numbers.Integral) or window < 1:
        raise ValueError(f"attention window {window!r} must be a positive int (keys per query, itself "
                         "included), or None for no window.")
    if not causal:
        raise ValueError(f"attention window {window} needs causal=True: a sliding window is causal "
                         "(each query sees its last `window` keys).")
    return int(window)
