"""model_config.scan_layers is a run choice: checkpoints hold the layers stacked whatever setting wrote
them, restore into either setting exactly, and Adafactor's statistics are per layer, so a scanned and an
unrolled run of the same model train alike (fp32, 1e-5)."""
import dataclasses
import functools

import flax.linen as nn
import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest
from etils import epath

from models.gpt2 import GPT2Config
from partitioning import Partitioner, make_mesh
from t5x_like.checkpoint import store
from t5x_like.errors import UserError
from t5x_like.inference import loading
from t5x_like.lm import make_lm
from tests.support import training

pytestmark = pytest.mark.integration

GPT2 = GPT2Config(vocab_size=256, max_len=16, num_layers=3, num_heads=4, embed_dim=32, mlp_dim=64,
                  dropout_rate=0.0, attention_dropout_rate=0.0, dtype="float32")
# encoder and decoder of different depths: each stack converts on its own
T5 = dataclasses.replace(training.T5_MODEL, num_decoder_layers=3)
FAMILIES = {"gpt2": (GPT2, {"targets": 16}), "t5": (T5, training.T5_LENGTHS)}


def scan(config, scan_layers: bool):
    return dataclasses.replace(config, scan_layers=scan_layers)


def init_params(config, lengths):
    lm = make_lm(config)
    return jax.device_get(nn.meta.unbox(jax.jit(lambda: lm.init(jax.random.key(1), lengths))()))


def unroll(params):
    """What the scanned `params` are unrolled: each `blocks` leaf split into `block_<i>`."""
    if not isinstance(params, dict):
        return params
    out = {k: unroll(v) for k, v in params.items() if k != "blocks"}
    if "blocks" in params:
        count = jax.tree.leaves(params["blocks"])[0].shape[0]
        out.update({f"block_{i}": jax.tree.map(lambda x: x[i], params["blocks"]) for i in range(count)})
    return out


def saved_names(path) -> set[str]:
    directory, step = store.locate(str(path))
    metadata = ocp.StandardCheckpointHandler().metadata(epath.Path(directory) / str(step) / "params")
    return {getattr(key, "key", "") for keys, _ in jax.tree_util.tree_flatten_with_path(dict(metadata))[0]
            for key in keys}


def assert_same(got, want):
    assert jax.tree.structure(got) == jax.tree.structure(want)
    for (path, g), w in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w), err_msg=jax.tree_util.keystr(path))


@pytest.mark.parametrize("family", FAMILIES)
def test_parameters_restore_exactly_across_scan_layers(tmp_path, family):
    """Scanned -> unrolled and unrolled -> scanned, bit for bit, sharded on a data x fsdp x tensor mesh; the
    files hold the stacked layout either way and verify against their checksums."""
    config, lengths = FAMILIES[family]
    scanned = init_params(scan(config, True), lengths)
    partitioner = Partitioner(make_mesh(data=2, fsdp=2, tensor=2), "fsdp_tensor")
    store.save_params(str(tmp_path / "scanned"), 0, scanned, {"config": dataclasses.asdict(config)})

    unrolled = loading.restore_sharded(str(tmp_path / "scanned"), scan(config, False), partitioner)
    assert_same(unrolled, unroll(scanned))
    abstract, specs = loading.abstract_params(scan(config, False))
    for got, want in zip(jax.tree.leaves(unrolled), jax.tree.leaves(partitioner.shardings(specs))):
        assert got.sharding == want

    store.save_params(str(tmp_path / "unrolled"), 0, unrolled, {"config": dataclasses.asdict(config)})
    names = saved_names(tmp_path / "unrolled")
    assert "blocks" in names and not any(name.startswith("block_") for name in names)
    assert store.verify_manifest(str(tmp_path / "unrolled" / "checkpoints" / "0"))
    assert_same(loading.restore_sharded(str(tmp_path / "unrolled"), scan(config, True), partitioner), scanned)


def test_a_checkpoint_saved_unrolled_by_an_earlier_version_restores_either_way(tmp_path):
    scanned = init_params(scan(GPT2, True), {"targets": 16})
    manager = store._manager(str(tmp_path / "checkpoints"), async_save=False)
    manager.save(0, args=ocp.args.Composite(params=ocp.args.StandardSave(unroll(scanned)),
                                            model=ocp.args.JsonSave({"config": dataclasses.asdict(GPT2)})))
    manager.wait_until_finished()
    manager.close()
    partitioner = Partitioner(make_mesh(data=2, fsdp=2, tensor=2), "fsdp_tensor")
    assert_same(loading.restore_sharded(str(tmp_path), scan(GPT2, True), partitioner), scanned)
    assert_same(loading.restore_sharded(str(tmp_path), scan(GPT2, False), partitioner), unroll(scanned))


@pytest.mark.parametrize("scan_layers", [True, False])
def test_a_checkpoint_of_another_depth_is_refused_in_one_line(tmp_path, scan_layers):
    store.save_params(str(tmp_path), 0, init_params(GPT2, {"targets": 16}), {"config": {}})
    shallower = dataclasses.replace(GPT2, num_layers=2, scan_layers=scan_layers)
    with pytest.raises(UserError, match=r"holds another model .* parameter blocks/.* is \(3, .* here; restore it "
                                        r"with the model config it records") as raised:
        loading.restore_sharded(str(tmp_path), shallower, Partitioner(make_mesh(data=8), "fsdp_tensor"))
    assert "\n" not in str(raised.value)


def run(model_dir, source, config, optimizer: str, scan_layers: bool, **kwargs) -> None:
    """train() on a 2-device fsdp mesh (the layers' parameters and moments split: conversions keep
    the shardings), at a learning rate that moves the parameters."""
    mesh = make_mesh(data=1, fsdp=2, devices=jax.devices()[:2])
    training.run_train(model_dir, source, mesh=mesh, settings={
        "model": scan(config, scan_layers), "rules": "fsdp", "feature_lengths": FAMILIES[config.family][1],
        "optimizer": training.optimizer(learning_rate=1e-2, name=optimizer)},
        **kwargs)


@pytest.mark.parametrize("optimizer, first, then", [("adamw", True, False), ("adafactor", False, True)])
def test_a_run_resumes_across_scan_layers_with_the_same_losses(tmp_path, synthetic_source, optimizer, first, then):
    """Train state and optimizer state (Adafactor's factored moments included) resume in the other setting;
    the losses go on as the run's own setting would have (1e-5)."""
    resume = functools.partial(run, source=synthetic_source, config=GPT2, optimizer=optimizer, checkpoint_every=2)
    resume(tmp_path / "straight", scan_layers=first, steps=4)
    resume(tmp_path / "switched", scan_layers=first, steps=2)
    resume(tmp_path / "switched", scan_layers=then, steps=4)
    straight, switched = training.losses(tmp_path / "straight"), training.losses(tmp_path / "switched")
    np.testing.assert_allclose([switched[s] for s in (3, 4)], [straight[s] for s in (3, 4)], rtol=1e-5)


@pytest.mark.parametrize("family", ["t5"])  # its two stacks; GPT-2's one is covered by the resume test above
def test_adafactor_from_one_checkpoint_trains_alike_scanned_and_unrolled(tmp_path, synthetic_source, family):
    """RESTORE_FROM one checkpoint, 5 Adafactor steps scanned and unrolled: the same losses (1e-5)."""
    config, lengths = FAMILIES[family]
    pretrained = str(tmp_path / "pretrained")
    store.save_params(pretrained, 0, init_params(scan(config, True), lengths),
                            {"config": dataclasses.asdict(config)})
    source = synthetic_source if family == "gpt2" else training.span_corruption
    for scan_layers in (True, False):
        run(tmp_path / str(scan_layers), source, config, "adafactor", scan_layers, steps=5, restore_from=pretrained)
    scanned, unrolled = training.losses(tmp_path / "True"), training.losses(tmp_path / "False")
    assert sorted(scanned) == [1, 2, 3, 4, 5]
    np.testing.assert_allclose([unrolled[s] for s in scanned], list(scanned.values()), rtol=1e-5)
