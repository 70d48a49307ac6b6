"""gin's bindings read and written for the gin front-end (t5x_like/config/): values with their macros evaluated,
the arguments a configurable gets, the macros, and the rebinding a command makes (EPOCHS's lengths, compile's mesh).
Library modules get what they need from the RunSettings the front-end resolves (settings.py), never from here."""
from __future__ import annotations

import copy
import inspect
from typing import Any, Callable

import gin
from gin import config as gin_config


def written(configurable: str | Callable) -> dict[str, Any]:
    """What gin binds for `configurable` (a function or its name) as the files wrote it: macros and references
    unevaluated."""
    return gin.get_bindings(configurable, resolve_references=False)


def bound(configurable: str | Callable, *names: str) -> dict[str, Any]:
    """What gin binds for `configurable` (a function or its name), macros and references evaluated; only `names`,
    when given (a reference left out is not called)."""
    return {name: copy.deepcopy(value) for name, value in written(configurable).items() if not names or name in names}


def arguments(configurable: str | Callable, *names: str) -> dict[str, Any]:
    """The arguments gin gives `configurable` (a function or its name): its bindings (evaluated) over its
    signature's defaults; only `names`, when given."""
    fn = gin_config._REGISTRY.get_match(configurable).wrapped if isinstance(configurable, str) else configurable
    defaults = {name: p.default for name, p in inspect.signature(fn).parameters.items()
                if p.default is not inspect.Parameter.empty and (not names or name in names)}
    return {**defaults, **bound(configurable, *names)}


def value(name: str) -> Any:
    """What `name` (configurable.parameter, or %MACRO) is bound to, unevaluated; None when nothing is."""
    try:
        return gin.query_parameter(name)
    except ValueError:
        return None


def macro(name: str) -> Any:
    """The value of the macro `name`; None when no file defines it."""
    return value(f"%{name}")


def defines_macro(name: str) -> bool:
    """Whether a parsed file defines the macro `name` (to None, too)."""
    try:
        gin.query_parameter(f"%{name}")
    except ValueError:
        return False
    return True


def macro_values() -> dict[str, Any]:
    """Every bound macro and its value."""
    return {scope: gin.query_parameter(f"%{scope}") for scope, selector in gin_config._CONFIG
            if selector == "gin.macro"}


def bind(name: str, new: Any) -> None:
    """Bind configurable.parameter `name` to `new` (before gin.finalize())."""
    gin.bind_parameter(name, new)


def bind_macro(name: str, new: Any) -> None:
    """Set the macro `name` to `new` (before gin.finalize())."""
    bind(f"{name}/macro.value", new)


def rebind(name: str, new: Any) -> None:
    """Bind configurable.parameter `name` to `new` after gin.finalize() (which locks the configuration)."""
    with gin.unlock_config():
        bind(name, new)


def config_text() -> str:
    """The files and bindings as given, in gin (what MODEL_DIR/config.gin records)."""
    return gin.config_str()


def every_binding() -> dict[str, str]:
    """Every binding as the files wrote it, by name (macros by their own name, other parameters as
    [scope/]configurable.parameter), each value's repr: what the processes of a job compare."""
    bindings = {}
    for (scope, selector), params in gin_config._CONFIG.items():  # gin has no public API for all bindings
        for param, value in params.items():
            name = scope if selector == "gin.macro" else f"{scope + '/' if scope else ''}{selector}.{param}"
            bindings[name] = repr(value)
    return bindings
