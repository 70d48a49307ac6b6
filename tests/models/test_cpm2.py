"""CPM-2 (models/cpm2.py): T5's module with the exact GELU. Its logits are transformers' T5 with
feed_forward_proj 'gated-gelu_python' (the exact GELU) on the same random weights, and differ from T5 v1.1's
'gated-gelu' (tanh); the 11B preset has CPM-2's parameter count; the config refuses what CPM-2 is not."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import configs
import models
from models.cpm2 import CPM2Config
from t5x_like.lm import make_lm

torch = pytest.importorskip("torch", reason="needs the torch extra (torch, transformers)")
pytest.importorskip("transformers", reason="needs the torch extra (torch, transformers)")

from t5x_like.convert import cpm2 as converter, mapping  # noqa: E402
from tests.support import cpm2  # noqa: E402

VOCAB = 300


def preset(name: str) -> CPM2Config:
    return models.config_from_dict(configs.get_model_config(name).to_dict())


def test_the_11b_has_cpm2s_parameter_count():
    lm = make_lm(preset("cpm2"))
    without_output = 10_979_618_816  # ModelCenter 1.0.2's CPM2: the input embedding and the two stacks
    assert lm.num_params() == without_output + 26240 * 4096  # and its output_projection (its config's tied: false)


def ours_from(model, **choices) -> tuple[CPM2Config, dict]:
    hf_config = dict(model.config.to_dict(), model_type="cpm2")
    config = converter.config_from_hf(hf_config, "reference", dtype="float32", **choices)
    tensors = {n: t.detach().numpy() for n, t in model.state_dict().items()}
    flat = mapping.from_hf_tensors(tensors, config, *converter.layout(config), "reference")
    return config, jax.tree.map(jnp.asarray, mapping.unflatten(flat))


@pytest.mark.parametrize("scan_layers", [True, False])
def test_logits_are_transformers_t5_with_the_exact_gelu(scan_layers):
    model = cpm2.reference_t5(VOCAB, seed=1)
    config, params = ours_from(model, scan_layers=scan_layers)
    rng = np.random.default_rng(0)
    inputs, targets = rng.integers(0, VOCAB, (2, 11)), rng.integers(0, VOCAB, (2, 7))
    with torch.no_grad():
        want = model(input_ids=torch.tensor(inputs), decoder_input_ids=torch.tensor(targets)).logits.numpy()
    module = models.FAMILIES["cpm2"].module(config)
    got = module.apply({"params": params}, jnp.asarray(inputs), jnp.asarray(targets))
    error = np.abs(np.asarray(got)[..., :VOCAB] - want).max()
    print("max |ours - reference|", error)
    assert error < 1e-4
    tanh = models.FAMILIES["t5"].module(models.t5.T5Config(**{
        f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name != "family"}))
    differs = tanh.apply({"params": params}, jnp.asarray(inputs), jnp.asarray(targets))
    assert np.abs(np.asarray(differs)[..., :VOCAB] - want).max() > 20 * error  # the tanh GELU is another model


def test_conventions_are_cpm2_finetunes():
    config = preset("cpm2_tiny")
    assert config.decoder_start_ids() == (1, 26050) and not config.inputs_end_with_eos()
    assert config.targets_end_id(eod_id=7) == 26051
    assert "exact GELU" in config.summary()


@pytest.mark.parametrize("field, value, message", [("feed_forward", "relu", "CPM-2's MLP is gated"),
                                                   ("vocab_size", 100, "190 sentinels")])
def test_the_config_refuses_what_cpm2_is_not(field, value, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(preset("cpm2_tiny"), **{field: value})
