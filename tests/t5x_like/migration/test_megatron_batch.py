"""A Megatron batch keeps Megatron's meaning (issue 52, item 10): `--micro-batch-size 2 --global-batch-size 16`
from a one-GPU script migrates to MICRO_BATCH_SIZE, and the run derives its accumulation from the devices it has,
so 1, 2 or 8 devices train the same 16 rows a step; `--print_config` of the migrated file needs no data. Run in
this process as a user runs the commands (migrate's and print_config's mains, from a folder of their own)."""
import gin
import jax
import numpy as np
import pytest

from partitioning import Partitioner, make_mesh
from t5x_like import experiment, migrate
from t5x_like.config import describe, frontend
from t5x_like.errors import UserError
from t5x_like.experiment import build_experiment
from t5x_like.features import DECODER_INPUT_TOKENS, DECODER_LOSS_WEIGHTS, DECODER_TARGET_TOKENS

SEQ = 16
FLAGS = (f"--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length {SEQ} --max-position-embeddings "
         f"{SEQ} --vocab-size 256 --hidden-dropout 0 --attention-dropout 0 --micro-batch-size 2 --global-batch-size 16 "
         "--lr 1e-3 --train-iters 10 --save runs/megatron\n")


@pytest.fixture
def migrated(tmp_path, monkeypatch):
    """The flags migrated and parsed as `train --print_config` parses them (no --data-path: DATA_PATH unset)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "one_gpu.txt").write_text(FLAGS)
    migrate.main(["one_gpu.txt", "--output=run.gin"])
    gin.clear_config()
    yield frontend.parse_gin(["run.gin"], [], [], printing=True)
    gin.clear_config()


def batch(rows: int) -> dict[str, np.ndarray]:
    tokens = np.random.default_rng(0).integers(0, 256, (rows, SEQ + 1), dtype=np.int32)
    return {DECODER_INPUT_TOKENS: tokens[:, :-1], DECODER_TARGET_TOKENS: tokens[:, 1:],
            DECODER_LOSS_WEIGHTS: np.ones((rows, SEQ), np.float32)}


def built(settings, mesh) -> experiment.Experiment:
    """The migrated run assembled on `mesh`."""
    return build_experiment(settings.experiment, train_steps=settings.loop.train_steps, mesh=mesh)


def first_loss(exp: experiment.Experiment) -> float:
    with exp.partitioner.activate():
        _, metrics = exp.train_step(exp.init_state(), exp.global_batch(batch(exp.batch_size)))
    return float(jax.device_get(metrics["loss"]))


def test_the_accumulation_follows_from_the_devices_and_the_losses_stay(migrated, tmp_path):
    text = (tmp_path / "run.gin").read_text()
    assert "MICRO_BATCH_SIZE = 2  # --micro-batch-size 2 (one_gpu.txt:1)" in text and "GRAD_ACCUM_STEPS" not in text
    runs = {n: built(migrated, make_mesh(data=n, devices=jax.devices()[:n])) for n in (1, 2, 8)}
    assert {n: exp.step_config.grad_accum_steps for n, exp in runs.items()} == {1: 8, 2: 4, 8: 1}
    assert {exp.batch_size for exp in runs.values()} == {16}
    np.testing.assert_allclose(first_loss(runs[8]), first_loss(runs[1]), rtol=1e-5)


def test_print_config_of_the_migrated_file_needs_no_data(migrated):
    text = describe.describe_run(migrated)
    assert "DATA_PATH = None" in text
    assert "#   DATA_PATH unset: training needs it (--gin.DATA_PATH=\"'data/NAME_text_document'\")" in text
    assert "#   batch 16 rows a step: 1 accumulated microbatch of 16 rows over 8 data-parallel shards" in text


def test_fewer_rows_than_the_micro_batch_on_a_shard_train_as_one_microbatch(migrated):
    """More devices than upstream had: BATCH_SIZE 16 over 8 shards is 2 rows each, below MICRO_BATCH_SIZE 4."""
    gin.clear_config()
    settings = frontend.parse_gin(["run.gin"], ["MICRO_BATCH_SIZE=4"], [], printing=True)
    assert "1 accumulated microbatch of 16 rows" in describe.describe_run(settings)
    exp = built(settings, make_mesh(data=1, devices=jax.devices()[:1]))
    assert exp.step_config.grad_accum_steps == 4


@pytest.mark.parametrize("bindings, message", [
    (["MICRO_BATCH_SIZE=2", "GRAD_ACCUM_STEPS=2"], r"MICRO_BATCH_SIZE=2 derives GRAD_ACCUM_STEPS .* leave them at 1, "
                                                   r"or set MICRO_BATCH_SIZE=None"),
    (["MICRO_BATCH_SIZE=0"], r"MICRO_BATCH_SIZE=0"),
    (["BATCH_SIZE=12"], r"BATCH_SIZE=12 does not divide over the 8 data-parallel shards \(DATA_PARALLEL\)"),
])
def test_impossible_batches_are_one_line(migrated, bindings, message):
    gin.clear_config()
    settings = frontend.parse_gin(["run.gin"], bindings, [], printing=True)
    with pytest.raises(UserError, match=message):
        built(settings, make_mesh(data=8))


def test_the_batch_error_names_the_axes_that_split_it():
    """Under expert parallelism the batch splits over data x expert outside the experts (issue 52, item 15)."""
    partitioner = Partitioner(make_mesh(data=2, expert=4), "fsdp_tensor")
    with pytest.raises(UserError, match=r"does not divide over the 8 data-parallel shards \(DATA_PARALLEL x "
                                        r"EXPERT_PARALLEL\)"):
        experiment.check_batch(12, 1, partitioner)
