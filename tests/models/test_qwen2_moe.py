"""models/qwen2_moe.py: the config's defaults (Qwen1.5-MoE-A2.7B's) and checks, its summary and the parameter tree
(Qwen2's with the mixture and its shared expert); logits and decoding against transformers are
tests/t5x_like/convert/test_qwen2_moe.py's."""
import dataclasses

import jax
import numpy as np
import pytest

from models.qwen2_moe import Qwen2Moe, Qwen2MoeConfig

TINY = Qwen2MoeConfig(vocab_size=300, num_layers=2, num_heads=4, num_key_value_heads=2, embed_dim=16, mlp_dim=48,
                      expert_mlp_dim=12, num_experts=4, num_experts_per_token=2, shared_expert_mlp_dim=20, max_len=64,
                      vocab_pad_multiple=128)


def test_defaults_are_qwen1_5_moe_a2_7b():
    config = Qwen2MoeConfig()
    assert (config.num_experts, config.num_experts_per_token, config.expert_width, config.shared_expert_mlp_dim,
            config.normalize_router_weights, config.qkv_bias, config.rope_theta) == (60, 4, 1408, 5632, False, True,
                                                                                      1e6)


@pytest.mark.parametrize("fields, message", [
    (dict(sliding_window=8), "sliding_window 8: qwen2_moe has no sliding window option \\(family 'mixtral' has it\\)"),
    (dict(num_experts_per_token=5), "num_experts_per_token 5 exceeds num_experts 4"),
    (dict(shared_expert_mlp_dim=0), "shared_expert_mlp_dim 0 must be a positive integer"),
])
def test_config_errors_name_the_fix(fields, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(TINY, **fields)


def test_summary_names_the_experts_and_the_shared_expert():
    assert TINY.summary() == ("qwen2_moe: 2 layers, width 16, 4 heads x 4 (2 key/value heads) (rotary on 4), "
                              "4 experts, top-2, expert mlp 12, shared expert mlp 20, vocab 300 (padded to 384), "
                              "max_len 64, float32")
    # a token multiplies with the router, 2 experts, the shared expert and its gate
    assert TINY.mlp_params() == 16 * 4 + 2 * 3 * 16 * 12 + 3 * 16 * 20 + 16


def test_parameter_tree_is_qwen2s_with_the_mixture_and_the_shared_expert():
    shapes = jax.eval_shape(lambda: Qwen2Moe(TINY).init(jax.random.key(0), np.zeros((1, 8), np.int32)))["params"]
    flat = {"/".join(str(k.key) for k in path): leaf.value.shape
            for path, leaf in jax.tree_util.tree_flatten_with_path(shapes, is_leaf=lambda x: hasattr(x, "value"))[0]}
    mlp = {path.removeprefix("blocks/mlp/"): shape for path, shape in flat.items() if path.startswith("blocks/mlp/")}
    assert mlp == {"router_kernel": (2, 16, 4), "gate_kernel": (2, 4, 16, 12), "fc_kernel": (2, 4, 16, 12),
                   "proj_kernel": (2, 4, 12, 16), "shared_expert/gate_kernel": (2, 16, 20),
                   "shared_expert/fc_kernel": (2, 16, 20), "shared_expert/proj_kernel": (2, 20, 16),
                   "shared_gate_kernel": (2, 16, 1)}
    assert flat["blocks/attn/query_bias"] == (2, 4, 4) and "embed_out/embedding" in flat
