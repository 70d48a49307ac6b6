"""The operative configuration: every parameter a run uses, defaults included, as gin text.

gin's own `operative_config_str()` lists only what has run and `config_str()` only what the files bind;
`operative_config_str` here walks the configurables the roots (a run's settings: `train`, `data.make_source`,
`build_experiment`) reach through their bindings and defaults, so it can be printed (--print_config) and recorded
(MODEL_DIR/operative_config.gin) before anything runs.
gin has no public API for its registry, so this reads `gin.config._REGISTRY`."""
from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Iterator, Sequence

import gin
from gin import config as gin_config

from t5x_like.config import bindings


def operative_config_str(roots: Sequence[str]) -> str:
    """Gin text for every macro and every parameter of each configurable in `roots` and what they reach (through
    bound references, configurable defaults and default instances of configurable classes), bound or default;
    parameters without a default and not bound are left out."""
    lines = ["# Macros"]
    lines += [f"{name} = {_format(value)}" for name, value in sorted(bindings.macro_values().items())]
    for configurable in _reachable(roots):
        short = _short_name(configurable)
        lines += ["", f"# {short}"]
        for name, value in _parameters(configurable):
            lines.append(f"{short}.{name} = {_format(value)}")
    return "\n".join(lines) + "\n"


def _reachable(roots: Sequence[str]) -> Iterator[gin_config.Configurable]:
    seen: set[str] = set()
    queue = [gin_config._REGISTRY.get_match(root) for root in roots]
    while queue:
        configurable = queue.pop(0)
        if configurable is None or configurable.selector in seen:
            continue
        seen.add(configurable.selector)
        yield configurable
        for _, value in _parameters(configurable, with_denylisted=True):
            queue.append(_configurable_of(value))


def _parameters(configurable, with_denylisted: bool = False) -> list[tuple[str, Any]]:
    """(name, bound value or default) for each parameter, in signature order."""
    fn = configurable.wrapped
    signature = inspect.signature(fn.__init__ if inspect.isclass(fn) else fn)
    bound = bindings.written(configurable.selector)
    denied = set(configurable.denylist or ())
    out = []
    for name, p in signature.parameters.items():
        if name == "self" or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if name in denied and not with_denylisted:
            continue
        if name in bound:
            out.append((name, bound[name]))
        elif p.default is not p.empty:
            out.append((name, p.default))
    return out


def _configurable_of(value: Any) -> gin_config.Configurable | None:
    """The configurable a value refers to: a @reference, a configurable function, or an instance of a
    configurable class; None otherwise (and for macros)."""
    if isinstance(value, gin_config.ConfigurableReference):
        return None if value.configurable.name == "macro" else value.configurable
    target = value if callable(value) and not dataclasses.is_dataclass(value) else type(value)
    for _, configurable in gin_config._REGISTRY.items():
        if target is configurable.wrapper or target is configurable.wrapped:
            return configurable
    return None


def _short_name(configurable) -> str:
    """The name gin files use: `name` alone when unambiguous, else `module.name`."""
    return gin_config._REGISTRY.minimal_selector(configurable.selector)


def _format(value: Any) -> str:
    if isinstance(value, gin_config.ConfigurableReference):
        return repr(value)
    if value is gin.REQUIRED:
        return "%gin.REQUIRED"
    configurable = _configurable_of(value)
    if configurable is not None:
        call = "" if callable(value) and not dataclasses.is_dataclass(value) else "()"
        return f"@{_short_name(configurable)}{call}"
    return repr(value)
