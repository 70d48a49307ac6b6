"""The CLIs as a user types them (issue 28): a working directory of their own, relative paths, a tokenizer
given as a relative path, then the same run read from another directory, after the run folder moved and the
tokenizer's folder is gone. A GPT2-Chinese-style user: a character vocab.txt, a preprocessed corpus, a small
GPT-2, resumed; then generate, eval and convert to-hf from elsewhere; then a learning rate that diverges, and
the restart that resumes from the last checkpoint whose own loss was finite."""
import json
import os
import shutil
import subprocess
import sys

import pytest

from t5x_like.data import load_tokenizer
from tests.support.environment import cpu_env

pytestmark = pytest.mark.system

TINY = ("--gin.BATCH_SIZE=8", "--gin.SEQ_LEN=32", "--gin.WARMUP_STEPS=0", "--gin.EVAL_EVERY=0",
        "--gin.model_config.vocab_from_tokenizer=True",
        "--gin.model_config.overrides=\"{'num_layers': 1, 'embed_dim': 64, 'mlp_dim': 128, 'num_heads': 2}\"")


def cli(cwd, module, *args, env, check=True):
    """`python -m module args` in `cwd`, the way a shell would run it (the arguments as a user quotes them)."""
    command = " ".join([sys.executable, "-m", module, *args])
    done = subprocess.run(command, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=400)
    if check:
        assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
    return done


def train(cwd, model_dir, steps, *extra, env, check=True):
    return cli(cwd, "t5x_like.train", "--gin_file=quickstart.gin", f"--gin.MODEL_DIR=\"'{model_dir}'\"",
               f"--gin.TRAIN_STEPS={steps}", *TINY, *extra, env=env, check=check)


@pytest.fixture(scope="module")
def user(tmp_path_factory, builtin_texts):
    """`work/`: a corpus, a character vocabulary trained on it, the corpus preprocessed with it, and a run
    trained 2 steps then resumed to 4, all with paths relative to `work/`; `other/`: a second directory."""
    root = tmp_path_factory.mktemp("user")
    work, other = root / "work", root / "other"
    work.mkdir()
    other.mkdir()
    env = cpu_env(1, JAX_COMPILATION_CACHE_DIR=str(root / "jax-cache"), JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
    with open(work / "corpus.jsonl", "w") as f:
        for text in builtin_texts[:300]:
            f.write(json.dumps({"text": text}) + "\n")
    (work / "wiki.txt").write_text(" = Heading = \n\n" + builtin_texts[301][:3000] + " \n", encoding="utf-8")
    cli(work, "t5x_like.data.train_tokenizer", "--input=corpus.jsonl", "--type=char", "--output=char_tok/vocab.txt",
        "--vocab_size=2000", env=env)
    cli(work, "t5x_like.data.preprocess", "--input=corpus.jsonl", "--output_prefix=data/corpus",
        "--tokenizer=char_tok/vocab.txt", env=env)
    first = train(work, "runs/char", 2, "--gin.DATA_PATH=\"'data/corpus'\"", env=env)
    resumed = train(work, "runs/char", 4, "--gin.DATA_PATH=\"'data/corpus'\"", env=env)
    return {"root": root, "work": work, "other": other, "env": env, "first": first, "resumed": resumed,
            "tokenizer": load_tokenizer(work / "char_tok" / "vocab.txt")}


def test_a_relative_model_dir_resumes(user):
    assert "resumed from" in user["resumed"].stderr and "at step 2" in user["resumed"].stderr
    assert "done: step 4/4; this run trained 2 steps" in user["resumed"].stderr
    assert sorted(os.listdir(user["work"] / "runs" / "char" / "checkpoints")) == ["2", "4"]


def test_readers_find_the_tokenizer_from_elsewhere_after_the_run_moved(user, builtin_texts):
    """generate from another directory; then the folder moves and the tokenizer's folder is deleted: eval,
    generate and to-hf still find the tokenizer (the checkpoint holds it), and transformers loads the export."""
    transformers = pytest.importorskip("transformers", reason="needs the torch extra (torch, transformers)")
    other, env = user["other"], user["env"]
    before = cli(other, "t5x_like.generate", "--checkpoint=../work/runs/char", "--prompt=import", "--max_new_tokens=4",
                 "--temperature=0", env=env)
    moved = user["root"] / "moved"
    shutil.move(user["work"], moved)
    shutil.rmtree(moved / "char_tok")
    after = cli(other, "t5x_like.generate", "--checkpoint=../moved/runs/char", "--prompt=import",
                "--max_new_tokens=4", "--temperature=0", env=env)
    assert json.loads(after.stdout)["completion"] == json.loads(before.stdout)["completion"]
    evaluated = cli(other, "t5x_like.eval", "--task=wikitext", "--checkpoint=../moved/runs/char",
                    "--data=../moved/wiki.txt", "--output=results/wiki.json", env=env)
    assert json.loads((other / "results" / "wiki.json").read_text())["ppl"] > 1, evaluated.stdout
    cli(other, "t5x_like.convert", "to-hf", "../moved/runs/char", "hf", env=env)
    reference = transformers.AutoTokenizer.from_pretrained(str(other / "hf"))
    text = builtin_texts[302][:500]
    assert reference.encode(text, add_special_tokens=False) == user["tokenizer"].encode(text)
    assert load_tokenizer(other / "hf").sha256 == user["tokenizer"].sha256
    user["work"] = moved


def test_a_diverged_checkpoint_is_never_resumed_from(user):
    """LEARNING_RATE=1e38: step 5's update is finite (parameters ~1e38) and checkpointed, step 6's loss is
    not: one line, no traceback, checkpoint 5 set aside; the restart at a sane rate resumes from step 4."""
    other, env = user["other"], user["env"]
    run_dir = os.path.relpath(user["work"] / "runs" / "char", other)
    data = f"--gin.DATA_PATH=\"'{os.path.relpath(user['work'] / 'data' / 'corpus', other)}'\""
    diverged = train(other, run_dir, 8, data, "--gin.LEARNING_RATE=1e38", "--gin.CHECKPOINT_EVERY=1", env=env,
                     check=False)
    assert diverged.returncode == 1 and "Traceback" not in diverged.stderr
    last = diverged.stderr.strip().splitlines()[-1]
    assert last.startswith("error: step 6: loss is nan") and "held that state and were set aside" in last
    assert "a restart resumes from step 4" in last
    checkpoints = user["work"] / "runs" / "char" / "checkpoints"
    assert sorted(os.listdir(checkpoints)) == ["2", "4", "5.nonfinite"]
    restarted = train(other, run_dir, 6, data, env=env)
    assert "at step 4" in restarted.stderr and "done: step 6/6" in restarted.stderr
