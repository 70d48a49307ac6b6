"""Qwen3 <-> Hugging Face: for a tiny random transformers Qwen3ForCausalLM (float32; heads of 24 or 32 on a 64-wide
stream, the head untied or tied) saved to a folder, from-hf gives logits equal to transformers', to-hf gives back the
same tensors (and a folder transformers loads to the same logits), and greedy decoding on a data x tensor mesh
equals transformers' generate(do_sample=False) over 24 new tokens; the presets' parameter counts equal
transformers' Qwen3ForCausalLM for the same configs; config.json options we do not take are refused in one line.

Tolerances: logits in fp32 within 1e-4 (magnitude ~10); the round trip is exact."""
import json
import os

import jax
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra (torch, transformers)")
transformers = pytest.importorskip("transformers", reason="needs the torch extra (torch, transformers)")

import configs  # noqa: E402
import models  # noqa: E402
from t5x_like.convert import __main__ as cli  # noqa: E402
from t5x_like.convert import hf, qwen3  # noqa: E402
from t5x_like.errors import UserError  # noqa: E402
from t5x_like.inference import loading  # noqa: E402
from tests.support.hf_models import QWEN3_VARIANTS, VOCAB, hf_logits, random_model  # noqa: E402
from tests.support.hf_moe import check_greedy_decoding  # noqa: E402

LOGITS_ATOL = 1e-4


@pytest.fixture(scope="module", params=list(QWEN3_VARIANTS))
def converted(request, tmp_path_factory):
    """(variant, the HF folder, the HF model, our checkpoint converted from the folder)."""
    path = tmp_path_factory.mktemp(request.param)
    model = random_model(request.param)
    model.save_pretrained(path / "hf")
    cli.main(["from-hf", str(path / "hf"), str(path / "ours"), "--no_scan_layers"])
    return request.param, path / "hf", model, path / "ours"


def test_from_hf_gives_transformers_logits(converted):
    variant, _, model, ours = converted
    config, _ = loading.read_config(str(ours))
    head_dim = QWEN3_VARIANTS[variant][2]["head_dim"]
    assert (config.family, config.num_kv_heads, config.head_dim, config.tie_word_embeddings) == (
        "qwen3", 2, head_dim, variant == "qwen3-tied")
    assert config.num_heads * config.head_dim != config.embed_dim
    tokens = np.random.default_rng(0).integers(0, VOCAB, (2, 40))
    params = hf.restore_on_host(str(ours), config)
    assert params["block_0"]["attn"]["query_norm"]["scale"].shape == (head_dim,)
    logits = jax.jit(lambda p, t: models.build_model(config).apply({"params": p}, t))(params, tokens)
    np.testing.assert_allclose(np.asarray(logits)[..., :VOCAB], hf_logits(model, tokens), atol=LOGITS_ATOL, rtol=0)


def test_to_hf_gives_back_the_same_tensors(converted, tmp_path):
    from safetensors.numpy import load_file

    _, src, model, ours = converted
    cli.main(["to-hf", str(ours), str(tmp_path / "back")])
    back = load_file(str(tmp_path / "back" / "model.safetensors"))
    theirs = {name: t.numpy() for name, t in model.state_dict().items()
              if not (model.config.tie_word_embeddings and name == "lm_head.weight")}
    assert set(back) == set(theirs) and any(name.endswith("self_attn.q_norm.weight") for name in back)
    for name, tensor in theirs.items():
        np.testing.assert_array_equal(back[name], tensor, err_msg=name)
    written = json.loads((tmp_path / "back" / "config.json").read_text())
    original = json.loads((src / "config.json").read_text())
    for key in ("model_type", "architectures", "head_dim", "hidden_size", "num_attention_heads", "num_key_value_heads",
                "intermediate_size", "rope_parameters", "tie_word_embeddings", "use_sliding_window", "layer_types"):
        assert written[key] == original[key], key
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back").eval()
    assert type(reloaded) is transformers.Qwen3ForCausalLM
    tokens = np.random.default_rng(1).integers(0, VOCAB, (1, 24))
    np.testing.assert_allclose(hf_logits(reloaded, tokens), hf_logits(model, tokens), atol=1e-5, rtol=0)


def test_greedy_decoding_on_a_mesh_equals_transformers_generate(converted):
    _, _, model, ours = converted
    check_greedy_decoding(model, ours)


QWEN3_PRESETS = [p for p in configs.PRESETS if configs.get_model_config(p).family == "qwen3"]


def test_the_presets_are_the_published_sizes():
    assert sorted(QWEN3_PRESETS) == sorted(["qwen3_0_6b", "qwen3_1_7b", "qwen3_4b", "qwen3_8b", "qwen3_14b",
                                            "qwen3_32b", "qwen3_tiny"])
    config = models.config_from_dict({**configs.get_model_config("qwen3_0_6b").to_dict(), "vocab_pad_multiple": 1})
    shapes = jax.eval_shape(lambda: models.build_model(config).init(jax.random.key(0), np.zeros((1, 8), np.int32)))
    assert sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(shapes["params"])) == 596_049_920


@pytest.mark.parametrize("preset", QWEN3_PRESETS)
def test_preset_parameter_counts_equal_transformers(preset):
    """Counted on torch's meta device (no memory), tied tables once; ours from the parameter shapes, vocabulary
    unpadded."""
    config = models.config_from_dict({**configs.get_model_config(preset).to_dict(), "vocab_pad_multiple": 1})
    hf_config = qwen3.config_to_hf(config, eod_id=None)
    with torch.device("meta"):
        model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**hf_config))
    theirs = sum(p.numel() for p in model.parameters())
    shapes = jax.eval_shape(lambda: models.build_model(config).init(jax.random.key(0), np.zeros((1, 8), np.int32)))
    ours = sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(shapes["params"]))
    assert ours == theirs, preset
    assert model.config.head_dim == config.head_dim and model.config.tie_word_embeddings == config.tie_word_embeddings


@pytest.mark.parametrize("changes, says", [
    ({"use_sliding_window": True, "sliding_window": 16}, "use_sliding_window=True is not supported by our qwen3"),
    ({"layer_types": ["full_attention", "sliding_attention"]},
     "layer_types=['full_attention', 'sliding_attention'] is not supported by our qwen3"),
    ({"attention_bias": True}, "attention_bias=True is not supported by our qwen3"),
    ({"hidden_act": "gelu"}, "hidden_act='gelu' is not supported by our qwen3"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}},
     "rope_type='yarn' is not supported by our qwen3"),
    ({"head_dim": 16}, "tensor 'model.layers.0.self_attn.q_proj.weight' has shape (96, 64)"),
])
def test_unsupported_hf_options_are_refused_in_one_line(tmp_path, changes, says):
    random_model("qwen3").save_pretrained(tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    with pytest.raises(UserError) as error:
        hf.from_hf(str(tmp_path / "hf"), str(tmp_path / "ours"))
    line = str(error.value)
    assert "\n" not in line and line.startswith(str(tmp_path / "hf")) and "config.json" in line and says in line, line
    assert not os.path.exists(tmp_path / "ours")
