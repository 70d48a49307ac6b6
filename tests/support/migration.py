"""What the migration tests share (tests/t5x_like/migration/): reading what `--print_config` shows, a corpus
tokenized as Megatron's tools leave it, and docs/migrating.md's scripts with the excerpts it shows of them."""
import ast
import contextlib
import re
from pathlib import Path

import numpy as np
import pydoc_data.topics

import configs
import models
from t5x_like.migration import translate, upstream

UPSTREAM = Path(__file__).resolve().parents[1] / "data" / "upstream"
UNSET_GPU_COUNT_SCRIPT = "finetune_cpm2_sogou-log.sh"


def unset_gpu_count_script(folder: Path) -> Path:
    """CPM-2-Finetune's LCQMC script with its GPU count unset, as its sogou-log script has it (`GPUS_PER_NODE=` where
    `NUM_GPUS_PER_WORKER=8` stood, and `deepspeed --num_gpus ${NUM_GPUS_PER_WORKER}` on line 65), under the sogou-log
    script's name, beside the DeepSpeed JSON both read; returns the script."""
    text = (UPSTREAM / "cpm2_finetune" / "finetune_cpm2_lcqmc.sh").read_text()
    script = folder / UNSET_GPU_COUNT_SCRIPT
    script.write_text(text.replace("NUM_GPUS_PER_WORKER=8\n", "GPUS_PER_NODE=\n"))
    (folder / "ds_full_model.json").write_bytes((UPSTREAM / "cpm2_finetune" / "ds_full_model.json").read_bytes())
    return script


RUN = ["--micro-batch-size", "1", "--global-batch-size", "8", "--lr", "1e-4", "--train-iters", "10"]
"""The run flags the Megatron Llama tests add to a preset's architecture flags."""


def printed_config(text: str) -> dict:
    """--print_config's values: macros, `configurable.parameter`s (macro references resolved), the resolved
    model config's fields as `model.<field>`, and the accumulated microbatches a step of this mesh takes as
    `accumulated`."""
    values = {}
    for line in text.splitlines():
        batch = re.match(r"^#   batch \d+ rows a step: (\d+) accumulated", line)
        if batch:
            values["accumulated"] = batch[1]
        model = re.match(r"^#     (\w+) = (.*)$", line)
        binding = re.match(r"^([\w.]+) = (.*)$", line)
        if model:
            values[f"model.{model[1]}"] = model[2]
        elif binding:
            values[binding[1]] = binding[2]
    resolved = {}
    for name, raw in values.items():
        raw = values.get(raw[1:], raw) if raw.startswith("%") else raw
        try:
            resolved[name] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            resolved[name] = raw
    return resolved


def megatron_token_file(prefix: Path, tokenizer_path: Path) -> None:
    """Documents (Python's help topics) tokenized as Megatron's tools/preprocess_data.py leaves them: .bin and .idx,
    each document ending with the tokenizer's end-of-document id, no metadata beside them."""
    from t5x_like.data.token_file import TokenFileWriter, token_dtype
    from t5x_like.data.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(tokenizer_path)
    documents = [tokenizer.encode(text) + [tokenizer.eod_id] for text in list(pydoc_data.topics.topics.values())[:60]]
    with TokenFileWriter(prefix, token_dtype(tokenizer.vocab_size), {}) as writer:
        writer.write(np.concatenate(documents), np.asarray([len(d) for d in documents]))
    Path(f"{prefix}.json").unlink()


def preset_config(name: str) -> models.FamilyConfig:
    return models.config_from_dict(configs.get_model_config(name).to_dict())


def megatron_flags(preset: str) -> list[str]:
    """A llama preset's architecture as Megatron-LM's flags (arguments.py and TransformerConfig at d98e8a6), written
    from the config here, not by the migration."""
    c = preset_config(preset)
    flags = ["--num-layers", c.num_layers, "--hidden-size", c.embed_dim, "--ffn-hidden-size", c.mlp_dim,
             "--num-attention-heads", c.num_heads, "--seq-length", min(c.max_len, 4096),
             "--max-position-embeddings", c.max_len, "--position-embedding-type", "rope",
             "--rotary-base", int(c.rope_theta), "--normalization", "RMSNorm", "--norm-epsilon", c.layer_norm_eps,
             "--swiglu", "--disable-bias-linear", "--attention-dropout", 0.0, "--hidden-dropout", 0.0,
             "--init-method-std", c.init_std]
    if c.num_key_value_heads:
        flags += ["--group-query-attention", "--num-query-groups", c.num_key_value_heads]
    if c.rope_scaling_factor:
        flags += ["--use-rope-scaling", "--rope-scaling-factor", c.rope_scaling_factor]
    if c.sliding_window:
        flags += ["--window-size", f"{c.sliding_window - 1},0"]  # keys i-(W-1)..i: W tokens
    if c.qkv_bias:
        flags += ["--add-qkv-bias"]
    if not c.tie_word_embeddings:
        flags += ["--untie-embeddings-and-output-weights"]
    return [str(flag) for flag in flags] + RUN


def page_script_migrated(script: str, folder: Path) -> tuple[str, list[str], list[str]]:
    """docs/migrating.md's `script` (its `<!-- file: NAME -->` block), the lines of the gin excerpt the page shows
    after it, and the lines migrating it writes (saved in `folder`, migrated from there as a user would)."""
    from tests.docs.doc_commands import REPO, File, read_page

    page = "docs/migrating.md"
    [shown] = [item for item in read_page(page) if isinstance(item, File) and item.name == script]
    text = (REPO / page).read_text(encoding="utf-8")
    excerpt = text[text.index("```gin\n", text.index(f"<!-- file: {script} -->")) + 7:]
    (folder / script).write_text(shown.text)
    with contextlib.chdir(folder):
        written = translate.render(translate.translate(upstream.read([script])), "migrate")
    return shown.text, excerpt[:excerpt.index("```")].splitlines(), written.splitlines()


def migrated(tmp_path: Path, flags: list[str]) -> translate.Out:
    path = tmp_path / "args.txt"
    path.write_text(" ".join(flags) + "\n")
    return translate.translate(upstream.read([str(path)]))



def stand_in_tokenizer(folder: Path, vocab_size: int) -> None:
    """A tokenizer.json of `vocab_size` ids where the script's tokenizer folder is (the architecture's vocabulary
    is the tokenizer's size; the real ones are not downloaded here)."""
    from tokenizers import Tokenizer
    from tokenizers import models as tokenizer_models

    folder.mkdir(parents=True)
    vocab = {f"w{i}": i for i in range(vocab_size - 1)} | {"</s>": vocab_size - 1}
    Tokenizer(tokenizer_models.WordLevel(vocab, unk_token="w0")).save(str(folder / "tokenizer.json"))
