"""models/qwen3_moe.py: the config's defaults (Qwen3-30B-A3B's) and checks, its summary and the parameter tree
(Qwen3's, query/key norms included, with the mixture as each block's MLP); logits and decoding against transformers
are tests/t5x_like/convert/test_qwen3_moe.py's."""
import dataclasses

import jax
import numpy as np
import pytest

from models.qwen3_moe import Qwen3Moe, Qwen3MoeConfig

# 3 heads of 12 on a 16-wide stream (Qwen3's heads of their own width).
TINY = Qwen3MoeConfig(vocab_size=300, num_layers=2, num_heads=3, num_key_value_heads=1, embed_dim=16, head_dim=12,
                      mlp_dim=48, expert_mlp_dim=10, num_experts=4, num_experts_per_token=2, max_len=64,
                      vocab_pad_multiple=128)


def test_defaults_are_qwen3_30b_a3b():
    config = Qwen3MoeConfig()
    assert (config.num_experts, config.num_experts_per_token, config.expert_width, config.shared_expert_mlp_dim,
            config.normalize_router_weights, config.head_dim) == (128, 8, 768, None, True, 128)


@pytest.mark.parametrize("fields, message", [
    (dict(qkv_bias=True), "qkv_bias True: qwen3_moe has no qkv bias option \\(family 'llama' has it\\)"),
    (dict(shared_expert_mlp_dim=16), "shared_expert_mlp_dim 16: qwen3_moe has no shared expert mlp dim option "
                                     r"\(family 'qwen2_moe' has it\)"),
    (dict(num_experts_per_token=5), "num_experts_per_token 5 exceeds num_experts 4"),
    (dict(expert_mlp_dim=0), "expert_mlp_dim 0 must be a positive integer"),
])
def test_config_errors_name_the_fix(fields, message):
    with pytest.raises(ValueError, match=message):
        dataclasses.replace(TINY, **fields)


def test_summary_names_the_norms_and_the_experts():
    assert TINY.summary() == ("qwen3_moe: 2 layers, width 16, 3 heads x 12 (1 key/value heads) (rotary on 12), "
                              "query/key RMSNorm, 4 experts, top-2, expert mlp 10, vocab 300 (padded to 384), "
                              "max_len 64, float32")
    assert TINY.mlp_params() == 16 * 4 + 2 * 3 * 16 * 10


def test_parameter_tree_is_qwen3s_with_the_mixture():
    shapes = jax.eval_shape(lambda: Qwen3Moe(TINY).init(jax.random.key(0), np.zeros((1, 8), np.int32)))["params"]
    flat = {"/".join(str(k.key) for k in path): leaf.value.shape
            for path, leaf in jax.tree_util.tree_flatten_with_path(shapes, is_leaf=lambda x: hasattr(x, "value"))[0]}
    mlp = {path.removeprefix("blocks/mlp/"): shape for path, shape in flat.items() if path.startswith("blocks/mlp/")}
    assert mlp == {"router_kernel": (2, 16, 4), "gate_kernel": (2, 4, 16, 10), "fc_kernel": (2, 4, 16, 10),
                   "proj_kernel": (2, 4, 10, 16)}
    assert flat["blocks/attn/query_norm/scale"] == flat["blocks/attn/key_norm/scale"] == (2, 12)
    assert flat["blocks/attn/query_kernel"] == (2, 16, 3, 12)
