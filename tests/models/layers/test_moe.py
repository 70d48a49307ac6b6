"""models/layers/moe.py: the mixture of experts against numpy (routing, experts, shared expert, capacity and its
dropping order, padding) and the router losses against transformers' load_balancing_loss_func."""
import jax
import numpy as np
import pytest
import torch
from transformers.models.mixtral.modeling_mixtral import load_balancing_loss_func

from models import layers
from tests.models.layers.references import TOL, boxed, init, perturbed, values

EXPERTS, TOP_K, EMBED, WIDTH = 4, 2, 6, 5


def silu(x):
    return x / (1 + np.exp(-x))


def softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def routed(p, x, normalize):
    """[tokens, embed] -> (probabilities [tokens, experts], chosen experts [tokens, k], their weights [tokens, k])."""
    probs = softmax(x @ p["router_kernel"])
    chosen = np.argsort(-probs, axis=-1, kind="stable")[:, :TOP_K]
    weights = np.take_along_axis(probs, chosen, -1)
    return probs, chosen, weights / weights.sum(-1, keepdims=True) if normalize else weights


def expert(p, e, x):
    return (silu(x @ p["gate_kernel"][e]) * (x @ p["fc_kernel"][e])) @ p["proj_kernel"][e]


def reference(p, x, normalize, kept=None):
    """Σ over each token's top-k experts of weight · expert(x); `kept[token, j]` False drops its j-th choice."""
    tokens = x.reshape(-1, x.shape[-1])
    _, chosen, weights = routed(p, tokens, normalize)
    out = np.zeros_like(tokens)
    for n in range(tokens.shape[0]):
        for j in range(TOP_K):
            if kept is None or kept[n, j]:
                out[n] += weights[n, j] * expert(p, chosen[n, j], tokens[n])
    return out.reshape(x.shape)


def moe(**options):
    return layers.MoE(EXPERTS, TOP_K, WIDTH, init_std=0.5, out_init_std=0.3, **options)


def inputs(seed=0, batch=2, length=3):
    return np.random.default_rng(seed).normal(size=(batch, length, EMBED)).astype(np.float32)


@pytest.mark.parametrize("normalize", [True, False])
def test_dropless_experts_match_numpy(normalize):
    module, x = moe(normalize_top_k=normalize), inputs()
    variables = init(module, 1, x)
    params = boxed(variables)
    assert sorted(params) == ["fc_kernel", "gate_kernel", "proj_kernel", "router_kernel"]
    assert params["gate_kernel"].names == ("expert", "embed", "mlp") and params["proj_kernel"].names == (
        "expert", "mlp", "embed")
    assert params["gate_kernel"].value.shape == (EXPERTS, EMBED, WIDTH)
    variables = perturbed(variables, 2)
    np.testing.assert_allclose(module.apply(variables, x), reference(values(variables), x, normalize), **TOL)


def test_the_shared_expert_adds_its_sigmoid_gated_mlp():
    module, x = moe(normalize_top_k=False, shared_expert_mlp_dim=7), inputs(3)
    variables = perturbed(init(module, 4, x), 5)
    routed_params = {k: v for k, v in variables["params"].items() if k != "shared_expert"}
    p = values({"params": routed_params})
    s = values({"params": variables["params"]["shared_expert"]})
    assert sorted(s) == ["fc_kernel", "gate_kernel", "proj_kernel"]
    tokens = x.reshape(-1, EMBED)
    gate = 1 / (1 + np.exp(-(tokens @ p["shared_gate_kernel"])))
    shared_out = gate * ((silu(tokens @ s["gate_kernel"]) * (tokens @ s["fc_kernel"])) @ s["proj_kernel"])
    want = reference(p, x, False) + shared_out.reshape(x.shape)
    np.testing.assert_allclose(module.apply(variables, x), want, **TOL)


def test_a_large_capacity_drops_nothing():
    x = inputs(6)
    dropless = moe()
    variables = perturbed(init(dropless, 7, x), 8)
    np.testing.assert_allclose(moe(capacity_factor=float(EXPERTS)).apply(variables, x), dropless.apply(variables, x),
                               **TOL)


def test_capacity_keeps_each_experts_first_assignments_of_a_row_in_token_order_and_skips_padding():
    """Per row: capacity = ceil(factor · length · k / experts); an expert past it drops the row's later tokens'
    assignments; padding tokens take no place and come out as zeros."""
    x = inputs(9, batch=2, length=8)
    valid = np.ones((2, 8), bool)
    valid[1, 5:] = False
    module = moe(capacity_factor=0.5)
    variables = perturbed(init(module, 10, x), 11)
    p = values(variables)
    capacity = int(np.ceil(0.5 * 8 * TOP_K / EXPERTS))
    kept = []
    for row in range(2):
        _, chosen, _ = routed(p, x[row], True)
        taken, row_kept = np.zeros(EXPERTS, int), np.zeros_like(chosen, bool)
        for n in range(8):
            for j in range(TOP_K):
                if valid[row, n] and taken[chosen[n, j]] < capacity:
                    row_kept[n, j] = True
                    taken[chosen[n, j]] += 1
        kept.append(row_kept)
    kept = np.concatenate(kept)
    assert 0 < kept.sum() < valid.sum() * TOP_K  # some assignments dropped, some kept
    got = module.apply(variables, x, valid)
    np.testing.assert_allclose(got, reference(p, x, True, kept), **TOL)
    assert not np.asarray(got)[1, 5:].any()


def test_router_losses_equal_transformers_load_balancing_loss_over_layers_with_padding():
    """Two layers' statistics (a scanned stack's [layers, ...] and an unrolled block's, together) give
    transformers' load_balancing_loss_func over the same router logits and attention mask (1e-6), the z-loss
    the mean of logsumexp² over layers and real tokens, and the experts' shares of the assignments."""
    x = inputs(12, batch=2, length=4)
    mask = np.ones((2, 4), np.int64)
    mask[0, 3] = 0
    module = moe()
    logits, stats = [], []
    for seed in (13, 14):
        variables = perturbed(init(module, seed, x), seed + 10)
        logits.append(x.reshape(-1, EMBED) @ values(variables)["router_kernel"])
        stats.append(module.apply(variables, x, mask.astype(bool), mutable=[layers.ROUTER_STATS])[1])
    scanned = jax.tree.map(lambda a, b: np.stack([a, b]), stats[0], stats[1])
    for tree in ({"blocks": scanned}, {"block_0": stats[0], "block_1": stats[1]}):
        got = layers.router_losses(tree[layers.ROUTER_STATS] if layers.ROUTER_STATS in tree else tree)
        want = load_balancing_loss_func(tuple(torch.tensor(l) for l in logits), EXPERTS, TOP_K, torch.tensor(mask))
        np.testing.assert_allclose(got["load_balancing_loss"], want.item(), rtol=1e-6)
        lse = np.log(np.exp(np.stack(logits)).sum(-1))
        real = mask.reshape(-1).astype(bool)
        np.testing.assert_allclose(got["router_z_loss"], (lse[:, real] ** 2).mean(), rtol=1e-5)
        counts = sum(np.bincount(routed({"router_kernel": values(v)["router_kernel"]}, x.reshape(-1, EMBED)[real],
                                        True)[1].reshape(-1), minlength=EXPERTS)
                     for v in (perturbed(init(module, s, x), s + 10) for s in (13, 14)))
        np.testing.assert_allclose(got["expert_share"], counts / counts.sum(), rtol=1e-6)


def test_a_model_without_experts_reports_no_router_losses():
    assert layers.router_losses({}) == {}


def test_gradients_reach_the_router_and_every_chosen_expert():
    module, x = moe(), inputs(20, batch=4, length=8)
    variables = init(module, 21, x)
    grads = jax.grad(lambda v: (module.apply(v, x) ** 2).sum())(variables)["params"]
    assert np.abs(np.asarray(grads["router_kernel"].value)).sum() > 0
    assert (np.abs(np.asarray(grads["gate_kernel"].value)).sum(axis=(1, 2)) > 0).all()


@pytest.mark.parametrize("sizes, batch", [(dict(data=2, expert=4), 8), (dict(data=2, expert=4), 2),
                                          (dict(data=1, expert=4, tensor=2), 4), (dict(data=1, fsdp=2, expert=4), 8)])
def test_dropless_experts_split_over_devices_equal_one_device(sizes, batch):
    """Per shard (each device grouping its rows' tokens, the experts split over 'expert', their width over
    'tensor'; a batch too small to split over 'expert' too), forward and gradients equal one device's (1e-5)."""
    from partitioning import Partitioner, make_mesh

    module = layers.MoE(EXPERTS, TOP_K, 8, init_std=0.5, out_init_std=0.3)
    x = np.random.default_rng(30).normal(size=(batch, 4, EMBED)).astype(np.float32)
    variables = jax.tree.map(np.asarray, values(perturbed(init(module, 31, x), 32)))
    loss = lambda v, x: (module.apply({"params": v}, x) ** 2).sum()
    want = jax.jit(jax.value_and_grad(loss))(variables, x)
    partitioner = Partitioner(make_mesh(**sizes), "fsdp_tensor")
    with partitioner.activate():
        got = jax.jit(jax.value_and_grad(loss))(variables, x)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5)
    for name in variables:
        np.testing.assert_allclose(got[1][name], want[1][name], rtol=1e-5, atol=1e-5, err_msg=name)
