"""Reading upstream configurations into one table of settings, each remembering where it was written.

Three kinds, told from the content: Megatron-LM / CPM-Pretrain argument lists (a shell script that starts
`pretrain_*.py`, or a file of `--flag value` words), GPT-NeoX YAML configs (several merge as NeoX's
`NeoXArgs.from_ymls` merges them: a key given twice is refused, `-` in names reads as `_`), and DeepSpeed JSON
configs. Names are normalised to NeoX's spelling (`--lr-decay-iters` -> `lr_decay_iters`); nested DeepSpeed
sections flatten to dotted names (`optimizer.params.lr`, `fp16.initial_scale_power`).
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
from typing import Any, Sequence

import yaml

from t5x_like.errors import UserError
from t5x_like.migration import shell

MEGATRON, NEOX, DEEPSPEED = "megatron", "neox", "deepspeed"
DEEPSPEED_KEYS = {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "optimizer",
                  "scheduler", "fp16", "bf16", "zero_optimization", "gradient_clipping", "steps_per_print",
                  "activation_checkpointing", "wall_clock_breakdown", "zero_allow_untested_optimizer", "amp",
                  "tensorboard", "prescale_gradients", "gradient_predivide_factor", "sparse_gradients",
                  "flops_profiler", "zero_force_ds_cpu_optimizer", "communication_data_type"}
"""Top-level keys of a DeepSpeed config (deepspeed.ai/docs/config-json); NeoX configs carry them too."""
WRITTEN_INTO_DEEPSPEED = {"finetune_cpm2": {"train_micro_batch_size_per_gpu": "batch_size",
                                            "gradient_accumulation_steps": "gradient_accumulation_steps"}}
"""Programs that write their flags into the DeepSpeed config before DeepSpeed reads it (CPM-2-Finetune's
finetune_cpm2.py, lines 709-710): DeepSpeed key -> the flag whose value replaces it."""


@dataclasses.dataclass
class Setting:
    key: str  # normalised name
    value: Any
    spelled: str  # as the file writes it: --lr-decay-iters, lr_decay_iters, optimizer.params.lr
    where: str  # file:line
    origin: str | None = None  # where a script's variable that gives the value comes from, and how to change it

    def number(self, kind: type = float) -> int | float:
        """The value as a finite number (`kind` int: a whole one), or a UserError naming where it is written
        and, when a script's variable gives it, where that comes from."""
        value = self.value
        try:
            number = float(value) if not isinstance(value, (bool, list, dict)) and value is not None else None
        except ValueError:
            number = None
        if number is not None and (math.isfinite(number) and (kind is float or number.is_integer())):
            return int(number) if kind is int else number
        wanted = "a whole number" if kind is int else "a finite number" if number is not None else "a number"
        said = "has no value" if value is True else f"{shown_value(value)} is not {wanted}"
        raise UserError(f"{self.where}: {self.spelled} {said}" + (f" ({self.origin})." if self.origin else
                                                                  "; fix the value."))

    def flag(self) -> bool:
        """A boolean: a bare --flag, YAML true/false, or the strings true / false."""
        if isinstance(self.value, bool):
            return self.value
        if str(self.value).lower() in ("true", "false"):
            return str(self.value).lower() == "true"
        raise UserError(f"{self.where}: {self.spelled} {self.value!r} is not true or false; fix the value.")

    def path(self) -> str | None:
        """A path value; None when a flag is given with no value (an empty variable in the script)."""
        return None if self.value is True or self.value == "" else str(self.value)


def shown_value(value: Any) -> str:
    return " ".join(map(str, value)) if isinstance(value, list) else repr(value)


@dataclasses.dataclass
class Upstream:
    """Everything read from the upstream files: `settings` (Megatron or NeoX names, and DeepSpeed's dotted ones),
    which of them a translation used, and notes on what was read but not evaluated."""

    kind: str  # MEGATRON or NEOX: whose names the settings use
    files: list[str]
    settings: dict[str, Setting]
    program: str | None = None  # pretrain_gpt2.py, pretrain_t5.py, ... (Megatron scripts)
    gpus: int | None = None  # processes the launcher starts, when it says
    notes: list[str] = dataclasses.field(default_factory=list)
    used: set[str] = dataclasses.field(default_factory=set)
    allowed: frozenset[str] | None = None  # while a translation runs: the names its rows declare

    def get(self, *keys: str) -> Setting | None:
        """The first of `keys` the files set (marked used, with every other of them the files set)."""
        undeclared = set(keys) - self.allowed if self.allowed is not None else set()
        if undeclared:
            raise AssertionError(f"a translation reads {sorted(undeclared)} without a row declaring them (rows.py)")
        found = [self.settings[k] for k in keys if k in self.settings]
        self.used.update(s.key for s in found)
        return found[0] if found else None

    def value(self, *keys: str, default: Any = None) -> Any:
        setting = self.get(*keys)
        return default if setting is None else setting.value

    def unused(self) -> list[Setting]:
        return [s for k, s in self.settings.items() if k not in self.used]


def read(paths: list[str], deepspeed_config: str | None = None, environ: dict[str, str] | None = None,
         arguments: Sequence[str] = (), gpus: int | None = None) -> Upstream:
    """The upstream files (`paths`, each kind told from its content) and a DeepSpeed config, read into one table:
    a DeepSpeed config's settings take precedence over a script's, as DeepSpeed's engine applies them.
    `arguments` are a Megatron-LM script's own ($1, $2, ...); `gpus`, the GPUs the run used, when the user says
    (migrate --num_gpus): the launcher's count is not read then."""
    kinds = [(path, kind_of(path)) for path in paths]
    primary = {kind for _, kind in kinds if kind != DEEPSPEED}
    if len(primary) != 1:
        found = ", ".join(f"{path} ({kind})" for path, kind in kinds)
        raise UserError(f"give one Megatron-LM argument list (a script or a flags file) or GPT-NeoX YAML configs, "
                        f"and at most DeepSpeed configs besides; got: {found}.")
    kind = primary.pop()
    if arguments and kind != MEGATRON:
        raise UserError(f"the arguments after -- ({' '.join(arguments)}) are a launch script's own ($1, $2, ...), "
                        "and no launch script is given; leave them out for GPT-NeoX configs.")
    upstream = Upstream(kind, paths, {}, gpus=gpus)
    if kind == NEOX:
        merge_neox([p for p, k in kinds if k == NEOX], upstream)
    else:
        [script] = [p for p, k in kinds if k == MEGATRON] or [None]
        read_megatron(script, upstream, environ, arguments)
    deepspeed = [p for p, k in kinds if k == DEEPSPEED] + ([deepspeed_config] if deepspeed_config else [])
    named = upstream.settings.pop("deepspeed_config", None)
    if named is not None:
        upstream.used.add("deepspeed_config")
        if not deepspeed:
            deepspeed = [named_deepspeed_config(named)]
    for path in deepspeed:
        upstream.files.append(path)
        upstream.settings.update(script_first(upstream, flatten(load_mapping(path), path, read_text(path))))
    return upstream


def script_first(upstream: Upstream, deepspeed: dict[str, Setting]) -> dict[str, Setting]:
    """A DeepSpeed config's settings, less those the program overwrites with the script's flags before DeepSpeed
    reads them (WRITTEN_INTO_DEEPSPEED; noted)."""
    written = next((keys for name, keys in WRITTEN_INTO_DEEPSPEED.items() if name in (upstream.program or "")), {})
    kept = {}
    for key, setting in deepspeed.items():
        flag = upstream.settings.get(written.get(key, ""))
        if flag is None:
            kept[key] = setting
        else:
            upstream.notes.append(f"{setting.spelled} {setting.value} ({setting.where}) is not used: "
                                  f"{upstream.program} writes {flag.spelled} {flag.value} ({flag.where}) over it")
    return kept


def named_deepspeed_config(setting: Setting) -> str:
    if not os.path.isfile(str(setting.value)):
        raise UserError(f"{setting.where}: --deepspeed_config {setting.value} does not exist here; pass your copy of it "
                        "with --deepspeed_config=FILE.")
    return str(setting.value)


def read_text(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except FileNotFoundError:
        raise UserError(f"{path}: no such file.") from None
    except UnicodeDecodeError as e:
        raise UserError(f"{path}: byte {e.start} is not UTF-8; give the script or config as text.") from None
    except IsADirectoryError:
        raise UserError(f"{path} is a directory; give a script, a flags file or a config file.") from None


def kind_of(path: str) -> str:
    """MEGATRON (a script or flags), NEOX (a YAML mapping with NeoX's own keys) or DEEPSPEED (only DeepSpeed's)."""
    text = read_text(path)
    if path.endswith((".json", ".yml", ".yaml")):
        mapping = load_mapping(path)
    else:
        mapping = parse_mapping(text) if text.lstrip()[:1] in "{#" else None
    if mapping is None:
        return MEGATRON
    keys = {k.replace("-", "_") for k in mapping}
    if not keys:
        raise UserError(f"{path}: an empty config.")
    return DEEPSPEED if keys <= DEEPSPEED_KEYS else NEOX


def parse_mapping(text: str) -> dict | None:
    try:
        mapping = yaml.safe_load(text)
    except yaml.YAMLError:
        return None
    return mapping if isinstance(mapping, dict) else None


def load_mapping(path: str) -> dict:
    text = read_text(path)
    try:
        mapping = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise UserError(f"{path}{line}: not valid YAML / JSON ({getattr(e, 'problem', e)}); fix the file.") from None
    if not isinstance(mapping, dict):
        raise UserError(f"{path}: expected a mapping of settings ({{\"name\": value, ...}}).")
    return mapping


def merge_neox(paths: list[str], upstream: Upstream) -> None:
    """NeoX's merge of several YAML files: a name a later file repeats as already stored is an error; `-` in a name
    reads as `_` (so NeoX lets `tokenizer-type` replace an earlier `tokenizer_type`, and so does this)."""
    seen: dict[str, str] = {}
    for path in paths:
        text = read_text(path)
        for key, value in load_mapping(path).items():
            if key in seen:
                raise UserError(f"{path}: {key!r} is set again (already in {seen[key]}); NeoX refuses a key two "
                                "files set: keep one.")
            name = key.replace("-", "_")
            if name in seen:
                upstream.notes.append(f"{path}: {key!r} replaces {name!r} of {seen[name]}, as NeoX's merge does")
                for old in [k for k in upstream.settings if k == name or k.startswith(f"{name}.")]:
                    del upstream.settings[old]
            seen[name] = path
            upstream.settings.update(flatten({name: value}, path, text, spelled={name: key}))


def flatten(mapping: dict, path: str, text: str, prefix: str = "", spelled: dict | None = None
            ) -> dict[str, Setting]:
    """Nested sections as dotted names (DeepSpeed's optimizer / fp16 / zero_optimization sections)."""
    out = {}
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(flatten(value, path, text, f"{name}.", spelled))
        else:
            written = (spelled or {}).get(key, name)
            out[name] = Setting(name, value, written, f"{path}:{line_of(text, str(key).split('.')[-1])}")
    return out


def line_of(text: str, key: str, last: bool = False) -> int:
    """The first (or `last`) line that writes `key` (as a flag, a quoted key or a YAML key), 1 when none does."""
    spellings = {key, key.replace("_", "-")}
    pattern = "|".join(rf"--{re.escape(s)}(?![\w-])|[\"']{re.escape(s)}[\"']\s*:|^\s*{re.escape(s)}\s*:"
                       for s in spellings)
    matches = list(re.finditer(pattern, text, re.M))
    return text.count("\n", 0, matches[-1 if last else 0].start()) + 1 if matches else 1


def read_megatron(path: str, upstream: Upstream, environ: dict[str, str] | None, arguments: Sequence[str]) -> None:
    """A script that starts pretrain_*.py (its arguments as the script builds them, run with `arguments` as its
    own), or a file of flags."""
    text = read_text(path)
    launch = shell.find_launch(path, text, environ, arguments)
    if launch is not None:
        words, upstream.program = launch.arguments, launch.program
        if upstream.gpus is None:
            upstream.gpus = shell.launcher_gpus(
                launch.launcher, lambda flag: (f"{path}:{line_of(text, flag.lstrip('-'))}", launch.origin(text, flag)))
        upstream.notes += launch.notes
    else:
        words = [w for statement in shell.statements(text) for raw in statement.words
                 for w in shell.Shell(path, environ, arguments).expand(raw)]
        if not words or not words[0].startswith("--"):
            raise UserError(f"{path}: neither a script that starts a pretrain_*.py program nor a file of "
                            "--flag value words (Megatron-LM's arguments); give one of those.")
    upstream.settings.update(parse_flags(words, path, text, upstream.notes, launch))


def parse_flags(words: list[str], path: str, text: str, notes: list[str] | None = None,
                launch: shell.Launch | None = None) -> dict[str, Setting]:
    """argparse's reading of Megatron's flags: `--name` alone is True, `--name v` a string, `--name v1 v2 ...` a
    list (--data-path's weighted prefixes); a flag given twice keeps the last value, as argparse does (noted in
    `notes`). With the `launch` of a script, each setting knows which of its variables gives its value."""
    out: dict[str, Setting] = {}
    i = 0
    while i < len(words):
        word = words[i]
        if not word.startswith("--"):
            raise UserError(f"{path}:{line_of(text, word)}: {word!r} follows no --flag; quote a value holding spaces.")
        name, equals, inline = word[2:].partition("=")
        values = [inline] if equals else []
        i += 1
        while not equals and i < len(words) and not words[i].startswith("--"):
            values.append(words[i])
            i += 1
        key = name.replace("-", "_")
        value = True if not values else values[0] if len(values) == 1 else values
        origin = launch.origin(text, f"--{name}") if launch is not None else None
        setting = Setting(key, value, f"--{name}", f"{path}:{line_of(text, name, last=key in out)}", origin)
        if key in out and notes is not None:
            notes.append(f"{setting.spelled} is given twice ({shown_value(out[key].value)}, then "
                         f"{shown_value(value)}; {setting.where}): the last applies, as argparse takes it")
        out[key] = setting
    return out
