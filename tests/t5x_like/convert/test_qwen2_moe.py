"""Qwen2-MoE <-> Hugging Face: for a tiny random transformers Qwen2MoeForCausalLM (float32, 4 experts of width 40,
top-2 not renormalised, a shared expert of width 56 behind its sigmoid gate, biases on q/k/v) saved to a folder,
from-hf gives logits equal to transformers' (within 1e-4; dropless routing, as transformers'), to-hf gives back the
very tensors save_pretrained wrote (`mlp.experts.E.{gate,up,down}_proj`, the shared expert and its gate) and a
folder transformers reloads, greedy decoding on a data x tensor mesh equals transformers' generate(do_sample=False)
over 24 new tokens; the presets' parameter counts equal transformers'; dense layers between the sparse ones and
a sliding window are refused in one line."""
import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra (torch, transformers)")
transformers = pytest.importorskip("transformers", reason="needs the torch extra (torch, transformers)")

from t5x_like.convert import qwen2_moe  # noqa: E402
from t5x_like.inference import loading  # noqa: E402
from tests.support import hf_moe  # noqa: E402


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    return hf_moe.saved_and_converted("qwen2_moe", tmp_path_factory.mktemp("qwen2_moe"))


def test_from_hf_gives_transformers_logits(converted):
    _, model, ours = converted
    config, _ = loading.read_config(str(ours))
    assert (config.family, config.num_experts, config.num_experts_per_token, config.expert_width,
            config.normalize_router_weights, config.shared_expert_mlp_dim, config.qkv_bias) == (
        "qwen2_moe", 4, 2, 40, False, 56, True)
    mlp = hf_moe.check_logits(model, ours)["blocks"]["mlp"]
    assert mlp["proj_kernel"].shape == (2, 4, 40, 64) and mlp["shared_gate_kernel"].shape == (2, 64, 1)
    assert mlp["shared_expert"]["fc_kernel"].shape == (2, 64, 56)


def test_to_hf_gives_back_the_per_expert_tensors(converted, tmp_path):
    src, model, ours = converted
    written = hf_moe.check_round_trip(src, model, ours, tmp_path / "back", (
        "model_type", "architectures", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_experts",
        "num_experts_per_tok", "norm_topk_prob", "shared_expert_intermediate_size", "decoder_sparse_step",
        "mlp_only_layers", "qkv_bias", "use_sliding_window", "rope_parameters", "tie_word_embeddings"))
    assert {"model.layers.1.mlp.experts.3.down_proj.weight", "model.layers.1.mlp.shared_expert_gate.weight",
            "model.layers.1.self_attn.q_proj.bias"} <= set(written)


def test_greedy_decoding_on_a_mesh_equals_transformers_generate(converted):
    _, model, ours = converted
    hf_moe.check_greedy_decoding(model, ours)


@pytest.mark.parametrize("preset", hf_moe.presets_of("qwen2_moe"))
def test_preset_parameter_counts_equal_transformers(preset):
    ours, theirs = hf_moe.parameter_counts(preset, qwen2_moe, transformers.Qwen2MoeConfig,
                                           transformers.Qwen2MoeForCausalLM)
    assert ours == theirs, preset
    if preset == "qwen1_5_moe_a2_7b":
        assert ours == 14_315_784_192


@pytest.mark.parametrize("changes, says", [
    ({"decoder_sparse_step": 2}, "decoder_sparse_step=2 is not supported by our qwen2_moe"),
    ({"mlp_only_layers": [1]}, "mlp_only_layers=[1] is not supported by our qwen2_moe"),
    ({"use_sliding_window": True, "sliding_window": 16}, "use_sliding_window=True is not supported by our qwen2_moe"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu' is not supported by our qwen2_moe"),
    ({"moe_intermediate_size": 48}, "tensor 'model.layers.0.mlp.experts.gate_proj.weight' has shape (4, 40, 64)"),
])
def test_unsupported_hf_options_are_refused_in_one_line(tmp_path, changes, says):
    assert says in hf_moe.refused_line(tmp_path, "qwen2_moe", changes)
