"""The run around the recipe: where it saves and what it starts from, how often it saves, evaluates and logs,
the data and its tokenizer, activation checkpointing and the seed."""
from __future__ import annotations

import re

from t5x_like.migration import cpm2
from t5x_like.migration.rows import Row, translates
from t5x_like.migration.translate import REQUIRED, Out, provenance
from t5x_like.migration.upstream import Setting, Upstream

RUN_ROWS = (
    Row(("MODEL_DIR",), "a restart resumes from it", megatron=("--save",), neox=("save",)),
    Row(("RESTORE_FROM",), "a --load other than --save: its parameters start the run (the optimizer state and the "
        "step are not carried over: upstream's --finetune)", megatron=("--load", "--finetune"),
        neox=("load", "finetune")),
    Row(("CHECKPOINT_EVERY",), "unset upstream: saved at the end only", megatron=("--save-interval",),
        neox=("checkpoint_factor", "save_interval")),
    Row(("train.save_steps",), "extra steps to save at, kept whatever the retention (Pythia's log-spaced ones)",
        neox=("extra_save_iters",)),
    Row(("train.keep_checkpoints",), "None keeps every checkpoint, as Megatron and NeoX do unless told",
        neox=("keep_last_n_checkpoints",)),
    Row(("EVAL_EVERY", "EVAL_STEPS"), megatron=("--eval-interval", "--eval-iters"),
        neox=("eval_interval", "eval_iters")),
    Row(("train.log_every",), megatron=("--log-interval",), neox=("log_interval", "steps_per_print"),
        deepspeed=("steps_per_print",)),
    Row(("train.tensorboard_dir",), "default: MODEL_DIR/tensorboard", megatron=("--tensorboard-dir",),
        neox=("tensorboard_dir",), deepspeed=("tensorboard.output_path", "tensorboard.enabled")),
    Row(("SEED",), megatron=("--seed",), neox=("seed",)),
    Row(("DATA_PATH", "BLEND_WEIGHTS"), "Megatron's weighted `w1 p1 w2 p2` becomes both; NeoX's validation and test "
        "files are not read (the validation split is DATA_SPLIT's share of DATA_PATH)", megatron=("--data-path",),
        neox=("data_path", "train_data_paths", "train_data_weights", "valid_data_paths", "valid_data_weights",
              "test_data_paths", "test_data_weights")),
    cpm2.DATA_ROW,
    Row(("DATA_SPLIT",), megatron=("--split",), neox=("split",)),
    Row((), "no synthetic data here: DATA_PATH names token files (None: the builtin corpus, with its own tokenizer)",
        megatron=("--mock-data",)),
    Row(("TOKENIZER", "model_config.vocab_from_tokenizer"), "either file of a GPT-2 BPE pair; the kind of tokenizer is "
        "told from its files (a type whose files have no reader here is listed as not migrated)",
        megatron=("--vocab-file", "--merge-file", "--tokenizer-type", "--tokenizer-path"),
        neox=("vocab_file", "merge_file", "tokenizer_type")),
    Row(("TOKENIZER",), "HuggingFaceTokenizer's folder (with tokenizer.json, as transformers saves it: download a Hub "
        "name first), or the .model file of a sentencepiece tokenizer type", megatron=("--tokenizer-model",)),
    Row(("overrides.vocab_size",), "with no tokenizer (NullTokenizer's ids); a tokenizer's own size otherwise",
        megatron=("--vocab-size",)),
    Row(("model_config.remat_policy",), "'full'; Megatron's selective recomputation is 'minimal'",
        megatron=("--checkpoint-activations", "--recompute-activations", "--recompute-granularity"),
        neox=("checkpoint_activations",)),
    Row(("EPOCHS",), "passes over the training split instead of TRAIN_STEPS, validation after each",
        megatron=("--epochs",), neox=("train_epochs",)),
)
NO_READER = {
    "TikTokenizer": "tiktoken files (a tokenizer.model of base64 tokens and their ranks) have no reader here: set "
                    "TOKENIZER to the model's tokenizer.json (its Hugging Face folder has one)",
    "NullTokenizer": "token ids without text (mock data): the vocabulary is --vocab-size's; set DATA_PATH to token "
                     "files",
}
"""Upstream tokenizer types whose files this project's tokenizers cannot read, and what to do instead."""
VOCAB_FILE_TYPES = ("GPT2BPETokenizer", "BertWordPieceLowerCase", "BertWordPieceCase")
DEFAULTS = {"megatron": {"eval_interval": 1000, "eval_iters": 100, "log_interval": 100, "seed": 1234,
                         "split": "969, 30, 1"},
            "neox": {"eval_interval": 1000, "eval_iters": 100, "log_interval": 100, "seed": 1234,
                     "split": "969, 30, 1"}}


@translates(*RUN_ROWS)
def run(upstream: Upstream, out: Out) -> None:
    out.section = "run and data"
    directories(upstream, out)
    intervals(upstream, out)
    data(upstream, out)
    remat = upstream.get("checkpoint_activations", "recompute_activations", "recompute_granularity")
    if remat is not None and (remat.value in ("full", "selective") or remat.flag()):  # a flag, or a granularity
        out.set("model_config.remat_policy", "minimal" if remat.value == "selective" else "full", provenance(remat))
    epochs = upstream.get("train_epochs", "epochs")
    if epochs is not None:
        out.set("EPOCHS", epochs.number(int), provenance(epochs))
        steps = next((b for b in out.bindings if b.name == "TRAIN_STEPS"), None)
        if steps is not None and isinstance(steps.value, int) and steps.value <= 0:  # CPM-2-Finetune's -1
            out.set("TRAIN_STEPS", steps.value, f"{steps.why}: none given; EPOCHS sets TRAIN_STEPS")


def directories(upstream: Upstream, out: Out) -> None:
    save, load = upstream.get("save"), upstream.get("load")
    finetune = upstream.get("finetune")
    model_dir = save.path() if save is not None else None
    out.set("MODEL_DIR", REQUIRED if model_dir is None else model_dir,
            provenance(save) if model_dir else f"{provenance(save, 'no --save')} has no value: set MODEL_DIR")
    source = load.path() if load is not None else None
    if source and source != model_dir:
        out.set("RESTORE_FROM", source, provenance(load) + ("" if finetune else ": its parameters only (upstream "
                                                                                 "would also resume its step)"))
    elif load is not None and source is None:
        out.skip(load, "no value (an empty variable in the script): a restart resumes MODEL_DIR")
    elif finetune is not None and finetune.flag():
        out.skip(finetune, "--load is --save: a restart resumes it (--finetune would start the step over)")


def setting_or_default(upstream: Upstream, out: Out, *keys: str) -> tuple[object, str]:
    """The first of `keys` given, or the upstream default of the first."""
    setting = upstream.get(*keys)
    if setting is not None:
        return setting.value, provenance(setting)
    return DEFAULTS[upstream.kind][keys[0]], f"{keys[0]} not set: {out.default()}"


def intervals(upstream: Upstream, out: Out) -> None:
    save = upstream.get("checkpoint_factor", "save_interval")
    if save is not None:
        out.set("CHECKPOINT_EVERY", save.number(int), provenance(save))
    elif out.value("TRAIN_STEPS"):
        out.set("CHECKPOINT_EVERY", out.value("TRAIN_STEPS"), "no save interval: upstream saves at the end only")
    extra = upstream.get("extra_save_iters")
    if extra is not None and extra.value:
        out.set("train.save_steps", [int(step) for step in extra.value], provenance(extra))
    keep = upstream.get("keep_last_n_checkpoints")
    out.set("train.keep_checkpoints", None if keep is None or keep.value is None else keep.number(int),
            provenance(keep, f"every checkpoint kept: {out.default()}"))
    for macro, key in (("EVAL_EVERY", "eval_interval"), ("EVAL_STEPS", "eval_iters"), ("SEED", "seed")):
        value, why = setting_or_default(upstream, out, key)
        out.set(macro, int(value), why)
    value, why = setting_or_default(upstream, out, "log_interval", "steps_per_print")
    out.set("train.log_every", int(value), why)
    tensorboard = upstream.get("tensorboard_dir", "tensorboard.output_path")
    enabled = upstream.get("tensorboard.enabled")
    if tensorboard is not None and tensorboard.path() and (enabled is None or enabled.flag()):
        out.set("train.tensorboard_dir", tensorboard.path(), provenance(tensorboard))


def data(upstream: Upstream, out: Out) -> None:
    paths = upstream.get("train_data_paths", "data_path")
    weights = upstream.get("train_data_weights")
    for key in ("valid_data_paths", "valid_data_weights", "test_data_paths", "test_data_weights"):
        out.skip(upstream.get(key), "the validation split is DATA_SPLIT's share of DATA_PATH's documents")
    if paths is not None and paths.path() and upstream.get("data_ext", "data_name") is not None:
        cpm2.task_files(upstream, out, paths.path())  # CPM-2-Finetune: a folder of a task's train / dev files
    else:
        token_files(upstream, out, paths, weights)
    tokenizer(upstream, out)


def token_files(upstream: Upstream, out: Out, paths: Setting | None, weights: Setting | None) -> None:
    """DATA_PATH, BLEND_WEIGHTS and DATA_SPLIT of Megatron's and NeoX's token files."""
    prefixes, blend = data_paths(paths, weights)
    out.set("DATA_PATH", REQUIRED if not prefixes else prefixes[0] if len(prefixes) == 1 else prefixes,
            provenance(paths) if prefixes else f"{provenance(paths, 'no data path')}: set DATA_PATH")
    if blend:
        out.set("BLEND_WEIGHTS", blend, provenance(weights or paths))
    out.skip(upstream.get("mock_data"), "no synthetic data here: DATA_PATH names token files")
    split, why = setting_or_default(upstream, out, "split")
    out.set("DATA_SPLIT", ",".join(re.findall(r"[.0-9]+", str(split))), why)  # the numbers, as Megatron reads them


def tokenizer(upstream: Upstream, out: Out) -> None:
    """TOKENIZER from the file(s) upstream's tokenizer reads (its kind is told from them here), or the vocabulary's
    size with no tokenizer."""
    kind, merges = upstream.get("tokenizer_type"), upstream.get("merge_file")
    files = [s for s in (upstream.get("tokenizer_model"), upstream.get("vocab_file"), upstream.get("tokenizer_path"))
             if s is not None and s.path()]
    if kind is not None and kind.value in VOCAB_FILE_TYPES:
        files.reverse()  # Megatron's own tokenizers read --vocab-file (and --merge-file)
    reason = NO_READER.get(str(kind.value)) if kind is not None else None
    for setting in [kind, *files] if reason else []:
        out.skip(setting, reason)
    size = upstream.get("vocab_size")
    if files and not reason:
        hub = " (a folder with tokenizer.json)" if kind is not None and kind.value == "HuggingFaceTokenizer" else ""
        out.set("TOKENIZER", files[0].path(), provenance(files[0]) + hub +
                (f"; {provenance(merges)} beside it" if merges else ""))
        out.set("model_config.vocab_from_tokenizer", True, "the vocabulary is the tokenizer's, as upstream's")
        out.skip(size, "the vocabulary is the tokenizer's")
    elif size is not None:
        out.override("vocab_size", size.number(int), provenance(size))
    else:
        out.notes.append("no tokenizer file: the model keeps its preset's vocabulary; set TOKENIZER")


def data_paths(paths: Setting | None, weights: Setting | None) -> tuple[list[str], list[float] | None]:
    """Token-file prefixes and blend weights from a path, a list, or Megatron's `w1 p1 w2 p2`."""
    if paths is None or not paths.path():
        return [], None
    values = paths.value if isinstance(paths.value, list) else [paths.value]
    if weights is not None:
        return [str(v) for v in values], [float(w) for w in weights.value]
    if len(values) > 1 and len(values) % 2 == 0 and all(is_number(v) for v in values[::2]):
        return [str(v) for v in values[1::2]], [float(w) for w in values[::2]]
    return [str(v) for v in values], None


def is_number(text: object) -> bool:
    try:
        float(str(text))
    except ValueError:
        return False
    return True
