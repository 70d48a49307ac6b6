"""Every CLI's answer to bad input: every reader verifies what it loads, and no bad input gets a traceback.

Readers (generate, eval, convert to-hf / to-torch) refuse a checkpoint with a flipped byte or NaN
parameters in one line naming the step and the older step to read instead. Then a table of bad inputs
over the CLIs: each exits non-zero with one `error: ...` line naming the value, no traceback, and
writes nothing it should not. The argparse CLIs and train / compile run in this process; preprocess
and train_tokenizer (whose absl flags clash with train's) run their cases batched in one subprocess
each. SWEEP_REPORT=FILE appends each case's outcome (clear / unclear / traceback / silent) as JSON.
"""
import contextlib
import dataclasses
import io
import json
import os
import shutil
import subprocess
import sys
import traceback
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from tests.support.environment import cpu_env
from tests.support.migration import unset_gpu_count_script
from tests.support.shared_data import shared_file

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


# ---------------------------------------------------------------- running a CLI and judging the outcome


def call_cli(cli: str, argv: list[str]) -> int | str | None:
    """Run one CLI's main in this process as its __main__ does; returns the exit status."""
    from t5x_like.errors import exit_on_user_error

    if cli in ("train", "compile"):
        import gin

        from t5x_like import compile as compile_cli
        from t5x_like import train
        from t5x_like.config import cli as cli_flags
        from t5x_like.config import frontend
        train.FLAGS.unparse_flags()
        gin.clear_config()
        cli_flags.parse_flags([cli, *argv])
        main = train.main if cli == "train" else exit_on_user_error(frontend.plain_user_errors(compile_cli.main))
        argv = []
    elif cli in ("preprocess", "train_tokenizer"):
        from absl import flags

        module = __import__(f"t5x_like.data.{cli}", fromlist=["main"])
        flags.FLAGS.unparse_flags()
        flags.FLAGS([cli, *argv])
        main, argv = module.main, []
    else:
        module = {"generate": "t5x_like.generate", "eval": "t5x_like.eval.cli", "convert": "t5x_like.convert.__main__",
                  "plot": "t5x_like.plot", "migrate": "t5x_like.migrate"}[cli]
        main = exit_on_user_error(__import__(module, fromlist=["main"]).main)
    try:
        main(argv)
    except SystemExit as e:
        return e.code
    return 0


def judge(cli: str, argv: list[str]) -> tuple[str, str]:
    """(outcome, the last stderr line or the traceback): 'clear' = non-zero with a last line 'error: ...',
    'unclear' = non-zero otherwise, 'traceback' = an exception escaped, 'silent' = exit status 0."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = call_cli(cli, argv)
    except BaseException:  # noqa: BLE001 - what the user would see as a traceback
        return "traceback", traceback.format_exc(limit=-3)
    lines = [line for line in (err.getvalue() + (code if isinstance(code, str) else "")).splitlines() if line.strip()]
    last = lines[-1] if lines else ""
    if code in (0, None):
        return "silent", last
    return ("clear" if last.startswith("error: ") else "unclear"), last


def record(case_id: str, outcome: str, line: str, names: str) -> None:
    """Append the case's outcome to $SWEEP_REPORT (a clear line that does not name the value counts as unclear)."""
    if outcome == "clear" and names not in line:
        outcome = "unclear"
    if os.environ.get("SWEEP_REPORT"):
        with open(os.environ["SWEEP_REPORT"], "a") as f:
            f.write(json.dumps({"case": case_id, "outcome": outcome}) + "\n")


# ---------------------------------------------------------------- a small checkpoint, and its damaged copies


def gpt2_bpe() -> str:
    """GPT-2's BPE folder in ../shared/data (the test skips without it)."""
    return str(shared_file("gpt2-bpe"))


CONFIG = dict(vocab_size=50257, max_len=32, num_layers=1, num_heads=2, embed_dim=16, mlp_dim=32, dtype="float32",
              dropout_rate=0.0, attention_dropout_rate=0.0)


def write_run(model_dir: str, steps: dict[int, float], tokenizer: str | None = None) -> None:
    """A MODEL_DIR whose checkpoints (written as train writes them, checksums included) hold random
    parameters; a NaN value for a step puts NaN into one of its parameters."""
    from models.gpt2 import GPT2Config
    from t5x_like.checkpoint import store
    from t5x_like.inference import loading

    config = GPT2Config(**CONFIG)
    abstract, _ = loading.abstract_params(config)
    leaves, treedef = jax.tree.flatten(abstract)
    ckpt = store.Checkpointer(model_dir, keep=10)
    for step, poison in steps.items():
        keys = jax.random.split(jax.random.PRNGKey(step), len(leaves))
        params = [0.1 * jax.random.normal(k, a.shape, a.dtype) for k, a in zip(keys, leaves)]
        params[-1] = params[-1].at[(0,) * params[-1].ndim].set(poison)
        ckpt.save(step, params=jax.tree.unflatten(treedef, params), train_state={"step": jnp.int32(step)},
                  data_state={"index": step},
                  model={"config": dataclasses.asdict(config), "tokenizer": tokenizer or gpt2_bpe()})
        ckpt.wait()
    ckpt.close()
    with open(os.path.join(model_dir, "metrics.jsonl"), "w") as f:
        f.write("".join(json.dumps({"step": s, "loss": 5.0 - s, "learning_rate": 1e-3}) + "\n" for s in steps))


def flip_a_byte(step_dir: str) -> None:
    files = [os.path.join(r, f) for r, _, fs in os.walk(os.path.join(step_dir, "params")) for f in fs]
    path = max(files, key=os.path.getsize)
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x10]))


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """{'good', 'flipped', 'nan'}: runs with checkpoints 1 and 2 (2 damaged in the last two), a token file
    made with the checkpoint's tokenizer and one made with another, and a Hugging Face export."""
    gpt2_bpe()
    from t5x_like.convert import hf
    from t5x_like.data.token_file import TokenFileWriter
    from t5x_like.data.tokenizer import load_tokenizer

    root = tmp_path_factory.mktemp("runs")
    paths = {name: str(root / name) for name in ("good", "flipped", "nan")}
    write_run(paths["good"], {1: 0.0, 2: 0.0})
    shutil.copytree(paths["good"], paths["flipped"])
    flip_a_byte(os.path.join(paths["flipped"], "checkpoints", "2"))
    write_run(paths["nan"], {1: 0.0, 2: float("nan")})
    paths["unrecorded"] = str(root / "unrecorded")  # its tokenizer's path no longer exists
    write_run(paths["unrecorded"], {1: 0.0}, tokenizer=str(root / "moved" / "tokenizer.json"))
    tokenizer = load_tokenizer(gpt2_bpe())
    for name, sha in (("tokens", tokenizer.sha256), ("other_tokens", "0" * 64)):
        made_with = {"path": gpt2_bpe() if sha == tokenizer.sha256 else "other", "sha256": sha,
                     "vocab_size": 50257, "eod_id": tokenizer.eod_id}
        with TokenFileWriter(str(root / name), np.uint16, {"tokenizer": made_with}) as writer:
            writer.write(np.arange(200, dtype=np.uint16) % 1000, np.array([100, 100]))
        paths[name] = str(root / name)
    paths["hf"] = str(root / "hf")
    hf.to_hf(paths["good"], paths["hf"])
    return paths


READERS = {  # cli, argv (SRC = the checkpoint, OUT = an output path that must not appear)
    "generate": ["--checkpoint={src}", "--prompt=hello", "--max_new_tokens=4", "--output={out}"],
    "eval": ["--task=tokens", "--checkpoint={src}", "--data={tokens}", "--seq_len=16", "--output={out}"],
    "to-hf": ["to-hf", "{src}", "{out}"],
    "to-torch": ["to-torch", "{src}", "{out}"],
}


@pytest.mark.parametrize("damage, reason", [("flipped", "checksum mismatch"), ("nan", "non-finite values in")])
@pytest.mark.parametrize("reader", sorted(READERS))
def test_every_reader_refuses_a_damaged_checkpoint_naming_an_older_step(runs, tmp_path, reader, damage, reason):
    out = str(tmp_path / "out")
    argv = [a.format(src=runs[damage], out=out, tokens=runs["tokens"]) for a in READERS[reader]]
    outcome, line = judge("convert" if reader.startswith("to-") else reader, argv)
    assert outcome == "clear", line
    step_dir = os.path.join(runs[damage], "checkpoints", "2")
    assert line.startswith(f"error: checkpoint {step_dir} is damaged: ") and reason in line, line
    assert f"read an older step instead: pass {os.path.join(runs[damage], 'checkpoints', '1')}" in line
    assert not os.path.exists(out)


def test_the_older_step_the_error_names_reads(runs, tmp_path):
    out = str(tmp_path / "state.pt")
    assert judge("convert", ["to-torch", os.path.join(runs["nan"], "checkpoints", "1"), out])[0] == "silent"
    assert os.path.getsize(out) > 0


def test_restore_from_a_damaged_checkpoint_is_refused_too(runs):
    from t5x_like.checkpoint import store

    with pytest.raises(store.CorruptCheckpointError, match="checkpoints/2 is damaged: .*checksum mismatch"):
        store.restore_params(runs["flipped"], None)


def test_from_hf_checkpoints_carry_checksums(runs, tmp_path):
    from t5x_like.checkpoint import store
    from t5x_like.convert import hf

    step_dir = hf.from_hf(runs["hf"], str(tmp_path / "imported"))
    assert store.verify_manifest(step_dir)
    flip_a_byte(step_dir)
    with pytest.raises(store.CorruptCheckpointError, match="checksum mismatch.*no older step"):
        store.restore_params(str(tmp_path / "imported"), None)


# ---------------------------------------------------------------- the table of bad inputs


def case(cli, args, names, *, writes=(), id=None):
    """A bad input: the CLI, its arguments ({placeholders} below), the text its error line must hold (the
    value or file it names), and paths that must not exist afterwards."""
    return pytest.param(cli, args, names, writes, id=id or f"{cli}:{' '.join(args)[:60]}")


QUICK = ["--gin_file=quickstart.gin", "--gin.MODEL_DIR='{tmp}/run'", "--print_config"]
T5 = ["--gin_file=quickstart_t5.gin", "--gin.MODEL_DIR='{tmp}/run'", "--print_config"]
GEN = ["--checkpoint={good}", "--prompt=hello", "--max_new_tokens=4"]
EVAL = ["--task=tokens", "--checkpoint={good}", "--data={tokens}", "--seq_len=16"]

CASES = [
    # generate
    case("generate", GEN + ["--batch_size=0"], "--batch_size=0"),
    case("generate", GEN[:2] + ["--max_new_tokens=0"], "--max_new_tokens=0"),
    case("generate", GEN[:2] + ["--max_new_tokens=100000"], "--max_new_tokens=100000"),
    case("generate", GEN + ["--num_beams=0"], "--num_beams=0"),
    case("generate", GEN + ["--num_beams=60000"], "--num_beams=60000"),
    case("generate", GEN + ["--batch_size=1000000000"], "--batch_size=1000000000"),
    case("generate", GEN + ["--top_k=-1"], "--top_k=-1"),
    case("generate", GEN + ["--top_k=60000"], "--top_k=60000"),
    case("generate", GEN + ["--top_p=nan"], "--top_p=nan"),
    case("generate", GEN + ["--temperature=-1"], "--temperature=-1"),
    case("generate", GEN + ["--temperature=inf"], "--temperature=inf"),
    case("generate", GEN + ["--num_beams=2", "--length_penalty=nan"], "--length_penalty=nan"),
    case("generate", GEN[:1] + ["--prompts_file={tmp}/missing.txt"], "--prompts_file={tmp}/missing.txt"),
    case("generate", GEN[:1] + ["--prompts_file={noprompt}"], "--prompts_file={noprompt}: line 1"),
    case("generate", GEN[:1] + ["--prompts_file={binary}"], "--prompts_file={binary}"),
    case("generate", GEN[:1], "no prompts"),
    case("generate", GEN + ["--output=/proc/t5x_like_out.jsonl"], "--output=/proc/t5x_like_out.jsonl"),
    case("generate", GEN + ["--output={afile}/out.jsonl"], "--output={afile}/out.jsonl"),
    case("generate", GEN + ["--output={tmp}"], "--output={tmp} is a directory"),
    case("generate", GEN + ["--tokenizer={binary_json}"], "--tokenizer={binary_json}"),
    case("generate", GEN + ["--data_parallel=3"], "--data_parallel=3"),
    case("generate", GEN + ["--tensor_parallel=16"], "--tensor_parallel=16: the mesh needs 16 devices, but only 8 "
         "are present; to run it on this CPU, simulate 16 devices: start the command with "
         "XLA_FLAGS=--xla_force_host_platform_device_count=16", id="generate:--tensor_parallel=16 on 8 devices"),
    case("generate", GEN + ["--fsdp_parallel=0"], "--fsdp_parallel=0"),
    case("generate", GEN + ["--rules=bogus"], "--rules='bogus'"),
    case("generate", GEN + ["--heartbeat_timeout_seconds=0"], "--heartbeat_timeout_seconds=0"),
    case("generate", ["--checkpoint={tmp}/nothing", "--prompt=x"], "no checkpoint at {tmp}/nothing"),
    # eval
    case("eval", EVAL[:3] + ["--seq_len=-64"], "--seq_len=-64"),
    case("eval", EVAL + ["--stride=0"], "--stride=0"),
    case("eval", EVAL + ["--batch_size=0"], "--batch_size=0"),
    case("eval", EVAL + ["--max_batches=0"], "--max_batches=0"),
    case("eval", EVAL + ["--output=/proc/t5x_like_eval.json"], "--output=/proc/t5x_like_eval.json"),
    case("eval", EVAL + ["--output={afile}/eval.json"], "--output={afile}/eval.json"),
    case("eval", ["--task=wikitext", "--checkpoint={good}", "--data={binary}", "--seq_len=16"], "--data={binary}"),
    case("eval", ["--task=lambada", "--checkpoint={good}", "--data={lambada_bad}", "--seq_len=16"],
         "--data={lambada_bad}"),
    case("eval", ["--task=tokens", "--checkpoint={good}", "--data={other_tokens}", "--seq_len=16"],
         "{other_tokens}.json: tokenized with other"),
    case("eval", ["--task=seq2seq", "--checkpoint={good}", "--data={pairs}"], "--task=seq2seq"),
    case("eval", EVAL + ["--data_parallel=3"], "--data_parallel=3"),
    case("eval", EVAL + ["--split=validation", "--data_split=abc"], "DATA_SPLIT='abc'"),
    case("eval", ["--task=wikitext", "--checkpoint={good}", "--data={text}", "--split=train"], "--split"),
    case("eval", ["--task=lambada", "--checkpoint={good}", "--data={tmp}/missing.jsonl"], "--data={tmp}/missing.jsonl"),
    case("eval", EVAL[:3] + ["--seq_len=100000"], "--seq_len=100000"),
    case("eval", ["--task=tokens", "--checkpoint={good}", "--data={tmp}/nothing", "--seq_len=16"], "{tmp}/nothing"),
    # convert
    case("convert", ["to-hf", "{good}", "{afile}/hf"], "DST={afile}/hf", writes=["{afile}/hf"]),
    case("convert", ["to-hf", "{good}", "/proc/t5x_like_hf"], "DST=/proc/t5x_like_hf"),
    case("convert", ["to-torch", "{good}", "/proc/t5x_like.pt"], "FILE=/proc/t5x_like.pt"),
    case("convert", ["to-torch", "{good}", "{tmp}"], "FILE={tmp} is a directory"),
    case("convert", ["to-hf", "{tmp}/nothing", "{tmp}/hf"], "no checkpoint at {tmp}/nothing", writes=["{tmp}/hf"]),
    case("convert", ["from-hf", "{hf_list}", "{tmp}/imported"], "{hf_list}/config.json", writes=["{tmp}/imported"]),
    case("convert", ["from-hf", "{hf_fields}", "{tmp}/imported"], "{hf_fields}/config.json",
         writes=["{tmp}/imported"]),
    case("convert", ["from-hf", "{hf_truncated}", "{tmp}/imported"], "{hf_truncated}/model.safetensors",
         writes=["{tmp}/imported/checkpoints"]),
    case("convert", ["from-hf", "{hf}", "{good_copy}"], "DST={good_copy} already holds checkpoints",
         writes=["{good_copy}/tokenizer", "{good_copy}/checkpoints/0"]),
    case("convert", ["from-hf", "{hf}", "{tmp}/imported", "--step=-1"], "--step=-1", writes=["{tmp}/imported"]),
    case("convert", ["from-hf", "{hf}", "{tmp}/imported", "--vocab_pad_multiple=0"], "--vocab_pad_multiple=0",
         writes=["{tmp}/imported"]),
    # plot
    case("plot", ["{good}", "--output={tmp}/p.xyz"], "--output={tmp}/p.xyz", writes=["{tmp}/p.xyz"]),
    case("plot", ["{good}", "--output=/proc/t5x_like_plot.png"], "--output=/proc/t5x_like_plot.png"),
    case("plot", ["{tmp}/nothing", "--output={tmp}/p.png"], "{tmp}/nothing/metrics.jsonl", writes=["{tmp}/p.png"]),
    # compile
    case("compile", ["--gin_file=quickstart.gin", "--topology=cpu:0"], "--topology=cpu:0"),
    case("compile", ["--gin_file=quickstart.gin", "--topology=cpu:abc"], "--topology=cpu:abc"),
    case("compile", ["--gin_file=quickstart.gin", "--topology=tpu9:2x2"], "--topology=tpu9:2x2"),
    case("compile", ["--gin_file=quickstart.gin", "--device_memory_gib=-1"], "--device_memory_gib=-1"),
    case("compile", ["--gin_file=quickstart.gin", "--output=/proc/t5x_like_report.json"],
         "--output=/proc/t5x_like_report.json"),
    # train: gin macros and train's settings, all caught by --print_config before anything runs
    case("train", QUICK + ["--gin.TRAIN_STEPS=-5"], "TRAIN_STEPS=-5"),
    case("train", QUICK + ["--gin.CHECKPOINT_EVERY=0"], "CHECKPOINT_EVERY=0"),
    case("train", QUICK + ["--gin.EVAL_EVERY=-1"], "EVAL_EVERY=-1"),
    case("train", QUICK + ["--gin.EVAL_STEPS=0"], "EVAL_STEPS=0"),
    case("train", QUICK + ["--gin.LEARNING_RATE=-0.001"], "LEARNING_RATE=-0.001"),
    case("train", QUICK + ["--gin.WARMUP_STEPS=-1"], "WARMUP_STEPS=-1"),
    case("train", QUICK + ["--gin.SEED='abc'"], "SEED='abc'"),
    case("train", QUICK + ["--gin.BATCH_SIZE=0"], "BATCH_SIZE=0"),
    case("train", QUICK + ["--gin.GRAD_ACCUM_STEPS=0"], "GRAD_ACCUM_STEPS=0"),
    case("train", QUICK + ["--gin.train.keep_checkpoints=0"], "train.keep_checkpoints=0"),
    case("train", QUICK + ["--gin.train.log_every=0"], "train.log_every=0"),
    case("train", QUICK + ["--gin.optim.make_optimizer.weight_decay=-1.0"], "weight_decay=-1"),
    case("train", ["--gin_file=quickstart.gin", "--gin.MODEL_DIR='{afile}/run'", "--print_config"],
         "MODEL_DIR={afile}/run"),
    case("train", ["--gin_file=quickstart.gin", "--gin.MODEL_DIR='/proc/t5x_like_run'", "--print_config"],
         "MODEL_DIR=/proc/t5x_like_run"),
    case("train", ["--gin_file=quickstart.gin", "--gin.MODEL_DIR='/proc/t5x_like_run'"],
         "MODEL_DIR=/proc/t5x_like_run", id="train:MODEL_DIR in /proc, training"),
    case("train", QUICK + ["--gin.FEATURE_LENGTHS={{'target': 64}}"], "FEATURE_LENGTHS"),
    case("train", QUICK + ["--gin.SEQ_LEN=100000"], "100000"),
    case("train", T5 + ["--gin.FEATURE_LENGTHS={{'targets': 64}}"], "'inputs'"),
    case("train", T5 + ["--gin.PIPELINE_PARALLEL=8", "--gin.DATA_PARALLEL=1"], "PIPELINE_PARALLEL=8"),
    case("train", T5 + ["--gin.RESTORE_FROM='{good}'"], "holds a 'gpt2' model"),
    # issue 52: an option the family has not (its converter could not export it) is refused when the config is made
    case("train", ["--gin_file=quickstart_mixtral.gin", "--print_config",
                   "--gin.model_config.overrides={{'shared_expert_mlp_dim': 64}}"],
         "mixtral has no shared expert mlp dim option (family 'qwen2_moe' has it)"),
    case("train", ["--gin_file=quickstart_llama.gin", "--print_config",
                   "--gin.model_config.overrides={{'qkv_bias': True, 'sliding_window': 64}}"],
         "no Llama-class model has both"),
    case("train", T5 + ["--gin.SEQ_LEN=64"], "SEQ_LEN=64 is not used"),
    case("train", QUICK[:1] + ["--gin.MODEL_DIR=None"], "MODEL_DIR=None", id="train:MODEL_DIR=None, training"),
    case("train", QUICK + ["--gin.RESTORE_FROM=''"], "RESTORE_FROM=''"),
    case("train", QUICK + ["--gin.DATA_SPLIT='a,b'"], "DATA_SPLIT='a,b'"),
    case("train", QUICK + ["--gin.PACKING='yes'"], "PACKING='yes'"),
    case("train", QUICK + ["--gin.BLEND_WEIGHTS=[1.0, 2.0]"], "BLEND_WEIGHTS=[1.0, 2.0]"),
    case("train", QUICK + ["--gin.optim.make_optimizer.b1=2.0"], "b1=2"),
    case("train", QUICK + ["--gin.model_config.overrides={{'num_layers': -1}}"], "'num_layers': -1"),
    case("train", QUICK + ["--gin.LEARNING_RATE=1e400"], "LEARNING_RATE=inf"),
    case("train", QUICK + ["--gin.optim.make_optimizer.total_steps=100"], "the schedule's length is TRAIN_STEPS",
         id="train:the retired make_optimizer.total_steps"),
    case("train", QUICK + ["--gin.TOKENIZER='{binary_json}'"], "{binary_json}"),
    # issue 52: --print_config checks the model's vocabulary against the token files' tokenizer (their P.json)
    case("train", QUICK + ["--gin.DATA_PATH='{tokens}'", "--gin.model_config.vocab_from_tokenizer=False",
                           "--gin.model_config.overrides={{'vocab_size': 1000}}"],
         "has 50257 ids but the model's vocab_size is 1000", id="train:print_config, model vocab below the data's"),
    case("train", QUICK + ["--gin.DATA_PATH='{tmp}/'"], "{tmp}/: names a folder, but a token file is named by its "
         "prefix", id="train:DATA_PATH naming a folder"),
    # preprocess and train_tokenizer (one subprocess each, below)
    case("preprocess", ["--input={text}", "--output_prefix={afile}/out", "--tokenizer={tok}", "--workers=1"],
         "--output_prefix={afile}/out"),
    case("preprocess", ["--input={text}", "--output_prefix=/proc/t5x_like_out", "--tokenizer={tok}", "--workers=1"],
         "--output_prefix=/proc/t5x_like_out"),
    case("preprocess", ["--input={text}", "--output_prefix={tmp}/out", "--tokenizer={binary_json}", "--workers=1"],
         "--tokenizer={binary_json}", writes=["{tmp}/out.bin"]),
    case("preprocess", ["--input={text}", "--output_prefix={tmp}/out", "--tokenizer={tok}", "--workers=0"],
         "--workers=0", writes=["{tmp}/out.bin"]),
    case("preprocess", ["--input={arr}", "--output_prefix={tmp}/arr", "--tokenizer={tok}", "--workers=1"],
         "would write {tmp}/arr.json over the input {arr}", writes=["{tmp}/arr.bin"]),
    # issue 52: a prefix that names a folder wrote hidden .bin/.idx/.json in it; sizes below what a tokenizer can give
    case("preprocess", ["--input={text}", "--output_prefix={tmp}/pfx/", "--tokenizer={tok}", "--workers=1"],
         "--output_prefix={tmp}/pfx/ names a folder", writes=["{tmp}/pfx"]),
    case("preprocess", ["--input={text}", "--output_prefix={tmp}", "--tokenizer={tok}", "--workers=1"],
         "--output_prefix={tmp} names a folder", writes=["{tmp}.bin", "{tmp}/.bin"]),
    case("train_tokenizer", ["--input={text}", "--output={tmp}/tokdir/"], "--output={tmp}/tokdir/ ends with a "
         "separator", writes=["{tmp}/tokdir"]),
    case("train_tokenizer", ["--input={text}", "--output={tmp}/b/t.json", "--vocab_size=10"],
         "--vocab_size=10: a --type=bpe tokenizer has at least 257 ids", writes=["{tmp}/b"]),
    case("train_tokenizer", ["--input={text}", "--output={tmp}/w/v.txt", "--type=wordpiece", "--vocab_size=10"],
         "--vocab_size=10: WordPiece keeps every character of this corpus", writes=["{tmp}/w/v.txt"]),
    case("train_tokenizer", ["--input={text}", "--output={tmp}/c/v.txt", "--type=char", "--vocab_size=3"],
         "--vocab_size=3: a --type=char tokenizer has at least 6 ids", writes=["{tmp}/c"]),
    case("train_tokenizer", ["--input={text}", "--output={tmp}/t.json", "--vocab_size=0"], "--vocab_size=0",
         writes=["{tmp}/t.json"]),
    case("train_tokenizer", ["--input={text}", "--output={tmp}/t.model", "--type=sentencepiece", "--vocab_size=-5"],
         "--vocab_size=-5", writes=["{tmp}/t.model"]),
    case("train_tokenizer", ["--input={text}", "--output=/proc/t5x_like_tok.json"], "--output=/proc/t5x_like_tok.json"),
    case("train_tokenizer", ["--input={binary}", "--output={tmp}/t.model", "--type=sentencepiece",
                             "--vocab_size=300"], "{binary}", writes=["{tmp}/t.model"]),
    case("train_tokenizer", ["--input={text}", "--output={tmp}/v.txt", "--type=char", "--min_count=0"],
         "--min_count=0", writes=["{tmp}/v.txt"]),
    # issue 29: mistakes inside gin files name file:line and the fix, as --gin. flags do
    case("train", ["--gin_file={gin_open_paren}", *QUICK[1:]], "{gin_open_paren}:3: `(` is never closed"),
    case("train", ["--gin_file={gin_open_brace}", *QUICK[1:]], "{gin_open_brace}:2: `{{` is never closed"),
    case("train", ["--gin_file={gin_includ}", *QUICK[1:]], "{gin_includ}:1: "),
    case("train", ["--gin_file={gin_unknown}", *QUICK[1:]],
         "{gin_unknown}:2: Configurable 'train' doesn't have a parameter named 'bogus'"),
    case("train", ["--gin_file={gin_latin1}", *QUICK[1:]], "{gin_latin1}:2: byte 0xe9 is not UTF-8"),
    case("train", ["--gin_file={gin_bad_include}", *QUICK[1:]], "{gin_bad_include}:1: include 'nothere.gin'"),
    case("train", ["--gin_file={gin_dir}", *QUICK[1:]], "--gin_file={gin_dir}: {gin_dir} is a directory"),
    case("train", ["--gin_file={gin_dir}/nothere.gin", *QUICK[1:]], "--gin_file={gin_dir}/nothere.gin: no gin file"),
    case("train", ["--gin_file=quikstart.gin", *QUICK[1:]], "did you mean quickstart.gin?"),
    # issue 53: a model file that only named a preset is gone; the preset name chooses the model
    case("train", [*QUICK[:1], "--gin_file=models/llama3_8b.gin", *QUICK[1:]],
         "--gin_file=models/llama3_8b.gin: no gin file models/llama3_8b.gin; llama3_8b is a model preset: choose it "
         "with model_config.preset = 'llama3_8b' in a gin file, or --gin.model_config.preset=\"'llama3_8b'\""),
    case("train", ["--gin_file={gin_model_file}", *QUICK[1:]],
         "{gin_model_file}:2: include 'models/gpt2_tiny.gin': no gin file models/gpt2_tiny.gin; gpt2_tiny is a model "
         "preset: choose it with model_config.preset = 'gpt2_tiny' in a gin file"),
    case("compile", ["--gin_file={gin_open_brace}"], "{gin_open_brace}:2: `{{` is never closed"),
    # issue 29: a tokenizer that is not the checkpoint's is refused (GPT-2's checkpoint, T5's 32000-id vocabulary;
    # GPT-2's own files with two ids swapped: the same size, another vocabulary)
    case("eval", ["--task=wikitext", "--checkpoint={good}", "--data={text}", "--tokenizer={t5_spiece}"],
         "--tokenizer={t5_spiece} is another vocabulary than the one checkpoint {good} was trained with"),
    case("eval", ["--task=lambada", "--checkpoint={good}", "--data={lambada_bad}", "--tokenizer={swapped}"],
         "--tokenizer={swapped} is another vocabulary than the one checkpoint {good} was trained with"),
    case("generate", GEN + ["--tokenizer={swapped}"], "--tokenizer={swapped} is another vocabulary"),
    case("generate", ["--checkpoint={unrecorded}", "--prompt=hi", "--max_new_tokens=4", "--tokenizer={t5_spiece}"],
         "--tokenizer={t5_spiece} has 32000 ids but the model's vocab_size is 50257"),
    # issue 52: a vocab.txt that is neither BERT's nor CPM-2's, or CPM-2's without <eod>, was described as BERT's
    case("generate", GEN + ["--tokenizer={cpm2_no_eod}"], "{cpm2_no_eod}: not CPM-2's vocabulary: it lacks <eod>",
         id="generate:a CPM-2 vocab.txt without eod"),
    case("generate", GEN + ["--tokenizer={plain_vocab}"], "{plain_vocab}: neither a BERT vocab.txt",
         id="generate:a vocab.txt neither BERT's nor CPM-2's"),
    # issue 29: no output inside a run's checkpoints (`run` is a copy of the good run)
    case("convert", ["to-torch", "{good}", "{run}/checkpoints/2/params/_METADATA"],
         "FILE={run}/checkpoints/2/params/_METADATA is inside {run}/checkpoints"),
    case("convert", ["to-hf", "{good}", "{run}"], "DST={run} is a training run's MODEL_DIR",
         writes=["{run}/config.json", "{run}/model.safetensors"]),
    case("convert", ["to-hf", "{good}", "{run}/checkpoints/2"], "DST={run}/checkpoints/2 is inside {run}/checkpoints",
         writes=["{run}/checkpoints/2/config.json"]),
    case("convert", ["from-hf", "{hf}", "{run}/checkpoints/imported"], "is inside {run}/checkpoints",
         writes=["{run}/checkpoints/imported"]),
    case("generate", GEN + ["--output={run}/checkpoints/out.jsonl"], "--output={run}/checkpoints/out.jsonl is inside",
         writes=["{run}/checkpoints/out.jsonl"]),
    case("eval", EVAL + ["--output={run}/checkpoints/2/eval.json"], "is inside {run}/checkpoints",
         writes=["{run}/checkpoints/2/eval.json"]),
    case("plot", ["{good}", "--output={run}/checkpoints/1/p.png"], "is inside {run}/checkpoints",
         writes=["{run}/checkpoints/1/p.png"]),
    case("compile", ["--gin_file=quickstart.gin", "--output={run}/checkpoints/report.json"], "is inside",
         writes=["{run}/checkpoints/report.json"]),
    case("preprocess", ["--input={text}", "--output_prefix={run}/checkpoints/2/tok", "--tokenizer={tok}",
                        "--workers=1"], "--output_prefix={run}/checkpoints/2/tok is inside",
         writes=["{run}/checkpoints/2/tok.bin"]),
    case("train_tokenizer", ["--input={text}", "--output={run}/checkpoints/t.json"],
         "--output={run}/checkpoints/t.json is inside", writes=["{run}/checkpoints/t.json"]),
    # migrate (issue 52): a number a script's variable leaves empty, values gin cannot write, conflicting flags,
    # script arguments without `--`; and a gin file holding nan
    case("migrate", ["{sogou}", "--output={tmp}/s.gin"], "$NUM_GPUS_PER_WORKER is not set", writes=["{tmp}/s.gin"]),
    case("migrate", ["{mig_unset}", "--num_gpus=1", "--output={tmp}/u.gin"], "$LAYERS is not set",
         writes=["{tmp}/u.gin"]),
    case("migrate", ["{mig_argument}", "--output={tmp}/a.gin"], "$1 is the script's own argument 1",
         writes=["{tmp}/a.gin"]),
    case("migrate", ["{mig_unset}", "--lr", "3e-4"], "python -m t5x_like.migrate {mig_unset} -- --lr 3e-4"),
    case("migrate", ["{mig_nan}", "--num_gpus=8", "--output={tmp}/n.gin"], "--moe-aux-loss-coeff 'nan' is not a finite",
         writes=["{tmp}/n.gin"]),
    case("migrate", ["{mig_fp16_bf16}", "--output={tmp}/f.gin"], "--fp16 (", writes=["{tmp}/f.gin"]),
    case("migrate", ["{mig_long}", "--output={tmp}/l.gin"], "--seq-length 2048", writes=["{tmp}/l.gin"]),
    case("train", ["--gin_file={gin_nan}", "--print_config"], "LEARNING_RATE = nan"),
    case("train", QUICK + ["--gin.LEARNING_RATE=inf"], "--gin.LEARNING_RATE=inf: inf is not a value gin reads",
         id="train:--gin.LEARNING_RATE=inf"),
]


def placeholders(runs: dict, tmp: str) -> dict:
    """Every {name} a case may use, its files made under `tmp` (bad inputs) or taken from `runs`."""
    os.makedirs(tmp, exist_ok=True)
    write = lambda name, data: (open(os.path.join(tmp, name), "wb").write(data), os.path.join(tmp, name))[1]  # noqa
    hf_dir = lambda name, config=None, truncate=False: _hf_variant(runs["hf"], os.path.join(tmp, name), config,
                                                                   truncate)
    good_copy = os.path.join(tmp, "good_copy")
    if not os.path.isdir(good_copy):
        shutil.copytree(runs["good"], good_copy)
    return dict(
        tmp=tmp, good=runs["good"], tokens=runs["tokens"], other_tokens=runs["other_tokens"], hf=runs["hf"],
        tok=gpt2_bpe(), afile=write("afile", b"a file\n"), binary=write("binary.txt", bytes(range(256)) * 64),
        binary_json=write("binary.json", b"\xff\xfe\x00garbage" * 50),
        noprompt=write("prompts.jsonl", b'{"text": "no prompt field"}\n'),
        lambada_bad=write("lambada.jsonl", b'{"text": "fine"}\n{"txt": "no text field"}\n'),
        pairs=write("pairs.jsonl", b'{"inputs": "a", "targets": "b"}\n'),
        text=write("corpus.txt", b"some text to tokenize\n" * 20),
        cpm2_no_eod=write("cpm2_vocab.txt", "".join(f"{p}\n" for p in ["<unk>", "<s>", "<pad>", "\u2582", "\u2583", "你",
                                                                    *(f"<s_{i}>" for i in range(190))]).encode()),
        plain_vocab=write("plain_vocab.txt", b"a\nb\nc\n"),
        arr=write("arr.json", b'[{"text": "a JSON array of documents"}, {"text": "read by preprocess"}]\n'),
        hf_list=hf_dir("hf_list", config=[1, 2]), hf_fields=hf_dir("hf_fields", config={"model_type": "gpt2"}),
        hf_truncated=hf_dir("hf_truncated", truncate=True),
        good_copy=good_copy, run=good_copy, unrecorded=runs["unrecorded"],
        t5_spiece=str(shared_file("t5-spiece")), swapped=swapped_bpe(tmp),
        sogou=str(unset_gpu_count_script(Path(tmp))),
        **gin_files(tmp), **{name: write(name + ".sh", text) for name, text in MIGRATE_FILES.items()},
    )


GIN_FILES = {  # issue 29: mistakes inside gin files (each includes the quickstart run file first)
    "gin_open_paren": b"include 'quickstart.gin'\n\nTRAIN_STEPS = (3\n",
    "gin_open_brace": b"include 'quickstart.gin'\nmodel_config.overrides = {'num_layers': 1,\n  'embed_dim': 32\n",
    "gin_includ": b"includ 'quickstart.gin'\n",
    "gin_unknown": b"include 'quickstart.gin'\ntrain.bogus = 3\n",
    "gin_latin1": b"include 'quickstart.gin'\n# caf\xe9\nTRAIN_STEPS = 3\n",
    "gin_bad_include": b"include 'nothere.gin'\n",
    "gin_nan": b"include 'quickstart.gin'\nLEARNING_RATE = nan\n",
    "gin_model_file": b"include 'base.gin'\ninclude 'models/gpt2_tiny.gin'\n",
}
MIGRATE_FLAGS = (b"--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --max-position-embeddings "
                 b"64 --vocab-size 512 --micro-batch-size 1 --global-batch-size 8 --lr 1e-4 --train-iters 10 ")
MIGRATE_FILES = {  # issue 52: upstream launch scripts and flags migrate refuses in one line
    "mig_unset": b"#!/bin/bash\npython pretrain_gpt.py --num-layers $LAYERS --hidden-size 64 --num-attention-heads 4 "
                 b"--seq-length 64 --lr $1 --micro-batch-size 1 --global-batch-size 8 --train-iters 10\n",
    "mig_argument": b"#!/bin/bash\npython pretrain_gpt.py " + MIGRATE_FLAGS.replace(b"--lr 1e-4", b"--lr $1") + b"\n",
    "mig_nan": MIGRATE_FLAGS.replace(b"--num-layers", b"--num-experts 4 --swiglu --normalization RMSNorm "
                                     b"--position-embedding-type rope --moe-aux-loss-coeff nan --num-layers"),
    "mig_fp16_bf16": MIGRATE_FLAGS + b"--fp16\n--bf16\n",
    "mig_long": MIGRATE_FLAGS.replace(b"--seq-length 64", b"--seq-length 2048"),
}


def swapped_bpe(tmp: str) -> str:
    """GPT-2's BPE files with the ids of two tokens swapped: as many ids, another vocabulary."""
    directory = os.path.join(tmp, "swapped_bpe")
    if not os.path.isdir(directory):
        shutil.copytree(gpt2_bpe(), directory)
        with open(os.path.join(gpt2_bpe(), "encoder.json")) as f:
            encoder = json.load(f)
        encoder["the"], encoder["and"] = encoder["and"], encoder["the"]
        with open(os.path.join(directory, "encoder.json"), "w") as f:
            json.dump(encoder, f)
    return directory


def gin_files(tmp: str) -> dict:
    """{name: path} of the GIN_FILES written under tmp/gin/, and gin_dir: that folder."""
    os.makedirs(os.path.join(tmp, "gin"), exist_ok=True)
    paths = {}
    for name, text in GIN_FILES.items():
        paths[name] = os.path.join(tmp, "gin", name + ".gin")
        with open(paths[name], "wb") as f:
            f.write(text)
    return {**paths, "gin_dir": os.path.join(tmp, "gin")}


def _hf_variant(source: str, path: str, config, truncate: bool) -> str:
    if not os.path.isdir(path):
        shutil.copytree(source, path)
        if config is not None:
            with open(os.path.join(path, "config.json"), "w") as f:
                json.dump(config, f)
        if truncate:
            weights = os.path.join(path, "model.safetensors")
            os.truncate(weights, os.path.getsize(weights) // 2)
    return path


def check_case(cli, args, names, writes, outcome, line, values):
    """The assertions every bad input must pass (outcome and line come from judge)."""
    assert outcome == "clear", f"{outcome}: {line}"
    assert line.count("error: ") == 1 and names.format(**values) in line, line
    for path in writes:
        assert not os.path.exists(path.format(**values)), f"{path.format(**values)} was written"
    assert not any(os.path.exists(f"/proc/{n}") for n in ("t5x_like_out.jsonl", "t5x_like_run"))


IN_PROCESS = [c for c in CASES if c.values[0] not in ("preprocess", "train_tokenizer")]
BATCHED = [c for c in CASES if c.values[0] in ("preprocess", "train_tokenizer")]


@pytest.mark.parametrize("cli, args, names, writes", IN_PROCESS)
def test_a_bad_input_is_one_error_line(runs, tmp_path, request, cli, args, names, writes):
    values = placeholders(runs, str(tmp_path))
    outcome, line = judge(cli, [a.format(**values) for a in args])
    record(request.node.callspec.id, outcome, line, names.format(**values))
    check_case(cli, args, names, writes, outcome, line, values)


@pytest.mark.parametrize("cli", ["preprocess", "train_tokenizer"])
@pytest.mark.system
def test_bad_inputs_of_the_data_tools_are_one_error_line(runs, tmp_path, cli):
    """The cases of one data tool, run in one subprocess (its absl flags are its own)."""
    values = placeholders(runs, str(tmp_path))
    cases = [c for c in BATCHED if c.values[0] == cli]
    argvs = [[a.format(**values) for a in c.values[1]] for c in cases]
    done = subprocess.run([sys.executable, __file__, cli, json.dumps(argvs)], cwd=REPO, capture_output=True,
                          text=True, timeout=600, env=dict(os.environ, PYTHONPATH=REPO))
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for c, (outcome, line) in zip(cases, results):
        record(c.id, outcome, line, c.values[2].format(**values))
    for c, (outcome, line) in zip(cases, results):
        check_case(*c.values, outcome, line, values)


# ---------------------------------------------------------------- issue 29: outputs, warnings, native faults


def test_a_refused_output_leaves_the_checkpoint_as_it_was(runs, tmp_path):
    """`convert to-torch RUN RUN/checkpoints/2/params/_METADATA` wrote over a file of the checkpoint; now refused,
    the step still verifies (every file's checksum) and reads."""
    from t5x_like.checkpoint import store

    values = placeholders(runs, str(tmp_path))
    step = os.path.join(values["run"], "checkpoints", "2")
    for argv in (["to-torch", values["good"], os.path.join(step, "params", "_METADATA")],
                 ["to-hf", values["good"], step], ["to-hf", values["good"], values["run"]]):
        assert judge("convert", argv)[0] == "clear"
    assert store.verify_manifest(step)
    assert judge("convert", ["to-torch", values["run"], str(tmp_path / "state.pt")])[0] == "silent"


def test_to_hf_replaces_the_model_in_a_folder_only_when_asked(runs, tmp_path):
    """`convert to-hf CKPT DIR` with another model's export in DIR: refused, DIR as it was; with --overwrite the
    earlier export's files go (its generation_config.json no longer sits beside the new model) and other files
    stay."""
    dst = tmp_path / "hf"
    shutil.copytree(runs["hf"], dst)
    (dst / "generation_config.json").write_text('{"bos_token_id": 7}')
    (dst / "config.json").write_text('{"model_type": "another model"}')
    (dst / "notes.txt").write_text("the user's own")
    before = {p.name: p.read_bytes() for p in dst.iterdir()}
    outcome, line = judge("convert", ["to-hf", runs["good"], str(dst)])
    assert (outcome, line) == ("clear", f"error: DST={dst} already holds files (config.json, "
                                        "generation_config.json, model.safetensors, notes.txt, ...); to-hf writes "
                                        "into a new or empty folder: give another DST, or add --overwrite to replace "
                                        "the model there.")
    assert {p.name: p.read_bytes() for p in dst.iterdir()} == before
    assert judge("convert", ["to-hf", runs["good"], str(dst), "--overwrite"])[0] == "silent"
    assert not (dst / "generation_config.json").exists() and (dst / "notes.txt").read_text() == "the user's own"
    assert json.loads((dst / "config.json").read_text())["model_type"] == "gpt2"
    assert (dst / "model.safetensors").read_bytes() == (Path(runs["hf"]) / "model.safetensors").read_bytes()
    umask = os.umask(0)
    os.umask(umask)
    assert {p.name: oct(p.stat().st_mode & 0o777) for p in dst.iterdir() if p.name != "notes.txt"} == {
        p.name: oct(0o666 & ~umask) for p in dst.iterdir() if p.name != "notes.txt"}  # safetensors' file was 0600


@pytest.mark.system
def test_a_bad_input_in_a_new_process_is_exactly_one_line(tmp_path):
    """As a user's shell shows it: nothing before the error line (orbax warned about its own type handler first)."""
    done = subprocess.run([sys.executable, "-m", "t5x_like.convert", "to-hf", "nothere", "hf"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300, env=cpu_env(1))
    assert (done.returncode, done.stdout, done.stderr.splitlines()) == (1, "", [
        f"error: no checkpoint at {tmp_path}/nothere: expected a MODEL_DIR containing 'checkpoints/<step>/' or a step "
        "directory such as MODEL_DIR/checkpoints/1000."])


def test_outputs_go_into_new_folders_made_before_the_work(runs, tmp_path):
    """generate / eval / plot / to-torch --output=NEWDIR/x: the folder is made first (they did all the work, then
    died on FileNotFoundError)."""
    good, tokens = runs["good"], runs["tokens"]
    for cli, argv, out in (
            ("generate", [f"--checkpoint={good}", "--prompt=hi", "--max_new_tokens=2"], "new/a/out.jsonl"),
            ("eval", [f"--checkpoint={good}", "--task=tokens", f"--data={tokens}", "--seq_len=16"], "new/b/eval.json"),
            ("plot", [good], "new/c/plot.png"),
            ("convert", ["to-torch", good], "new/d/state.pt")):
        path = str(tmp_path / out)
        outcome, line = judge(cli, argv + ([path] if cli == "convert" else [f"--output={path}"]))
        assert outcome == "silent" and os.path.getsize(path) > 0, (cli, outcome, line)


def test_a_mistake_in_the_extra_gin_file_names_its_line(tmp_path, monkeypatch):
    """T5X_LIKE_EXTRA_GIN's file is checked as --gin_file's are."""
    from t5x_like.config import frontend

    extra = tmp_path / "extra.gin"
    extra.write_text("train.log_every = 5\nmodel_config.overrides = {'num_layers': 1,\n")
    monkeypatch.setenv(frontend.EXTRA_GIN_ENV, str(extra))
    outcome, line = judge("train", [a.format(tmp=tmp_path) for a in QUICK])
    assert (outcome, line) == ("clear", f"error: {extra}:2: `{{` is never closed (the file ends inside it); add the `}}`.")


def test_learning_rate_zero_is_warned(tmp_path, caplog):
    outcome, line = judge("train", [a.format(tmp=tmp_path) for a in QUICK] + ["--gin.LEARNING_RATE=0.0"])
    assert outcome == "silent", line
    assert [r.getMessage() for r in caplog.records if "LEARNING_RATE=0" in r.getMessage()] == [
        "LEARNING_RATE=0: every update is zero, so training leaves the parameters as they start (weight decay too); "
        "set a positive LEARNING_RATE, e.g. --gin.LEARNING_RATE=3e-4"]


def test_a_prompt_cut_to_the_context_is_warned(runs, tmp_path, caplog):
    """The checkpoint's max_len is 32: with --max_new_tokens=4 a prompt keeps its last 28 tokens, saying so."""
    from t5x_like.data.tokenizer import load_tokenizer

    prompt = "the quick brown fox jumps over the lazy dog " * 5
    length = len(load_tokenizer(gpt2_bpe()).encode(prompt))
    outcome, line = judge("generate", [f"--checkpoint={runs['good']}", f"--prompt={prompt}", "--prompt=short",
                                       "--max_new_tokens=4", "--temperature=0", f"--output={tmp_path}/out.jsonl"])
    assert outcome == "silent", line
    warnings = [r.getMessage() for r in caplog.records if "dropped" in r.getMessage()]
    assert warnings == [f"prompt 1 is {length} tokens but the model's max_len 32 less --max_new_tokens=4 leaves room "
                        f"for 28: its first {length - 28} tokens are dropped; shorten it or lower --max_new_tokens"]


def run_module(module: str, argv: list[str], cwd, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", module, *argv], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ, PYTHONPATH=REPO, JAX_PLATFORMS="cpu"))


@pytest.mark.system
def test_preprocess_counts_nul_characters_and_drops_byte_order_marks(tmp_path):
    """A BOM opening a file (or a JSON document) is dropped as utf-8-sig readers drop it; NULs are kept and
    counted; both are reported in the summary (they went into the tokens without a word)."""
    from t5x_like.data import open_token_file
    from t5x_like.data.tokenizer import load_tokenizer

    (tmp_path / "a.txt").write_bytes(b"\xef\xbb\xbfhello world\x00 and more\n")
    (tmp_path / "b.jsonl").write_bytes(b'\xef\xbb\xbf{"text": "\\ufeffjson doc"}\n{"text": "x\\u0000y\\u0000"}\n')
    done = run_module("t5x_like.data.preprocess", ["--input=a.txt,b.jsonl", "--output_prefix=out/tok",
                                                   f"--tokenizer={gpt2_bpe()}", "--workers=1"], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.splitlines()[-2:] == [
        "note: 3 UTF-8 byte-order marks (U+FEFF) opening files or documents were dropped, as utf-8-sig readers "
        "drop them",
        "warning: a.txt:1: 3 NUL characters (U+0000) in 2 documents (the first here) were tokenized as text; a "
        "binary or UTF-16 file among the inputs? Remove them from the corpus if unintended"]
    tokenizer, file = load_tokenizer(gpt2_bpe()), open_token_file(tmp_path / "out" / "tok")
    texts = [tokenizer.decode(file.document(i)[:-1].tolist()) for i in range(file.num_documents)]
    assert texts == ["hello world\x00 and more\n", "json doc", "x\x00y\x00"]


@pytest.mark.system
def test_sentencepiece_trains_on_a_line_longer_than_its_limit(tmp_path):
    """One 1 MB line (sentencepiece skips lines over 4192 bytes, so it had no sentence left: an INTERNAL error) is
    cut at spaces into lines it takes, saying so."""
    rng = np.random.default_rng(0)
    words = ["".join(rng.choice(list("abcdefghij"), size=rng.integers(2, 7))) for _ in range(200)]
    (tmp_path / "long.txt").write_text(" ".join(rng.choice(words, size=200_000)) + "\n")
    done = run_module("t5x_like.data.train_tokenizer", ["--input=long.txt", "--type=sentencepiece",
                                                        "--output=tok/sp.model", "--vocab_size=300"], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "1 lines longer than 4192 bytes (sentencepiece's limit) were cut into pieces at spaces" in done.stderr
    from t5x_like.data.tokenizer import load_tokenizer
    assert load_tokenizer(str(tmp_path / "tok" / "sp.model")).vocab_size == 300


def test_a_token_file_cut_short_while_training_reads_it_is_named(tmp_path):
    """A mapped file truncated under a reader was a SIGBUS naming nothing; now the next read names it. The
    batches come from the loader training uses (make_source), and its grain worker processes map it anew."""
    import pickle

    from t5x_like.data import SourceSettings, make_source, open_token_file
    from t5x_like.data.token_file import TokenFileError, TokenFileWriter

    prefix = str(tmp_path / "tok")
    made_with = {"path": "t", "sha256": "0" * 64, "vocab_size": 1000, "eod_id": 0}
    with TokenFileWriter(prefix, np.uint16, {"tokenizer": made_with}) as writer:
        writer.write(np.arange(100_000, dtype=np.uint16) % 1000, np.full(50, 2000))
    source = make_source("train", SourceSettings(data_path=prefix, data_split="1,0,0"), batch_size=4,
                         feature_lengths={"targets": 32}, seed=0, shard_index=0, shard_count=1)
    try:
        next(source)
        os.truncate(prefix + ".bin", 1000)
        with pytest.raises(TokenFileError, match=f"{prefix}.bin: now 1000 bytes, 200000 when opened: the file was "
                                                 "cut short while being read"):
            for _ in range(100):
                next(source)
    finally:
        source.close()
    with pytest.raises(TokenFileError, match=f"{prefix}.bin: 1000 bytes but {prefix}.idx describes 200000"):
        open_token_file(prefix)
    os.truncate(prefix + ".bin", 200_000)
    tokens = open_token_file(prefix).tokens
    assert pickle.loads(pickle.dumps(tokens))[5:8].tolist() == [5, 6, 7]


# ---------------------------------------------------------------- issue 29: storage faults while training

TINY = ["--gin_file=quickstart.gin", "--gin.MODEL_DIR='run'", "--gin.BATCH_SIZE=2", "--gin.SEQ_LEN=16",
        "--gin.TRAIN_STEPS=6", "--gin.WARMUP_STEPS=1", "--gin.CHECKPOINT_EVERY=2", "--gin.EVAL_EVERY=0",
        "--gin.model_config.overrides={'num_layers': 1, 'embed_dim': 32, 'num_heads': 2, 'mlp_dim': 64}"]
FILE_SIZE_LIMIT = 64 << 10  # bytes: metrics.jsonl and the TensorBoard file stay below; a checkpoint's data does not


@pytest.fixture(scope="module")
def compile_cache(tmp_path_factory) -> dict:
    """Environment for the fault runs: one JAX cache so that the runs after the first load the train step
    instead of compiling it."""
    return {"JAX_COMPILATION_CACHE_DIR": str(
        tmp_path_factory.mktemp("jax_cache")), "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
        "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}


def train_with_fault(fault: str, cwd, env: dict) -> subprocess.CompletedProcess:
    """`python -m t5x_like.train TINY` in `cwd` with a storage fault injected in the process (see __main__)."""
    return subprocess.run([sys.executable, __file__, "train_with_fault", fault, json.dumps(TINY)], cwd=cwd,
                          capture_output=True, text=True, timeout=600,
                          env={**cpu_env(1), **env, "PYTHONPATH": REPO})


def inject(fault: str) -> None:
    """Storage faults, as a real run meets them: 'full_at_start' (every write past a byte fails from the start),
    'full_after_first_checkpoint' (past FILE_SIZE_LIMIT bytes, once step 2 is committed: the next save fails in
    tensorstore's native writers), 'checkpoints_removed' (checkpoints/ deleted while step 4's save is in flight,
    before its commit).
    The size limit is RLIMIT_FSIZE (EFBIG, "File too large"), standing in for a full disk (ENOSPC), which needs
    a mounted filesystem of limited size: both fail the same writes with an errno."""
    import resource

    from t5x_like.checkpoint import store

    if fault == "full_at_start":
        resource.setrlimit(resource.RLIMIT_FSIZE, (1, 1))
    elif fault == "full_after_first_checkpoint":
        finalise = store.Checkpointer._on_finalise

        def _on_finalise(self):
            finalise(self)
            resource.setrlimit(resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, FILE_SIZE_LIMIT))
        store.Checkpointer._on_finalise = _on_finalise
    else:  # removed once step 4's files are written, before orbax commits them (earlier, orbax may write them anew)
        finalise = store.Checkpointer._on_finalise

        def remove_then_finalise(self):
            if self._saving == 4:
                shutil.rmtree(self.directory, ignore_errors=True)
            finalise(self)
        store.Checkpointer._on_finalise = remove_then_finalise


def last_line(stderr: str) -> str:
    return [line for line in stderr.splitlines() if line.strip()][-1]


@pytest.mark.parametrize("fault, expected", [
    ("full_at_start", ["error: cannot write run/run.lock: File too large; there is no checkpoint ({cwd}/run/"
                       "checkpoints does not exist). To go on, allow larger files (a file size limit was reached), "
                       "then run the same command again: it starts the run from step 0."]),
    ("full_after_first_checkpoint", ["error: the checkpoint of step 4 could not be written in {cwd}/run/checkpoints: "
                                     "File too large; the last good checkpoint is {cwd}/run/checkpoints/2 (every file "
                                     "present at its recorded size). To go on, allow larger files"]),
    ("checkpoints_removed", ["error: ", "{cwd}/run/checkpoints", "To go on, a folder was removed while the run wrote "
                             "into it: keep MODEL_DIR in place"]),
])
@pytest.mark.system
def test_a_storage_fault_while_training_is_one_line(tmp_path, compile_cache, fault, expected):
    """A full disk at start or mid-run, or checkpoints/ removed during an async save: one line naming the path and
    the fix (no orbax or tensorstore traceback), the last good checkpoint intact (every checksum)."""
    from t5x_like.checkpoint import store

    done = train_with_fault(fault, tmp_path, compile_cache)
    assert done.returncode == 1, done.stderr[-3000:]
    line = last_line(done.stderr)
    assert line.startswith(expected[0].format(cwd=tmp_path)), done.stderr[-3000:]
    assert all(part.format(cwd=tmp_path) in line for part in expected), line
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr[-3000:]
    if fault == "full_after_first_checkpoint":
        assert store.verify_manifest(str(tmp_path / "run" / "checkpoints" / "2"))
    if fault == "full_at_start":
        assert not os.path.exists(tmp_path / "run")


@pytest.mark.system
def test_a_read_only_checkpoints_folder_ends_the_run_after_its_line(tmp_path, compile_cache):
    """checkpoints/ not writable from the start: orbax's save fails in its threads, which then wait forever for
    the save's signals; the process printed its line and never exited. Now it ends at once after the line. As
    root, the run drops the capability that lets root write anywhere (CAP_DAC_OVERRIDE), as a user's run has
    none."""
    (tmp_path / "run" / "checkpoints").mkdir(parents=True)
    os.chmod(tmp_path / "run" / "checkpoints", 0o555)
    as_a_user = []
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("running as root, and without setpriv (util-linux) to drop root's write-anywhere capability")
        as_a_user = ["setpriv", "--bounding-set=-dac_override,-dac_read_search",
                     "--inh-caps=-dac_override,-dac_read_search"]
    done = subprocess.run([*as_a_user, sys.executable, "-m", "t5x_like.train", *TINY], cwd=tmp_path,
                          capture_output=True, text=True, timeout=240, env={**cpu_env(1), **compile_cache})
    assert done.returncode == 1, done.stderr[-3000:]
    assert last_line(done.stderr) == (
        f"error: the checkpoint of step 2 could not be written in {tmp_path}/run/checkpoints: Permission denied; "
        f"{tmp_path}/run/checkpoints holds no intact checkpoint. To go on, make it writable, then run the same "
        "command again: it starts the run from step 0."), done.stderr[-3000:]
    assert "Traceback" not in done.stderr and not (tmp_path / "run" / "run.lock").exists()


def test_storage_faults_are_read_from_what_orbax_and_tensorstore_raise(runs, tmp_path):
    """The errors a full disk, a removed folder and a read-only folder raised in real runs (tensorstore's status
    text, a Python OSError) give the path and the fix; a damaged newest step is passed over."""
    from t5x_like.checkpoint import storage

    step = "/r/checkpoints/4.orbax-checkpoint-tmp/params.orbax-checkpoint-tmp/ocdbt.process_0"
    full = ValueError(f'RESOURCE_EXHAUSTED: Error writing "b/0.0" in OCDBT database at local file "{step}/": Failed '
                      f'writing: "{step}/d/3a": Failed to write 954368 bytes to file 11: No space left on device '
                      "[os_error_code='28']")
    removed = ValueError(f'NOT_FOUND: Error writing "b/0.0" in OCDBT database at local file "{step}/": Error reading '
                         f'Byte range [0, 549) of local file "{step}/d/31"')
    assert storage.fault(RuntimeError("wrapped")) is None
    assert storage.fault(ValueError("NOT_FOUND: no such key")) is None
    assert storage.fault(full) == (28, f"{step}/d/3a", "No space left on device")
    try:
        raise RuntimeError("a save failed") from removed
    except RuntimeError as e:
        assert storage.fault(e) == (2, f"{step}/d/31", "No such file or directory")
    gone = ValueError("No ArrayMetadata found for process_index=0 in the checkpoint directory: /r/checkpoints/"
                      "4.orbax-checkpoint-tmp/train_state.orbax-checkpoint-tmp. But input PyTree ...")
    assert storage.fault(gone) is None and storage.aftermath(gone)  # orbax's own error when the files vanished
    denied = PermissionError(13, "Permission denied", "/r/metrics.jsonl")
    assert storage.message("/r", *storage.fault(denied)) == (
        "cannot write /r/metrics.jsonl: Permission denied; there is no checkpoint (/r/checkpoints does not exist). "
        "To go on, make it writable, then run the same command again: it starts the run from step 0.")
    run = placeholders(runs, str(tmp_path))["run"]
    data = max((os.path.join(r, f) for r, _, fs in os.walk(os.path.join(run, "checkpoints", "2")) for f in fs),
               key=os.path.getsize)
    os.truncate(data, 10)
    assert storage.last_good_checkpoint(run) == (
        f"the last good checkpoint is {run}/checkpoints/1 (every file present at its recorded size); step(s) [2] are "
        f"damaged", f"{run}/checkpoints/1")


if __name__ == "__main__" and sys.argv[1] == "train_with_fault":  # the subprocess of train_with_fault
    from t5x_like import train
    from t5x_like.config import cli
    from t5x_like.errors import run_absl_app

    inject(sys.argv[2])
    sys.argv[1:] = json.loads(sys.argv[3])
    run_absl_app(train.main, flags_parser=cli.parse_flags)
elif __name__ == "__main__":  # the subprocess of test_bad_inputs_of_the_data_tools_are_one_error_line
    tool = sys.argv[1]
    __import__(f"t5x_like.data.{tool}", fromlist=["define_flags"]).define_flags()
    print(json.dumps([judge(tool, argv) for argv in json.loads(sys.argv[2])]))
