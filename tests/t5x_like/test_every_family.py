"""Every registered family trains (tests/support/families.py holds one tiny model each):

- the pulse: on one device, two steps on the same batch lower the loss (`make test-fast` runs it beside the unit
  tier);
- one table, family x mesh: the same losses and gradient norms on every mesh as on one device (packed batches:
  two documents a row).

Both read the family's single-device run, which a session computes (and compiles) once.
"""
import jax
import numpy as np
import pytest

import models
from partitioning import make_mesh
from t5x_like.lm import make_lm
from tests.support import families

pytestmark = pytest.mark.integration
BATCH = 8


def data_for(family: str) -> list[dict[str, np.ndarray]]:
    """Three steps' batches: one batch twice (the pulse reads steps 1-2), then another."""
    config = families.TINY[family]
    first, second = families.batches(make_lm(config), families.lengths_of(config), BATCH, 2, seed=3)
    return [first, first, second]


@pytest.fixture(scope="session")
def one_device_runs():
    """family -> its run on one device (metrics per step), computed the first time a test asks."""
    runs = {}

    def run(family: str):
        if family not in runs:
            mesh = make_mesh(data=1, devices=jax.devices()[:1])
            runs[family] = families.train(families.TINY[family], mesh, "fsdp_tensor", data_for(family))[0]
        return runs[family]

    return run


def test_every_registered_family_has_a_tiny_model():
    assert sorted(families.TINY) == sorted(models.FAMILIES)
    assert all(config.family == family for family, config in families.TINY.items())


@pytest.mark.pulse
@pytest.mark.parametrize("family", sorted(families.TINY))
def test_pulse_two_steps_on_one_batch_lower_the_loss(family, one_device_runs):
    history = one_device_runs(family)
    first, second = (step["loss"] for step in history[:2])
    assert np.isfinite([step["loss"] for step in history]).all() and history[0]["grad_norm"] > 0
    assert second < first, f"{family}: the loss went {first:.4f} -> {second:.4f} on the same batch"


MESHES = {  # name: (mesh sizes, rule set, build_experiment settings)
    "data=8": (dict(data=8), "fsdp_tensor", {}),
    "fsdp=8": (dict(data=1, fsdp=8), "fsdp", {}),
    "tensor=8": (dict(data=1, tensor=8), "tensor", {}),
    "data=2,fsdp=2,tensor=2": (dict(data=2, fsdp=2, tensor=2), "fsdp_tensor", {}),
    "data=4,tensor=2": (dict(data=4, tensor=2), "fsdp_tensor", {}),
    "zero1 data=2,fsdp=4": (dict(data=2, fsdp=4), "zero1", {}),
    "full-logits cross-entropy, vocab over tensor=2": (
        dict(data=2, fsdp=2, tensor=2), "fsdp_tensor", {"cross_entropy": "full_logits"}),
    "expert=4,data=2": (dict(data=2, expert=4), "fsdp_tensor", {}),
    "expert=4,tensor=2": (dict(data=1, expert=4, tensor=2), "fsdp_tensor", {}),
}
EVERY_FAMILY_MESH = "data=2,fsdp=2,tensor=2"
"""The mesh every registered family runs on (a family registered later too)."""
MORE_MESHES = {  # GPT-2 every mesh; a few families the meshes that split what is their own
    "gpt2": ["data=8", "fsdp=8", "tensor=8", "zero1 data=2,fsdp=4", "full-logits cross-entropy, vocab over tensor=2"],
    "neox": ["tensor=8"],
    "t5": ["fsdp=8", "data=4,tensor=2"],  # the relative bias table over tensor
    "mixtral": ["expert=4,data=2", "expert=4,tensor=2"],  # the experts over 'expert' (dropless routing)
}
"""family -> the meshes it runs on besides EVERY_FAMILY_MESH (Llama's grouped key/value heads split over tensor
there; tests/t5x_like/data/objectives/test_mlm_training.py runs BERT on data=4 x tensor=2 with eval)."""
FAMILY_MESHES = {family: [EVERY_FAMILY_MESH, *MORE_MESHES.get(family, [])] for family in families.TINY}


def test_every_mesh_is_run_and_only_registered_families_run_more():
    assert set(MORE_MESHES) <= set(families.TINY)
    assert {m for meshes in FAMILY_MESHES.values() for m in meshes} == set(MESHES)


@pytest.mark.parametrize("family, mesh", [(f, m) for f, meshes in sorted(FAMILY_MESHES.items()) for m in meshes])
def test_same_losses_on_every_mesh_as_on_one_device(family, mesh, one_device_runs):
    """Losses within 1e-5 and gradient norms within 1e-4 (float32: only the reduction order differs)."""
    want = one_device_runs(family)
    sizes, rules, settings = MESHES[mesh]
    got, _ = families.train(families.TINY[family], make_mesh(**sizes), rules, data_for(family), **settings)
    np.testing.assert_allclose([m["loss"] for m in got], [m["loss"] for m in want], rtol=1e-5, err_msg=mesh)
    np.testing.assert_allclose([m["grad_norm"] for m in got], [m["grad_norm"] for m in want], rtol=1e-4,
                               err_msg=mesh)
