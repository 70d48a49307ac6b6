"""models/layers/stack.py: the block stack scanned (one parameter stack on a 'layers' axis) equals the same
blocks unrolled, the runtime's hook replaces only a scanned stack, and every remat policy keeps the gradient."""
import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from models import layers
from tests.models.layers.references import TOL, init


class Scale(nn.Module):
    """A block for block_stack: x * w + shift (w a per-layer parameter, shift broadcast to every layer)."""

    features: int

    @nn.compact
    def __call__(self, x, shift):
        w = layers.logical_param(self, "w", nn.initializers.normal(1.0), (self.features,), ("embed",), jnp.float32)
        return x * w + shift, None


class Stack(nn.Module):
    scan_layers: bool
    layer_stack: object = None
    remat_policy: str = "none"

    @nn.compact
    def __call__(self, x, shift):
        stack = layers.block_stack(Scale, (4,), num_layers=3, scan_layers=self.scan_layers, broadcast_args=1,
                                   remat_policy=self.remat_policy, layer_stack=self.layer_stack)
        return stack(x, shift)[0]


def test_block_stack_scanned_equals_unrolled():
    x, shift = jnp.arange(8.0).reshape(2, 4), jnp.full((2, 4), 0.5)
    scanned = init(Stack(scan_layers=True), 0, x, shift)
    w = scanned["params"][layers.STACKED]["w"]
    assert w.value.shape == (3, 4) and w.names == ("layers", "embed")
    assert len({tuple(np.asarray(row)) for row in w.value}) == 3  # each layer its own initial values
    unrolled = {"params": {layers.UNROLLED.format(i): {"w": nn.LogicallyPartitioned(w.value[i], ("embed",))}
                           for i in range(3)}}
    expected = np.asarray(x)
    for i in range(3):
        expected = expected * np.asarray(w.value[i]) + 0.5
    np.testing.assert_allclose(Stack(scan_layers=True).apply(scanned, x, shift), expected, **TOL)
    np.testing.assert_allclose(Stack(scan_layers=False).apply(unrolled, x, shift), expected, **TOL)
    np.testing.assert_allclose(Stack(scan_layers=False, remat_policy="full").apply(unrolled, x, shift), expected,
                               **TOL)
    assert sorted(init(Stack(scan_layers=False), 0, x, shift)["params"]) == [
        "block_0", "block_1", "block_2"]


def test_block_stack_layer_stack_hook():
    seen = []

    def hook(block, stack):
        seen.append(block)
        return stack

    x, shift = jnp.ones((2, 4)), jnp.zeros((2, 4))
    init(Stack(scan_layers=True, layer_stack=hook), 0, x, shift)
    assert seen == [Scale]
    init(Stack(scan_layers=True, layer_stack=hook, remat_policy="full"), 0, x, shift)
    assert seen[1] is not Scale  # the hook gets the rematerialised block it runs
    with pytest.raises(ValueError, match="needs scan_layers=True; set model_config.scan_layers = True"):
        init(Stack(scan_layers=False, layer_stack=hook), 0, x, shift)


def test_remat_policies():
    assert layers.remat(Scale, "none") is Scale
    with pytest.raises(ValueError) as raised:
        layers.remat(Scale, "everything")
    assert str(raised.value) == ("remat policy 'everything' is unknown; choose 'none' or one of "
                                 f"{sorted(layers.REMAT_POLICIES)}.")
    x = jnp.arange(4.0)
    variables = init(Scale(4), 0, x, 1.0)
    for policy in ("full", "minimal", "save_dots", "save_qkv_proj"):
        wrapped = layers.remat(Scale, policy)
        assert wrapped is not Scale
        loss = lambda v, m=wrapped: jnp.sum(m(4).apply(v, x, 1.0)[0] ** 2)
        reference = lambda v: jnp.sum(Scale(4).apply(v, x, 1.0)[0] ** 2)
        np.testing.assert_allclose(jax.grad(loss)(variables)["params"]["w"].value,
                                   jax.grad(reference)(variables)["params"]["w"].value, **TOL)
