"""models/mixtral.py and the MoE config every mixture-of-experts family shares (models/config.py's MoEConfig): the
summary names the experts, FLOPs count the weights a token goes through (k experts and the router, not all of
them), the router's settings are run choices, and what cannot work is refused in one sentence."""
import dataclasses

import pytest

import configs
import models
from models.mixtral import MixtralConfig


def preset(name: str, **changes) -> MixtralConfig:
    return models.config_from_dict({**configs.get_model_config(name).to_dict(), **changes})


def test_the_summary_names_the_experts_and_the_routing():
    summary = preset("mixtral_8x7b").summary()
    assert "8 experts, top-2, expert mlp 14336" in summary and "capacity" not in summary
    assert "capacity factor 1.25" in preset("mixtral_8x7b", capacity_factor=1.25).summary()


def test_flops_count_the_active_weights_of_a_token():
    """Mixtral 8x7B: 12.9B parameters active per token (the paper's figure counts both tables; the FLOPs count
    the output one, the input lookup multiplies nothing)."""
    c = preset("mixtral_8x7b")
    dense = dataclasses.replace(c, num_experts=1, num_experts_per_token=1, mlp_dim=2 * c.mlp_dim)
    assert c.mlp_params() - dense.mlp_params() == c.embed_dim * (c.num_experts - 1)  # the router's other columns
    assert c.matmul_params() + c.vocab_size * c.embed_dim == pytest.approx(12.9e9, rel=0.01)


def test_router_settings_are_run_choices_and_the_architecture_keeps_the_experts():
    c = preset("mixtral_tiny")
    assert {"router_aux_loss_coef", "router_z_loss_coef", "capacity_factor"} <= set(c.RUN_FIELDS)
    assert {"num_experts", "num_experts_per_token", "expert_mlp_dim"} <= set(c.architecture())
    assert c.loss_terms() == {"load_balancing_loss": 0.001, "router_z_loss": 0.0}


@pytest.mark.parametrize("changes, message", [
    (dict(num_experts_per_token=9), "num_experts_per_token 9 exceeds num_experts 8"),
    (dict(num_experts=0), "num_experts 0 must be a positive integer"),
    (dict(router_aux_loss_coef=-0.1), "router_aux_loss_coef -0.1 must be a number >= 0"),
    (dict(router_aux_loss_coef=float("inf")), r"router_aux_loss_coef inf must be a number >= 0, not nan or inf"),
    (dict(capacity_factor=float("inf")), r"capacity_factor inf must be a positive number, not nan or inf"),
    (dict(capacity_factor=0), "capacity_factor 0 must be a positive number"),
    # issue 52: options transformers' Mixtral has not (to-hf could not write them) are refused when the config is made
    (dict(shared_expert_mlp_dim=1024), "shared_expert_mlp_dim 1024: mixtral has no shared expert mlp dim option "
                                       r"\(family 'qwen2_moe' has it\)"),
    (dict(normalize_router_weights=False), "normalize_router_weights False: mixtral has no normalize router weights "
                                           "option"),
    (dict(qkv_bias=True), "qkv_bias True: mixtral has no qkv bias option"),
    (dict(expert_mlp_dim=4096), r"expert_mlp_dim 4096: mixtral's experts are mlp_dim \(14336\) wide"),
])
def test_impossible_settings_are_refused_naming_the_field(changes, message):
    with pytest.raises(ValueError, match=message):
        preset("mixtral_8x7b", **changes)


def test_a_pipeline_is_refused_with_what_to_use_instead():
    with pytest.raises(ValueError, match="not pipelined here .* set PIPELINE_PARALLEL=1 and shard the experts with "
                                         "EXPERT_PARALLEL"):
        preset("mixtral_tiny").pipeline_stacks()
