"""CPM-2-Finetune's runs (TsinghuaAI/CPM-2-Finetune: scripts/full_model/finetune_cpm2_<task>.sh start
finetune_cpm2.py under DeepSpeed) as the cpm2 family's seq2seq fine-tuning. The model's shape is in the JSON file
--model-config names (configs/model/cpm2_config.json: the 11B); the task's files are --data-path's
train<--data-ext> and dev<--data-ext>, each line a record CPM2Datasets.py's class for --data-name turns into ids.
A task whose records are one input/target pair (LCSTS: text, summary) reads as they are; the others build their
inputs from a template of several fields and special ids (LCQMC: sentence1, sentence2, a label word), which the
migration lists: write them as input/target pairs first."""
from __future__ import annotations

import json
import os

from t5x_like.errors import UserError
from t5x_like.migration.family import Family, Fields
from t5x_like.migration.rows import Row
from t5x_like.migration.translate import Out, provenance
from t5x_like.migration.upstream import Upstream

SHAPE = (("embed_dim", "d_model"), ("mlp_dim", "d_ff"), ("d_kv", "d_kv"), ("num_heads", "num_heads"),
         ("num_layers", "num_layers"), ("num_decoder_layers", "num_decoder_layers"),
         ("dropout_rate", "dropout_rate"), ("layer_norm_eps", "layer_norm_epsilon"))
"""cpm2 config field <- CPM-2-Finetune's model config key."""
CPM2_11B = {"d_model": 4096, "d_ff": 10240, "d_kv": 64, "num_heads": 64, "num_layers": 24, "num_decoder_layers": 24,
            "dropout_rate": 0.0, "layer_norm_epsilon": 1e-6}
"""configs/model/cpm2_config.json's shape (every full_model script names it)."""
PAIR_TASKS = {"lcsts": ("text", "summary")}
"""--data-name -> the (inputs, targets) fields of its records, for the tasks whose records are one pair."""
SEQ_LENGTH_DEFAULT = 512  # arguments.py's --enc-seq-length and --dec-seq-length
UPSTREAM_GELU = ("CPM-2-Finetune's MLP gate is OpenAI's tanh GELU (mpu/transformer_enc_dec.py gelu_impl); the cpm2 "
                 "family's is ModelCenter's exact GELU: this model differs from upstream's here (by < 1e-3 per "
                 "activation)")


def read_model_config(upstream: Upstream, out: Out) -> tuple[dict, str]:
    """(CPM-2-Finetune's model config values, where they came from): --model-config's file, or where it is not
    here the 11B's (the file every full_model script names)."""
    setting = upstream.get("model_config")
    path = setting.path() if setting is not None else None
    if path and os.path.isfile(path):
        try:
            with open(path, encoding="utf-8") as f:
                return json.load(f), path
        except (OSError, ValueError) as e:
            raise UserError(f"{provenance(setting)}: {path} is not a JSON model config ({e}); fix or remove it.")
    out.notes.append(f"{provenance(setting, 'no --model-config')}: not found here; the shape is CPM-2's 11B "
                     "(CPM-2-Finetune's configs/model/cpm2_config.json)")
    return CPM2_11B, "CPM-2-Finetune's cpm2_config.json"


def cpm2_fields(upstream: Upstream, out: Out) -> Fields:
    values, where = read_model_config(upstream, out)
    missing = [key for _, key in SHAPE if key not in values]
    if missing:
        raise UserError(f"{where}: no {missing[0]!r}; CPM-2-Finetune's model configs give {[k for _, k in SHAPE]}.")
    fields = {ours: (values[theirs], f"{where}: {theirs}") for ours, theirs in SHAPE}
    out.skipped.append((f"{where}: feed_forward_proj, init_method_std, use_scaled_init_for_output_weights",
                        "the encoder-decoder code of CPM-2-Finetune ignores feed_forward_proj (its MLP is gated); "
                        "initialisation: a fine-tuning run starts from RESTORE_FROM's parameters"))
    out.skipped.append(("finetune_cpm2.py's model", UPSTREAM_GELU))
    out.notes.append("RESTORE_FROM: CPM-2-Finetune's --load folder holds DeepSpeed's model-parallel files, which "
                     "have no reader here: convert ModelCenter's cpm2 folder (`python -m t5x_like.convert "
                     "from-modelcenter`, docs/cpm.md) and point RESTORE_FROM at that")
    return fields


def cpm2_lengths(upstream: Upstream, out: Out) -> None:
    """FEATURE_LENGTHS from --enc-seq-length / --dec-seq-length; OBJECTIVE='seq2seq'."""
    lengths, why = {}, []
    for side, key in (("inputs", "enc_seq_length"), ("targets", "dec_seq_length")):
        setting = upstream.get(key)
        lengths[side] = setting.number(int) if setting is not None else SEQ_LENGTH_DEFAULT
        why.append(provenance(setting, f"{key} not set: CPM-2-Finetune's default"))
    out.set("SEQ_LEN", None, "encoder-decoder: FEATURE_LENGTHS below")
    out.set("FEATURE_LENGTHS", lengths, ", ".join(why) + " (CPM-2-Finetune pads to its data's longest)")
    out.set("OBJECTIVE", "seq2seq", "fine-tuning on input/target pairs, built as CPM2Datasets.py builds them "
            "(the cpm2 family's conventions)")


def task_files(upstream: Upstream, out: Out, folder: str) -> None:
    """DATA_PATH from --data-path (a folder) and --data-ext: its train and dev files; the record fields of
    --data-name's task, or why its records are not pairs."""
    ext, name = upstream.get("data_ext"), upstream.get("data_name")
    suffix = str(ext.value) if ext is not None else ".json"
    out.set("DATA_PATH", {"train": os.path.join(folder, "train" + suffix),
                          "validation": os.path.join(folder, "dev" + suffix)},
            f"{provenance(ext, 'data_ext not set')} in the folder of {provenance(upstream.get('data_path'))}: "
            "finetune_cpm2.py's train / dev files (its test file: eval --task=seq2seq)")
    task = str(name.value) if name is not None else None
    if task in PAIR_TASKS:
        out.set("data.make_source.fields", PAIR_TASKS[task], f"{provenance(name)}: its records' input and target")
    elif name is not None:
        out.skip(name, f"CPM2Datasets.py builds {task}'s inputs from a template of several fields and special ids; "
                       "write its records as {\"inputs\": ..., \"targets\": ...} pairs (the targets its label words "
                       "or text) and fine-tune on those")
    if suffix != ".jsonl":
        out.notes.append(f"{provenance(ext, 'data_ext not set')}: seq2seq reads .jsonl or .tsv files; rename the "
                         "task's files (one JSON record a line)")


CPM2 = Family("cpm2", "megatron", "cpm2", cpm2_fields, cpm2_lengths, programs=("cpm2",), rows=(
    Row(("model_config.preset", "overrides.embed_dim", "overrides.mlp_dim", "overrides.num_heads"),
        "CPM-2-Finetune: its JSON model config's d_model, d_ff, d_kv, num_heads, num_layers (an absent file: the "
        "11B's, preset `cpm2`)", megatron=("--model-config",)),
))
DATA_ROW = Row(("DATA_PATH",), "CPM-2-Finetune: the train / dev files of --data-path's folder; a task whose records "
               "are one pair (lcsts) names their fields (data.make_source.fields), the others are listed as not "
               "migrated", megatron=("--data-ext", "--data-name"))
