"""Mixtral <-> Hugging Face: for a tiny random transformers MixtralForCausalLM (float32, 4 experts, top-2) saved to a
folder, from-hf gives logits equal to transformers' (within 1e-4; our default routing is dropless, as
transformers'), to-hf gives back the very tensors save_pretrained wrote (`block_sparse_moe.experts.E.w1/w2/w3`, one
per expert) and a folder transformers reloads, greedy decoding on a data x tensor mesh equals transformers'
generate(do_sample=False) over 24 new tokens; the presets' parameter counts equal transformers'."""
import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra (torch, transformers)")
transformers = pytest.importorskip("transformers", reason="needs the torch extra (torch, transformers)")

from t5x_like.convert import mixtral  # noqa: E402
from t5x_like.inference import loading  # noqa: E402
from tests.support import hf_moe  # noqa: E402


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    return hf_moe.saved_and_converted("mixtral", tmp_path_factory.mktemp("mixtral"))


def test_from_hf_gives_transformers_logits(converted):
    _, model, ours = converted
    config, _ = loading.read_config(str(ours))
    assert (config.family, config.num_experts, config.num_experts_per_token, config.expert_width,
            config.normalize_router_weights, config.shared_expert_mlp_dim) == ("mixtral", 4, 2, 88, True, None)
    params = hf_moe.check_logits(model, ours)
    assert params["blocks"]["mlp"]["gate_kernel"].shape == (2, 4, 64, 88)


def test_to_hf_gives_back_the_per_expert_tensors(converted, tmp_path):
    src, model, ours = converted
    written = hf_moe.check_round_trip(src, model, ours, tmp_path / "back", (
        "model_type", "architectures", "hidden_size", "intermediate_size", "num_local_experts", "num_experts_per_tok",
        "num_key_value_heads", "rope_parameters", "sliding_window", "tie_word_embeddings"))
    assert {f"model.layers.1.block_sparse_moe.experts.3.w{i}.weight" for i in (1, 2, 3)} <= set(written)


def test_greedy_decoding_on_a_mesh_equals_transformers_generate(converted):
    _, model, ours = converted
    hf_moe.check_greedy_decoding(model, ours)


@pytest.mark.parametrize("preset", hf_moe.presets_of("mixtral"))
def test_preset_parameter_counts_equal_transformers(preset):
    ours, theirs = hf_moe.parameter_counts(preset, mixtral, transformers.MixtralConfig,
                                           transformers.MixtralForCausalLM)
    assert ours == theirs, preset
    if preset == "mixtral_8x7b":
        assert ours == 46_702_792_704


@pytest.mark.parametrize("changes, says", [
    ({"hidden_act": "gelu"}, "hidden_act='gelu' is not supported by our mixtral"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}},
     "rope_type='yarn' is not supported by our mixtral"),
    ({"num_local_experts": 3}, "tensor 'model.layers.0.block_sparse_moe.gate.weight' has shape (4, 64)"),
])
def test_unsupported_hf_options_are_refused_in_one_line(tmp_path, changes, says):
    assert says in hf_moe.refused_line(tmp_path, "mixtral", changes)


def test_weights_missing_an_expert_are_refused_naming_it(tmp_path):
    from safetensors.numpy import save_file

    from t5x_like.convert import hf
    from t5x_like.errors import UserError

    hf_moe.random_moe("mixtral").save_pretrained(tmp_path / "hf")
    tensors = hf_moe.saved_tensors(tmp_path / "hf")
    del tensors["model.layers.1.block_sparse_moe.experts.2.w3.weight"]
    save_file(tensors, str(tmp_path / "hf" / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(UserError, match=r"tensor 'model\.layers\.1\.block_sparse_moe\.experts\.2\.w3\.weight' is "
                                        r"missing \(the weights hold experts \[0, 1, 3\]"):
        hf.from_hf(str(tmp_path / "hf"), str(tmp_path / "ours"))
    assert not (tmp_path / "ours").exists()
