"""CPM-2 seq2seq fine-tuning on CPM-2-Finetune's task layout (LCSTS: DATA_PATH/{train,dev}.jsonl of
{"text", "summary"}): the rows a tiny CPM-2 trains on, and the rows eval scores, are CPM2Datasets.py's id for id
(tests/support/cpm2.py transcribes it); generation stops at <s_1> as CPM-2-Finetune's evaluate_gen does."""
import functools
import json
import runpy
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models.cpm2 import CPM2Config
from partitioning import make_mesh
from t5x_like import optim
from t5x_like.data import SourceSettings, make_source
from t5x_like.eval.scoring import INPUTS, TARGETS, WEIGHTS
from t5x_like.eval.seq2seq import seq2seq_rows
from t5x_like.experiment import ExperimentSettings
from t5x_like.inference import decoding
from t5x_like.lm import make_lm
from t5x_like.run import loop
from t5x_like.run.settings import LoopSettings, RunSettings
from tests.docs.doc_commands import File, read_page
from tests.support.cpm2 import (LCQMC_RECORDS, LCSTS_PAIRS, ModelCenterCPM2Tokenizer, cpm2_datasets_rows,
                                lcqmc_dataset_ids, write_lcqmc, write_lcsts)
from tests.support.environment import cpu_env
from tests.support.shared_data import needs_shared, shared_file

pytestmark = needs_shared("cpm2", "vocab.txt")

CONFIG = CPM2Config(num_layers=1, num_decoder_layers=1, num_heads=2, embed_dim=32, d_kv=16, mlp_dim=48,
                    dtype="float32")
S0, S1, EOD = 26050, 26051, 7


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    """(the LCSTS folder, CPM2Datasets' rows of its train.jsonl, FEATURE_LENGTHS of their widths)."""
    folder = write_lcsts(tmp_path_factory.mktemp("lcsts"))
    reference = cpm2_datasets_rows(ModelCenterCPM2Tokenizer(shared_file("cpm2", "vocab.txt")), folder / "train.jsonl")
    lengths = {"inputs": reference["enc_input_ids"].shape[1], "targets": reference["labels"].shape[1]}
    return folder, reference, lengths


def source(folder, split="train", **kwargs):
    return functools.partial(make_source, settings=SourceSettings(
        objective="seq2seq", tokenizer=str(shared_file("cpm2", "vocab.txt")),
        data_path={"train": str(folder / "train.jsonl"), "validation": str(folder / "dev.jsonl")},
        fields=("text", "summary"), **kwargs))


def assert_rows_are_cpm2_datasets(batch, reference):
    """Every row of `batch` is a row of CPM2Datasets' (matched by encoder ids), id for id where either counts."""
    wanted = {tuple(row[mask > 0]): k for k, (row, mask) in enumerate(zip(reference["enc_input_ids"],
                                                                          reference["enc_mask"]))}
    for row in range(batch["encoder_input_tokens"].shape[0]):
        mask = batch["encoder_segment_ids"][row] > 0
        k = wanted[tuple(batch["encoder_input_tokens"][row][mask])]
        np.testing.assert_array_equal(mask, reference["enc_mask"][k] > 0)
        np.testing.assert_array_equal(batch["decoder_loss_weights"][row], reference["loss_mask"][k])
        counted = reference["loss_mask"][k] > 0
        np.testing.assert_array_equal(batch["decoder_input_tokens"][row][counted], reference["dec_input_ids"][k][counted])
        np.testing.assert_array_equal(batch["decoder_target_tokens"][row][counted], reference["labels"][k][counted])
        assert list(batch["decoder_input_tokens"][row][:2]) == [1, S0]
        assert batch["decoder_target_tokens"][row][counted][-1] == S1


def test_the_rows_are_cpm2_datasets_and_t5_keeps_seqios(task):
    folder, reference, lengths = task
    n = reference["enc_input_ids"].shape[0]
    args = dict(batch_size=n, feature_lengths=lengths, seed=0, shard_index=0, shard_count=1)
    batch = next(source(folder)("train", pair_ends=make_lm(CONFIG).pair_ends, **args))
    assert_rows_are_cpm2_datasets(batch, reference)
    assert batch["encoder_segment_ids"].sum() == reference["enc_mask"].sum()  # no EOS after the inputs
    t5 = next(source(folder)("train", **args | {"feature_lengths": {k: v + 1 for k, v in lengths.items()}}))
    ends = np.array([row[w > 0][-1] for row, w in zip(t5["decoder_target_tokens"], t5["decoder_loss_weights"])])
    assert (ends == EOD).all() and (t5["decoder_input_tokens"][:, 0] == 0).all()


def test_lcqmc_pairs_written_as_cpm_md_says_are_lcqmc_datasets_rows(tmp_path, monkeypatch):
    """docs/cpm.md's lcqmc_pairs.py, run on LCQMC's records: the rows are CPM2Datasets.py's LCQMCDataset's (the
    encoder's ids end with <s_0>, 26050, written in the text), but for the <s_1> that ends every target here."""
    script = next(item for item in read_page("docs/cpm.md") if isinstance(item, File) and item.name == "lcqmc_pairs.py")
    (tmp_path / "lcqmc_pairs.py").write_text(script.text, encoding="utf-8")
    write_lcqmc(tmp_path / "lcqmc")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["lcqmc_pairs.py", "lcqmc", "pairs"])
    runpy.run_path("lcqmc_pairs.py", run_name="__main__")
    want = {tuple(d["enc_input_ids"]): d for d in
            lcqmc_dataset_ids(ModelCenterCPM2Tokenizer(shared_file("cpm2", "vocab.txt")), LCQMC_RECORDS)}
    settings = SourceSettings(objective="seq2seq", data_path=str(tmp_path / "pairs" / "train.jsonl"),
                              data_split="1,0,0", tokenizer=str(shared_file("cpm2", "vocab.txt")))
    batch = next(make_source("train", settings, batch_size=len(want), feature_lengths={"inputs": 64, "targets": 8},
                             seed=0, shard_index=0, shard_count=1, pair_ends=make_lm(CONFIG).pair_ends))
    seen = set()
    for row in range(len(want)):
        encoder = batch["encoder_input_tokens"][row][batch["encoder_segment_ids"][row] > 0]
        reference = want[tuple(encoder)]
        assert encoder[-1] == S0
        counted = batch["decoder_loss_weights"][row] > 0
        assert list(batch["decoder_input_tokens"][row][counted]) == reference["dec_input_ids"] + \
            [reference["label_ids"][-1]]
        assert list(batch["decoder_target_tokens"][row][counted]) == reference["label_ids"] + [S1]
        seen.add(tuple(encoder))
    assert seen == set(want)


class Recorded:
    """A BatchSource that keeps the batches it hands out."""

    def __init__(self, inner, seen):
        self._inner, self.seen = inner, seen

    def __getattr__(self, name):
        return getattr(self._inner, name)

    def __iter__(self):
        return self

    def __next__(self):
        batch = next(self._inner)
        self.seen.append(jax.device_get(batch))
        return batch


def test_a_tiny_cpm2_fine_tunes_on_cpm2_datasets_rows(task, tmp_path):
    folder, reference, lengths = task
    seen = []
    experiment = ExperimentSettings(model=CONFIG, mesh=make_mesh(data=-1), batch_size=8, feature_lengths=lengths,
                                    optimizer=optim.OptimizerSettings(learning_rate=1e-2, warmup_steps=0))
    data_source = lambda split, **kw: Recorded(source(folder)(split, **kw), seen)  # noqa: E731
    loop.train(RunSettings(loop=LoopSettings(model_dir=str(tmp_path / "run"), train_steps=6, checkpoint_every=6,
                                             eval_every=0, log_every=1), experiment=experiment),
               data_source=data_source)
    assert len(seen) == 6
    for batch in seen:
        assert_rows_are_cpm2_datasets(batch, reference)
    with open(tmp_path / "run" / "metrics.jsonl") as f:
        losses = [row["loss"] for row in map(json.loads, f) if "loss" in row]
    assert losses[-1] < losses[0]


def test_eval_scores_cpm2_datasets_rows(task):
    """eval --task=seq2seq's teacher-forced rows, built from the LanguageModel's conventions."""
    folder, reference, lengths = task
    lm = make_lm(CONFIG)
    tokenizer = ModelCenterCPM2Tokenizer(shared_file("cpm2", "vocab.txt"))
    examples = [(lm.prompt_ids(tokenizer.encode(t), EOD), lm.target_ids(tokenizer.encode(s), EOD))
                for t, s in LCSTS_PAIRS]
    rows = seq2seq_rows(examples, lengths["inputs"], lengths["targets"], lm.start_ids())
    batch = {"encoder_input_tokens": rows["encoder_input_tokens"], "encoder_segment_ids": rows["encoder_segment_ids"],
             "decoder_input_tokens": rows[INPUTS], "decoder_target_tokens": rows[TARGETS],
             "decoder_loss_weights": rows[WEIGHTS]}
    assert_rows_are_cpm2_datasets(batch, reference)


@pytest.mark.parametrize("config, stops", [(CONFIG, True), (None, False)])
def test_generation_stops_at_s1_for_cpm2_only(config, stops):
    """A sampler that emits token A, then <s_1> forever: CPM-2 stops at <s_1> (CPM-2-Finetune's evaluate_gen),
    T5 (whose targets end with EOS) runs on; generate's cut drops what follows the end."""
    from models.t5 import T5Config
    config = config or T5Config(**{k: getattr(CONFIG, k) for k in ("num_layers", "num_decoder_layers", "num_heads",
                                                                    "embed_dim", "d_kv", "mlp_dim", "dtype")},
                                vocab_size=CONFIG.vocab_size, feed_forward="gated-gelu")
    lm, token_a = make_lm(config), 100
    params = lm.init(jax.random.PRNGKey(0), {"inputs": 8, "targets": 8})

    def pick(logits, rng, seen):
        return jnp.where(seen[:, token_a], S1, token_a).astype(jnp.int32)

    shapes, one_device = lm.cache_layout(1, 5, 5)[0], jax.sharding.SingleDeviceSharding(jax.devices()[0])
    tokens, valid = jnp.array([[0, 0, 5503, 10, 261]]), jnp.array([[False, False, True, True, True]])
    out = lm.decode(params, tokens, valid, jax.random.PRNGKey(0), max_new_tokens=5, eod_id=EOD, sample=pick,
                    cache_layout=(shapes, jax.tree.map(lambda _: one_device, shapes)), track_seen=True)
    out = np.asarray(out[0])
    assert list(out) == ([token_a, S1, EOD, EOD, EOD] if stops else [token_a, S1, S1, S1, S1])
    assert decoding.cut_at(out, *lm.end_ids(EOD)) == ([token_a] if stops else [token_a, S1, S1, S1, S1])


@pytest.mark.system
def test_cli_quickstart_cpm2_learns_from_its_own_working_directory(tmp_path):
    """gin/quickstart_cpm2.gin as a user runs it (fewer steps): the CLI from another folder, a relative MODEL_DIR."""
    cmd = [sys.executable, "-m", "t5x_like.train", "--gin_file=quickstart_cpm2.gin",
           "--gin.MODEL_DIR='runs/quickstart_cpm2'", "--gin.TRAIN_STEPS=20", "--gin.EVAL_EVERY=20",
           "--gin.CHECKPOINT_EVERY=20", "--gin.train.log_every=5"]
    done = subprocess.run(cmd, cwd=tmp_path, env=cpu_env(2, optimized=True),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(tmp_path / "runs" / "quickstart_cpm2" / "metrics.jsonl") as f:
        rows = [json.loads(line) for line in f]
    loss = [r["loss"] for r in rows if "loss" in r]
    assert len(loss) == 4 and loss[-1] < loss[0] - 0.3, loss
    assert [r["step"] for r in rows if "eval_loss" in r] == [20]
    assert (tmp_path / "runs" / "quickstart_cpm2" / "checkpoints" / "20").is_dir()
