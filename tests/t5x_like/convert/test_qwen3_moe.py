"""Qwen3-MoE <-> Hugging Face: for a tiny random transformers Qwen3MoeForCausalLM (float32, heads of 24 on a 64-wide
stream with their query/key norms, 4 experts of width 40, top-2 renormalised) saved to a folder, from-hf gives
logits equal to transformers' (within 1e-4; dropless routing, as transformers'), to-hf gives back the very tensors
save_pretrained wrote (`mlp.experts.E.{gate,up,down}_proj`, one per expert) and a folder transformers reloads,
greedy decoding on a data x tensor mesh equals transformers' generate(do_sample=False) over 24 new tokens; the
presets' parameter counts equal transformers'; dense layers between the sparse ones and a sliding window are
refused in one line."""
import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra (torch, transformers)")
transformers = pytest.importorskip("transformers", reason="needs the torch extra (torch, transformers)")

from t5x_like.convert import qwen3_moe  # noqa: E402
from t5x_like.inference import loading  # noqa: E402
from tests.support import hf_moe  # noqa: E402


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    return hf_moe.saved_and_converted("qwen3_moe", tmp_path_factory.mktemp("qwen3_moe"))


def test_from_hf_gives_transformers_logits(converted):
    _, model, ours = converted
    config, _ = loading.read_config(str(ours))
    assert (config.family, config.num_experts, config.num_experts_per_token, config.expert_width, config.head_dim,
            config.normalize_router_weights, config.shared_expert_mlp_dim) == ("qwen3_moe", 4, 2, 40, 24, True, None)
    params = hf_moe.check_logits(model, ours)["blocks"]
    assert params["mlp"]["gate_kernel"].shape == (2, 4, 64, 40) and params["attn"]["query_norm"]["scale"].shape == (
        2, 24)


def test_to_hf_gives_back_the_per_expert_tensors(converted, tmp_path):
    src, model, ours = converted
    written = hf_moe.check_round_trip(src, model, ours, tmp_path / "back", (
        "model_type", "architectures", "hidden_size", "intermediate_size", "moe_intermediate_size", "head_dim",
        "num_experts_per_tok", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers", "use_sliding_window",
        "rope_parameters", "tie_word_embeddings"))
    assert {"model.layers.1.mlp.experts.3.up_proj.weight", "model.layers.1.self_attn.k_norm.weight"} <= set(written)


def test_greedy_decoding_on_a_mesh_equals_transformers_generate(converted):
    _, model, ours = converted
    hf_moe.check_greedy_decoding(model, ours)


@pytest.mark.parametrize("preset", hf_moe.presets_of("qwen3_moe"))
def test_preset_parameter_counts_equal_transformers(preset):
    ours, theirs = hf_moe.parameter_counts(preset, qwen3_moe, transformers.Qwen3MoeConfig,
                                           transformers.Qwen3MoeForCausalLM)
    assert ours == theirs, preset
    if preset == "qwen3_30b_a3b":
        assert ours == 30_532_122_624


@pytest.mark.parametrize("changes, says", [
    ({"decoder_sparse_step": 2}, "decoder_sparse_step=2 is not supported by our qwen3_moe"),
    ({"mlp_only_layers": [0]}, "mlp_only_layers=[0] is not supported by our qwen3_moe"),
    ({"use_sliding_window": True, "sliding_window": 16}, "use_sliding_window=True is not supported by our qwen3_moe"),
    ({"attention_bias": True}, "attention_bias=True is not supported by our qwen3_moe"),
    ({"num_experts": 8}, "tensor 'model.layers.0.mlp.gate.weight' has shape (4, 64)"),
])
def test_unsupported_hf_options_are_refused_in_one_line(tmp_path, changes, says):
    assert says in hf_moe.refused_line(tmp_path, "qwen3_moe", changes)
