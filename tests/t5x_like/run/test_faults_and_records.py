"""The run loop's faults and records, and what the trainer says: damaged checkpoints, NaN
steps, SIGKILL, the MODEL_DIR lock, config.gin, metrics rows, retention, misleading errors."""
import functools
import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys

import jax
import numpy as np
import pytest

from models.gpt2 import GPT2Config
from partitioning import make_mesh
from t5x_like import metrics, optim
from t5x_like.checkpoint import integrity, store
from t5x_like.convert import hf
from t5x_like.data import SourceSettings, make_source
from t5x_like.data.loader import DataChangedError
from t5x_like.data.token_file import TokenFileError, TokenFileWriter, open_token_file
from t5x_like.errors import UserError
from t5x_like.experiment import ExperimentSettings, build_experiment
from t5x_like.features import DECODER_LOSS_WEIGHTS
from t5x_like.run import lock, loop, nonfinite
from t5x_like.run.settings import LoopSettings, RunSettings
from tests.support.cli import REPO
from tests.support.environment import cpu_env

CONFIG = GPT2Config(vocab_size=256, max_len=16, num_layers=1, num_heads=2, embed_dim=32, mlp_dim=64,
                    dropout_rate=0.1, attention_dropout_rate=0.1, dtype="float32")


def experiment(total_steps=8, **settings) -> ExperimentSettings:
    """The run's assembly: one device, 4 rows of 16 tokens, a schedule `total_steps` long."""
    return ExperimentSettings(**{
        "model": CONFIG, "mesh": make_mesh(data=1, devices=jax.devices()[:1]), "batch_size": 4,
        "optimizer": optim.OptimizerSettings(learning_rate=3e-3, warmup_steps=2, decay_steps=total_steps),
        "feature_lengths": {"targets": 16}, **settings})


def run(model_dir, source, *, steps, total_steps=8, settings=None, **kwargs):
    kwargs = dict(dict(checkpoint_every=2, keep_checkpoints=5, eval_every=0, log_every=1), **kwargs)
    return loop.train(RunSettings(loop=LoopSettings(model_dir=str(model_dir), train_steps=steps, **kwargs),
                                  experiment=experiment(total_steps, **(settings or {}))), data_source=source)


def loss_rows(model_dir):
    return [(r["step"], r["loss"]) for r in metrics.read_rows(str(model_dir)) if "loss" in r]


def final_params(model_dir):
    return jax.device_get(store.restore_params(str(model_dir), None))


def saved_steps(model_dir):
    return sorted(int(s) for s in os.listdir(os.path.join(model_dir, "checkpoints")) if s.isdigit())


@pytest.fixture(scope="module")
def reference(tmp_path_factory, synthetic_source):
    """An 8-step run with checkpoints at 2, 4, 6, 8 and validation at 4 and 8, and its log."""
    model_dir = tmp_path_factory.mktemp("reference")
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        run(model_dir, synthetic_source, steps=8, eval_every=4, eval_steps=1)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
    return model_dir, "\n".join(r.getMessage() for r in records)


# --- what the trainer says -------------------------------------------------------------------------

def test_trainer_says_compiling_saving_and_sums_up(reference):
    model_dir, log = reference
    assert "compiling the train step ..." in log
    compile_s = float(log.split("compiled the train step in ")[1].split("s")[0])
    first = next(r for r in metrics.read_rows(str(model_dir)) if r["step"] == 1)
    assert first["step_time"] < compile_s / 2  # the first step's ms/step (and ETA) exclude compilation
    assert "step 2: saving a checkpoint to" in log and "checkpoint 8 written (" in log
    assert "done: step 8/8; this run trained 8 steps, 512 tokens" in log
    evals = {r["step"]: r["eval_loss"] for r in metrics.read_rows(str(model_dir)) if "eval_loss" in r}
    assert f"validation loss: final {evals[8]:.4f} (step 8), best {min(evals.values()):.4f}" in log
    assert f"outputs in {model_dir}: checkpoints/" in log


def test_a_finished_run_says_so_and_applies_retention(reference, synthetic_source, tmp_path, caplog):
    model_dir = tmp_path / "done"
    shutil.copytree(reference[0], model_dir)
    with caplog.at_level(logging.INFO):
        assert run(model_dir, synthetic_source, steps=8, keep_checkpoints=2).step == 8
    assert "is complete: its latest checkpoint is step 8 and TRAIN_STEPS=8" in caplog.text
    assert saved_steps(model_dir) == [6, 8]


def test_raising_train_steps_on_resume_warns_with_the_learning_rate_jump(reference, synthetic_source, tmp_path,
                                                                        caplog):
    class Interrupted(Exception):
        pass

    class NoBatches(synthetic_source):
        def __next__(self):
            raise Interrupted

    model_dir = tmp_path / "longer"
    shutil.copytree(reference[0], model_dir)
    schedule = optim.OptimizerSettings(learning_rate=3e-3, warmup_steps=2)
    old, new = (float(optim.make_optimizer(schedule, steps).schedule(8)) for steps in (8, 16))
    with caplog.at_level(logging.INFO), pytest.raises(Interrupted):
        run(model_dir, NoBatches, steps=16, total_steps=16)
    assert (f"TRAIN_STEPS=16 but the checkpoint's run had TRAIN_STEPS=8: the learning-rate schedule changes; "
            f"at step 8 the learning rate jumps from {old:.3e} to {new:.3e}") in caplog.text


def test_blends_log_documents_tokens_and_rows_per_split_and_source(tmp_path, caplog):
    prefixes = [write_tokens(tmp_path / name, [[1] * 40] * 20, vocab_size=256) for name in ("a", "b")]
    with caplog.at_level(logging.INFO):
        make_source("train", SourceSettings(data_path=prefixes, blend_weights=[3.0, 1.0], data_split="90,10,0"),
                    batch_size=2, feature_lengths={"targets": 8}, seed=0, shard_index=0, shard_count=1)
    table = caplog.text.split("data: train split (DATA_SPLIT=90,10,0, SEQ_LEN=8)")[1]
    assert "documents" in table and "tokens" in table and "rows" in table
    for prefix, weight in zip(prefixes, ("0.750", "0.250")):  # 18 documents of 40 tokens: (720 - 1) // 8 rows
        assert f"{prefix[-40:]:<40} {weight:>7} {18:>12,} {720:>15,} {89:>12,}" in table


# --- damaged checkpoints ------------------------------------------------------------------------------

def largest_params_file(step_dir):
    files = [os.path.join(r, f) for r, _, fs in os.walk(os.path.join(step_dir, "params")) for f in fs]
    return max(files, key=os.path.getsize)


def flip_a_bit(path):
    with open(path, "r+b") as f:
        f.seek(os.path.getsize(path) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0x10]))


def truncate(path):
    os.truncate(path, os.path.getsize(path) // 2)


def damaged_copy(reference, tmp_path, damage):
    """A copy of the reference run with `damage` done to step 8's largest params file: (dir, step dir, file)."""
    model_dir = tmp_path / "damaged"
    shutil.copytree(reference[0], model_dir)
    step_dir = os.path.join(model_dir, "checkpoints", "8")
    target = largest_params_file(step_dir)
    damage(target)
    return model_dir, step_dir, os.path.relpath(target, step_dir)


@pytest.mark.parametrize("damage, reason", [(flip_a_bit, "checksum mismatch"), (truncate, r"\d+ bytes, \d+ when "
                                            "written"), (os.remove, r"missing \(deleted\?\)")])
def test_a_damaged_latest_checkpoint_is_detected_and_named(reference, tmp_path, caplog, damage, reason):
    model_dir, step_dir, name = damaged_copy(reference, tmp_path, damage)
    ckpt = store.Checkpointer(str(model_dir))
    try:
        with caplog.at_level(logging.INFO):
            assert ckpt.restore_newest(params=None, train_state=None, on_corrupt="fallback")[0] == 6
    finally:
        ckpt.close()
    assert re.search(f"checkpoint {re.escape(step_dir)} is damaged: {re.escape(name)}: {reason}", caplog.text)
    assert "FALLING BACK to the previous checkpoint, step 6" in caplog.text
    assert os.path.isdir(step_dir + ".corrupt")


def test_training_resumes_from_the_previous_checkpoint_exactly(reference, synthetic_source, tmp_path):
    model_dir, _, _ = damaged_copy(reference, tmp_path, flip_a_bit)
    assert run(model_dir, synthetic_source, steps=8).step == 8
    assert loss_rows(model_dir) == loss_rows(reference[0])  # a clean continuation from step 6, rows once each
    jax.tree.map(np.testing.assert_array_equal, final_params(model_dir), final_params(reference[0]))


def test_on_corrupt_checkpoint_stop_names_the_step_file_and_the_older_checkpoint(reference, synthetic_source,
                                                                                 tmp_path):
    model_dir = tmp_path / "stop"
    shutil.copytree(reference[0], model_dir)
    data_file = os.path.join(model_dir, "checkpoints", "8", "data", "metadata")
    with open(data_file, "w") as f:
        f.write('{"step": 8, "position": {"index": 1')
    with pytest.raises(store.CorruptCheckpointError,
                       match=r"checkpoints/8 is damaged: data/metadata: \d+ bytes.*previous checkpoint is step 6: "
                             r"set train.on_corrupt_checkpoint='fallback'"):
        run(model_dir, synthetic_source, steps=8, on_corrupt_checkpoint="stop")
    assert saved_steps(model_dir) == [2, 4, 6, 8]  # nothing moved or deleted


def test_a_data_position_from_another_step_is_detected(reference, tmp_path):
    model_dir = tmp_path / "position"
    shutil.copytree(reference[0], model_dir)
    step_dir = os.path.join(model_dir, "checkpoints", "8")
    with open(os.path.join(step_dir, "data", "metadata"), "w") as f:
        json.dump({"step": 6, "position": {"index": 6}}, f)
    integrity.write_manifest(step_dir)  # consistent checksums: only the step check can tell
    ckpt = store.Checkpointer(str(model_dir))
    try:
        with pytest.raises(store.CorruptCheckpointError, match=r"saved at steps \(6, 8\)"):
            ckpt.restore(8, params=None, train_state=None)
    finally:
        ckpt.close()


# --- non-finite steps --------------------------------------------------------------------------------

def test_a_nonfinite_step_is_never_applied_or_saved_and_is_explained(synthetic_source, tmp_path):
    class PoisonedThirdBatch(synthetic_source):
        def __next__(self):
            batch = super().__next__()
            if self.index == 3:
                batch[DECODER_LOSS_WEIGHTS] = batch[DECODER_LOSS_WEIGHTS] * np.float32(np.nan)
            return batch

    with pytest.raises(FloatingPointError, match=r"step 3: loss is nan; non-finite gradients in \d+ of \d+ "
                                                 r"parameters: \S+/\S+, .*The update was not applied.*LEARNING_RATE.*"
                                                 r"checkpoint step\(s\) 2 held that state and were set aside .* as "
                                                 r"2\.nonfinite; a restart resumes from step 1\."):
        run(tmp_path, PoisonedThirdBatch, steps=6, checkpoint_every=1)
    assert saved_steps(tmp_path) == [1] and (tmp_path / "checkpoints" / "2.nonfinite").is_dir()
    params = final_params(tmp_path)
    assert all(np.isfinite(x).all() for x in jax.tree.leaves(params))


def test_skipping_stops_when_the_state_itself_gives_nonfinite_losses(synthetic_source, tmp_path, caplog):
    """'skip' gets past a bad batch, not a bad state: 3 non-finite losses in a row (train.nonfinite_in_a_row)
    stop the run, and the checkpoints holding the state they came from (steps 2, 3, 4: skipped steps keep it)
    are set aside."""
    class PoisonedFromTheThird(synthetic_source):
        def __next__(self):
            batch = super().__next__()
            if self.index >= 3:
                batch[DECODER_LOSS_WEIGHTS] = batch[DECODER_LOSS_WEIGHTS] * np.float32(np.nan)
            return batch

    with caplog.at_level(logging.WARNING), pytest.raises(
            nonfinite.NonfiniteLossError, match=r"step 5: 3 steps in a row \(train.nonfinite_in_a_row\) had a non-finite "
                                            r"loss or gradients, from step 3: the model's state itself is bad.* "
                                            r"checkpoint step\(s\) 2, 3, 4 held that state.*resumes from step 1\."):
        run(tmp_path, PoisonedFromTheThird, steps=10, checkpoint_every=1, nonfinite_in_a_row=3,
            settings={"on_nonfinite": "skip"})
    assert caplog.text.count("update skipped") == 2 and saved_steps(tmp_path) == [1]


def all_checkpoints_finite(model_dir) -> None:
    ckpt = store.Checkpointer(str(model_dir))
    try:
        for step in saved_steps(model_dir):
            params, state, _ = ckpt.restore(step, params=None, train_state=None)  # raises on non-finite values
            assert not store.nonfinite_paths({"params": params, "opt_state": state["opt_state"]}), step
    finally:
        ckpt.close()


def huge_learning_rate():
    """An AdamW step of about lr * (1 + weight_decay * |p|) per element: past float32's 3.4e38."""
    return {"optimizer": optim.OptimizerSettings(learning_rate=3e38, warmup_steps=0, weight_decay=10.0,
                                                 decay="constant")}


def test_an_overflowing_learning_rate_stops_before_any_nonfinite_state_is_saved(synthetic_source, tmp_path):
    with pytest.raises(FloatingPointError, match=r"step 1: .*The update was not applied"):
        run(tmp_path, synthetic_source, steps=6, checkpoint_every=1, settings=huge_learning_rate())
    assert not (tmp_path / "checkpoints").exists()  # nothing saved (the empty folder is removed on failure)


def test_skipping_overflowing_updates_saves_only_finite_states(synthetic_source, tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        result = run(tmp_path, synthetic_source, steps=6, checkpoint_every=2,
                     settings=dict(huge_learning_rate(), on_nonfinite="skip"))
    assert result.step == 6 and saved_steps(tmp_path) == [2, 4, 6]
    assert "the update overflowed" in caplog.text and "update skipped" in caplog.text
    all_checkpoints_finite(tmp_path)


def test_resuming_a_good_run_with_an_overflowing_rate_keeps_its_history_finite(reference, synthetic_source,
                                                                              tmp_path):
    """keep_checkpoints=2 deletes the good run's older steps, but what it keeps is finite: every later
    checkpoint holds the last good state, so the restart still has a good checkpoint."""
    model_dir = tmp_path / "resumed"
    shutil.copytree(reference[0], model_dir)
    run(model_dir, synthetic_source, steps=12, total_steps=12, keep_checkpoints=2,
        settings=dict(huge_learning_rate(), on_nonfinite="skip"))
    assert saved_steps(model_dir) == [10, 12]
    all_checkpoints_finite(model_dir)
    np.testing.assert_equal(final_params(model_dir), final_params(reference[0]))  # nothing was applied


def test_a_checkpoint_holding_nan_is_never_trained_from(reference, tmp_path, caplog):
    """As an older version could write: a NaN state, checksummed and consistent, is still refused."""
    model_dir = tmp_path / "poisoned"
    shutil.copytree(reference[0], model_dir)
    ckpt = store.Checkpointer(str(model_dir), keep=10)
    try:
        params, state, position = ckpt.restore(8, params=None, train_state=None)
        poisoned = jax.tree.map(lambda x: x * np.float32(np.nan), params)
        ckpt.save(10, params=poisoned, train_state=dict(state, step=np.int32(10)), data_state=position, model={})
        ckpt.wait()
        with caplog.at_level(logging.INFO):
            assert ckpt.restore_newest(params=None, train_state=None, on_corrupt="fallback")[0] == 8
    finally:
        ckpt.close()
    assert re.search(r"checkpoints/10 is damaged: params / train_state: non-finite values in params/", caplog.text)


# --- one trainer per MODEL_DIR --------------------------------------------------------------------------

def test_a_second_trainer_on_a_locked_model_dir_is_refused(synthetic_source, tmp_path):
    with lock.RunLock(str(tmp_path)):
        with pytest.raises(lock.RunLockedError, match=rf"is in use by another trainer: .*'pid': {os.getpid()}"
                                                          r".*delete .*run.lock"):
            run(tmp_path, synthetic_source, steps=2)
    assert not os.path.exists(tmp_path / "run.lock")  # released
    assert not os.path.exists(tmp_path / "checkpoints")


def write_lock(model_dir, host, pid, age_s=0.0):
    path = os.path.join(model_dir, lock.LOCK_FILE)
    with open(path, "w") as f:
        json.dump({"host": host, "pid": pid, "started": "2026-01-01T00:00:00+00:00"}, f)
    os.utime(path, (os.path.getmtime(path) - age_s,) * 2)


@pytest.mark.system
def test_stale_locks_are_replaced_and_live_ones_kept(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    write_lock(tmp_path, lock.socket.gethostname(), dead.pid)  # this host, pid gone
    with lock.RunLock(str(tmp_path)):
        pass
    write_lock(tmp_path, "another-host", 1, age_s=3600)  # no heartbeat for an hour
    with lock.RunLock(str(tmp_path)):
        pass
    write_lock(tmp_path, "another-host", 1, age_s=5)  # alive elsewhere
    with pytest.raises(lock.RunLockedError, match="another-host"):
        lock.RunLock(str(tmp_path)).acquire()


def test_the_lock_heartbeat_refreshes_the_file(tmp_path):
    held = lock.RunLock(str(tmp_path), heartbeat_s=0.05)
    with held:
        os.utime(held.path, (1.0, 1.0))
        deadline = __import__("time").time() + 5
        while os.path.getmtime(held.path) < 2.0 and __import__("time").time() < deadline:
            __import__("time").sleep(0.05)
        assert os.path.getmtime(held.path) > 2.0


# --- run records --------------------------------------------------------------------------------------

def test_config_gin_survives_a_failed_start(synthetic_source, tmp_path):
    def typo_in_data_path(*args, **kwargs):
        raise TokenFileError("/data/pilee.bin: missing")

    (tmp_path / "config.gin").write_text("DATA_PATH = '/data/pile'\n")
    with pytest.raises(TokenFileError):
        run(tmp_path, typo_in_data_path, steps=2)
    assert (tmp_path / "config.gin").read_text() == "DATA_PATH = '/data/pile'\n"


def test_each_start_keeps_its_config(reference):
    assert os.path.exists(reference[0] / "config.gin") and os.path.exists(reference[0] / "config.0.gin")


def test_resume_drops_metrics_rows_past_the_resumed_step(tmp_path):
    with open(tmp_path / "metrics.jsonl", "w") as f:
        for step in range(1, 9):
            f.write(json.dumps({"step": step, "loss": 1.0}) + "\n")
        f.write('{"step": 9, "lo')  # torn by a kill
    metrics.MetricsWriter(str(tmp_path), start_step=6).close()
    assert [r["step"] for r in metrics.read_rows(str(tmp_path))] == [1, 2, 3, 4, 5, 6]


@pytest.mark.system
def test_preprocess_removes_temporaries_of_dead_writers(tmp_path):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    prefix = str(tmp_path / "corpus")
    stale, live = f"{prefix}.bin.tmp{dead.pid}", f"{prefix}.bin.tmp{os.getppid()}"
    for path in (stale, live):
        open(path, "w").close()
    write_tokens(prefix, [[1, 2, 3]], vocab_size=256)
    assert not os.path.exists(stale) and os.path.exists(live)


# --- misleading errors --------------------------------------------------------------------------------

def write_tokens(prefix, documents, vocab_size):
    made_with = {"path": "fake", "sha256": "0" * 64, "vocab_size": vocab_size, "eod_id": 0}
    with TokenFileWriter(prefix, np.uint16, {"tokenizer": made_with}) as writer:
        writer.write(np.concatenate([np.asarray(d) for d in documents]), np.array([len(d) for d in documents]))
    return str(prefix)


def test_a_resume_on_a_changed_corpus_is_refused_unless_the_data_starts_over(tmp_path, caplog):
    """The corpus preprocessed again under the prefix the run trains on: the resume is refused in one line
    naming the file; train.restart_data=True resumes the model and starts the data over, saying so."""
    documents = [[(7 * d + t) % 250 + 1 for t in range(30)] for d in range(80)]
    prefix = write_tokens(tmp_path / "corpus", documents, vocab_size=256)
    source = functools.partial(make_source, settings=SourceSettings(data_path=prefix))
    run(tmp_path / "run", source, steps=2)
    write_tokens(tmp_path / "corpus", documents[:70], vocab_size=256)
    with pytest.raises(DataChangedError, match=r"data file 1 \(.*corpus\): [\d,]+, [\d,]+ bytes then, .* now\. "
                                               r"Resuming would continue at row 8 of other data"):
        run(tmp_path / "run", source, steps=4)
    with caplog.at_level(logging.WARNING):
        assert run(tmp_path / "run", source, steps=4, restart_data=True).step == 4
    assert "train.restart_data=True: the data starts over" in caplog.text


def test_token_ids_outside_the_vocabulary_are_named(tmp_path):
    prefix = write_tokens(tmp_path / "big", [[1, 2, 3] * 10, [5, 300, 7] * 10], vocab_size=256)
    with pytest.raises(TokenFileError, match=r"big.bin: token id 300 at position 31 is outside the vocabulary "
                                             r"of fake \(256 ids\)"):
        make_source("train", SourceSettings(data_path=prefix, data_split="1,1,0"), batch_size=1,
                    feature_lengths={"targets": 4}, seed=0, shard_index=0, shard_count=1)


def test_misleading_inputs_get_messages_that_name_the_fix(synthetic_source, tmp_path):
    with pytest.raises(UserError, match="BATCH_SIZE='eight': expected an integer"):
        build_experiment(experiment(batch_size="eight"), train_steps=8)
    prefix = write_tokens(tmp_path / "corpus", [[1, 2, 3]], vocab_size=256)
    with pytest.raises(TokenFileError, match=rf"DATA_PATH='{prefix}'"):
        open_token_file(prefix + ".bin")
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text('{"model_type": "gpt2",')
    with pytest.raises(UserError, match=r"hf/config.json: not valid JSON"):
        hf.from_hf(str(tmp_path / "hf"), str(tmp_path / "out"))


@pytest.mark.system
def test_cli_user_errors_are_one_line_without_a_traceback(tmp_path):
    cmd = [sys.executable, "-m", "t5x_like.train", "--gin_file=quickstart.gin", f"--gin.MODEL_DIR='{tmp_path}'",
           "--gin.BATCH_SIZE='eight'"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300,
                          env=cpu_env(1))
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    assert "error: BATCH_SIZE='eight': expected an integer" in done.stderr


# --- SIGKILL ------------------------------------------------------------------------------------------

@pytest.mark.system
def test_sigkill_during_a_checkpoint_write_resumes_bitwise(tmp_path):
    """One trial of scripts/fault_injection.py (run it with --trials=N for many)."""
    spec = importlib.util.spec_from_file_location("fault_injection", os.path.join(REPO, "scripts",
                                                                                  "fault_injection.py"))
    fault_injection = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(fault_injection)
    summary = fault_injection.run_trials(1, steps=4, workdir=str(tmp_path))
    assert summary["results"][0]["event"].endswith("during a checkpoint write")
    assert summary["exact"] == 1
