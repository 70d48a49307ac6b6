"""Writes tests/data/golden: small checkpoints of every family, trained 2 steps by the code of the day, with what
that code computed from them (expected.npz): logits on fixed inputs, the Hugging Face tensors `convert to-hf`
writes, and the loss and gradient norm of one more step after a resume. tests/t5x_like/checkpoint/test_golden.py
checks that later code restores them and behaves identically (the layer-library and objectives redesign of
issue 30 must not change a checkpoint's meaning).

    JAX_PLATFORMS=cpu .venv/bin/python tests/data/golden/make_golden.py   # from the repository root

Written 2026-11-26 by the code of commit 166cbd5 (before issue 30's redesign). Do not rerun it after a change
that is meant to keep checkpoints working: its output is the reference.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("JAX_PLATFORMS", "cpu")
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from models.bert import BertConfig, RobertaConfig  # noqa: E402
from models.gpt2 import GPT2Config  # noqa: E402
from models.neox import NeoXConfig  # noqa: E402
from models.t5 import T5Config  # noqa: E402
from partitioning import make_mesh  # noqa: E402
from t5x_like import inference, metrics, optim  # noqa: E402
from t5x_like.convert import hf  # noqa: E402
from t5x_like.data import SourceSettings, make_source  # noqa: E402
from t5x_like.data.builtin import builtin_documents  # noqa: E402
from t5x_like.data.preprocess import preprocess  # noqa: E402
from t5x_like.data.train_tokenizer import train_byte_level_bpe  # noqa: E402
from t5x_like.experiment import ExperimentSettings  # noqa: E402
from t5x_like.run import loop  # noqa: E402
from t5x_like.run.settings import LoopSettings, RunSettings  # noqa: E402
from t5x_like.lm import make_lm  # noqa: E402

VOCAB = 320
RUNS = {
    # name: (config, objective, feature lengths)
    "gpt2": (GPT2Config(vocab_size=VOCAB, max_len=16, num_layers=2, num_heads=2, embed_dim=16, mlp_dim=24,
                        dropout_rate=0.0, attention_dropout_rate=0.0, vocab_pad_multiple=64),
             "causal_lm", {"targets": 16}),
    "neox": (NeoXConfig(vocab_size=VOCAB, max_len=16, num_layers=2, num_heads=2, embed_dim=16, mlp_dim=24,
                        rotary_pct=0.5, use_parallel_residual=True, scan_layers=False, vocab_pad_multiple=64),
             "causal_lm", {"targets": 16}),
    "t5": (T5Config(vocab_size=VOCAB + 100, num_layers=2, num_decoder_layers=2, num_heads=2, embed_dim=16, d_kv=8,
                    mlp_dim=24, feed_forward="gated-gelu", tie_word_embeddings=False, dropout_rate=0.0,
                    vocab_pad_multiple=64),
           "span_corruption", {"inputs": 16, "targets": 8}),
    "bert": (BertConfig(vocab_size=VOCAB + 3, max_len=16, num_layers=2, num_heads=2, embed_dim=16, mlp_dim=24,
                        dropout_rate=0.0, attention_dropout_rate=0.0, vocab_pad_multiple=64),
             "mlm", {"inputs": 16}),
    "roberta": (RobertaConfig(vocab_size=VOCAB + 3, max_len=18, num_layers=2, num_heads=2, embed_dim=16, mlp_dim=24,
                              dropout_rate=0.0, attention_dropout_rate=0.0, vocab_pad_multiple=64),
                "mlm", {"inputs": 16}),
}


def data_source(objective: str, corpus: str):
    return functools.partial(make_source, settings=SourceSettings(objective=objective, data_path=corpus))


def experiment(config, lengths) -> ExperimentSettings:
    return ExperimentSettings(model=config, mesh=make_mesh(data=1, devices=jax.devices()[:1]), batch_size=4,
                              optimizer=optim.OptimizerSettings(learning_rate=1e-2, warmup_steps=1, decay_steps=3),
                              feature_lengths=lengths)


def run(model_dir: Path, name: str, steps: int, corpus: str) -> None:
    config, objective, lengths = RUNS[name]
    loop.train(RunSettings(loop=LoopSettings(model_dir=str(model_dir), train_steps=steps, checkpoint_every=2,
                                                 log_every=1, eval_every=0), experiment=experiment(config, lengths)),
                   data_source=data_source(objective, corpus))


def inputs(config, lengths) -> dict[str, np.ndarray]:
    """Fixed inputs for the logits: one batch of the LanguageModel's spec, ids from a fixed generator."""
    rng = np.random.default_rng(0)
    spec = make_lm(config).batch_spec(lengths, 2)
    batch = {}
    for key, shape in spec.items():
        if "segment" in key:
            batch[key] = np.ones(shape.shape, np.int32)
        elif "position" in key:
            batch[key] = np.broadcast_to(np.arange(shape.shape[1], dtype=np.int32), shape.shape).copy()
        elif "weights" in key:
            batch[key] = np.ones(shape.shape, np.float32)
        elif "token_types" in key or "labels" in key:
            batch[key] = np.zeros(shape.shape, np.int32)
        else:
            batch[key] = rng.integers(3, VOCAB, shape.shape).astype(np.int32)
    return batch


def scores(checkpoint: str, config, lengths) -> dict[str, np.ndarray]:
    """Per-token log-probabilities and argmax of the checkpoint's parameters on `inputs`."""
    params = hf.restore_on_host(checkpoint, config)
    batch = inputs(config, lengths)
    out = jax.jit(make_lm(config).score)(params, batch)
    return {f"score/{k}": np.asarray(v) for k, v in out.items()} | {f"input/{k}": v for k, v in batch.items()}


def main() -> None:
    data = HERE / "data"
    for name in RUNS:
        shutil.rmtree(HERE / name, ignore_errors=True)
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir(parents=True)
    documents = builtin_documents()[:120]
    train_byte_level_bpe(documents, VOCAB).save(str(data / "tokenizer.json"))
    with open(data / "corpus.jsonl", "w") as f:
        for text in documents:
            f.write(json.dumps({"text": text}) + "\n")
    os.chdir(HERE)  # the runs name their data relative to this folder, as the test does
    preprocess(["data/corpus.jsonl"], "data/corpus", "data/tokenizer.json")
    (data / "corpus.jsonl").unlink()
    for name, (_, _, lengths) in RUNS.items():
        with tempfile.TemporaryDirectory() as tmp:
            run(Path(tmp) / "run", name, 2, "data/corpus")
            target = HERE / name
            shutil.copytree(Path(tmp) / "run" / "checkpoints", target / "checkpoints")
            expected = scores(str(target), inference.read_config(str(target))[0], lengths)
            expected |= {f"hf/{k}": np.asarray(v) for k, v in hf.hf_tensors(str(target))}
            shutil.copytree(target, Path(tmp) / "resumed")
            run(Path(tmp) / "resumed", name, 3, "data/corpus")
            row = [r for r in metrics.read_rows(str(Path(tmp) / "resumed")) if r.get("step") == 3][0]
            expected |= {"resumed/loss": np.float64(row["loss"]), "resumed/grad_norm": np.float64(row["grad_norm"])}
        np.savez_compressed(HERE / name / "expected.npz", **expected)
        print(f"wrote {name}: {len(expected)} arrays")


if __name__ == "__main__":
    main()
