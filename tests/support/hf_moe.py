"""Tiny random transformers mixture-of-experts models (Mixtral, Qwen2-MoE with its shared expert, Qwen3-MoE) and
the checks every MoE converter's test makes against them (tests/t5x_like/convert/test_{mixtral,qwen2_moe,
qwen3_moe}.py): from-hf gives transformers' logits, to-hf gives back the tensors save_pretrained wrote (per-expert
names) and a folder transformers reloads, greedy decoding on a data x tensor mesh equals transformers' generate,
and a preset's parameter count equals transformers' on the meta device.

Sizes: 2 layers, width 64, 4 heads (2 key/value heads), 4 experts, top-2, a 1000-id vocabulary, float32; every
tensor perturbed by normal(0.3) so neither the logits nor the router's top-k have near-ties. Import after
`pytest.importorskip("transformers")` and "torch"."""
from __future__ import annotations

import json

import jax
import numpy as np
import torch
import transformers

import configs
import models
from partitioning import Partitioner, make_mesh
from t5x_like.convert import __main__ as cli
from t5x_like.convert import hf
from t5x_like.inference import decoding, loading
from tests.support.hf_models import SHAPE, VOCAB, hf_logits

LOGITS_ATOL = 1e-4
"""fp32 logits of magnitude ~10: the two implementations sum the experts in other orders."""
NEW_TOKENS = 24
MOE_SHAPE = dict(SHAPE, num_hidden_layers=2, num_experts_per_tok=2)
VARIANTS = {
    "mixtral": (transformers.MixtralConfig, transformers.MixtralForCausalLM,
                dict(num_local_experts=4, rope_theta=1e6)),
    "qwen2_moe": (transformers.Qwen2MoeConfig, transformers.Qwen2MoeForCausalLM,
                  dict(num_experts=4, moe_intermediate_size=40, shared_expert_intermediate_size=56,
                       norm_topk_prob=False, rope_theta=1e6)),
    "qwen3_moe": (transformers.Qwen3MoeConfig, transformers.Qwen3MoeForCausalLM,
                  dict(num_experts=4, moe_intermediate_size=40, head_dim=24, norm_topk_prob=True, rope_theta=1e6)),
}
"""Our family -> transformers' config class, model class and options (experts narrower than intermediate_size
where the family has both; Qwen3-MoE's heads of 24 on a 64-wide stream)."""


def random_moe(family: str, scale: float = 0.3, seed: int = 0):
    config_class, model_class, options = VARIANTS[family]
    torch.manual_seed(seed)
    model = model_class(config_class(**MOE_SHAPE, **options)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * scale)
    return model


def saved_and_converted(family: str, path) -> tuple:
    """(the HF folder, the HF model, our checkpoint converted from the folder with from-hf)."""
    model = random_moe(family)
    model.save_pretrained(path / "hf")
    cli.main(["from-hf", str(path / "hf"), str(path / "ours")])
    return path / "hf", model, path / "ours"


def saved_tensors(folder) -> dict[str, np.ndarray]:
    """The tensors of a folder's model.safetensors (save_pretrained's names: one tensor per expert)."""
    from safetensors.numpy import load_file

    return load_file(str(folder / "model.safetensors"))


def check_logits(model, ours) -> dict:
    """Our logits on random tokens (2 x 40) equal transformers'; returns our restored parameters."""
    config, _ = loading.read_config(str(ours))
    tokens = np.random.default_rng(0).integers(0, VOCAB, (2, 40))
    params = hf.restore_on_host(str(ours), config)
    logits = jax.jit(lambda p, t: models.build_model(config).apply({"params": p}, t))(params, tokens)
    np.testing.assert_allclose(np.asarray(logits)[..., :VOCAB], hf_logits(model, tokens), atol=LOGITS_ATOL, rtol=0)
    return params


def check_round_trip(src, model, ours, back, keys: tuple[str, ...]) -> dict[str, np.ndarray]:
    """to-hf writes exactly the tensors (names and values) save_pretrained wrote, config.json's `keys` as the
    original's, and transformers reloads the folder as the same class with the same logits; returns the tensors."""
    cli.main(["to-hf", str(ours), str(back)])
    written, original = saved_tensors(back), saved_tensors(src)
    assert set(written) == set(original)
    for name, tensor in original.items():
        np.testing.assert_array_equal(written[name], tensor, err_msg=name)
    written_config = json.loads((back / "config.json").read_text())
    original_config = json.loads((src / "config.json").read_text())
    for key in keys:
        assert written_config[key] == original_config[key], key
    reloaded = transformers.AutoModelForCausalLM.from_pretrained(back).eval()
    assert type(reloaded) is type(model)
    tokens = np.random.default_rng(1).integers(0, VOCAB, (1, 24))
    np.testing.assert_allclose(hf_logits(reloaded, tokens), hf_logits(model, tokens), atol=1e-5, rtol=0)
    return written


def check_greedy_decoding(model, ours) -> None:
    """Greedy decoding of three prompts on a data=2 x tensor=2 mesh equals transformers' generate(do_sample=False)
    over NEW_TOKENS tokens."""
    config, _ = loading.read_config(str(ours))
    partitioner = Partitioner(make_mesh(data=2, tensor=2, devices=jax.devices()[:4]), "fsdp_tensor")
    params = loading.restore_sharded(str(ours), config, partitioner)
    eod = VOCAB - 1
    prompts = [[464, 748, 286], list(range(100, 112)), [31, 7, 998, 2, 50, 311, 4, 800, 9, 10, 11]]
    ours_out = decoding.Generator(config, params, partitioner, eod_id=eod, max_new_tokens=NEW_TOKENS,
                                  settings=decoding.Sampling(temperature=0.0), batch_size=4).generate(prompts)
    for prompt, row in zip(prompts, ours_out):
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 do_sample=False, max_new_tokens=NEW_TOKENS, eos_token_id=eod, pad_token_id=eod)
        assert row == decoding.cut_at(out[0, len(prompt):].numpy(), eod)
    assert len(set(map(tuple, ours_out))) == len(prompts) and max(map(len, ours_out)) == NEW_TOKENS


def presets_of(family: str) -> list[str]:
    return [p for p in configs.PRESETS if configs.get_model_config(p).family == family]


def parameter_counts(preset: str, converter, config_class, model_class) -> tuple[int, int]:
    """(ours from the parameter shapes, vocabulary unpadded; transformers' of the config to-hf writes, counted on
    torch's meta device)."""
    config = models.config_from_dict({**configs.get_model_config(preset).to_dict(), "vocab_pad_multiple": 1})
    with torch.device("meta"):
        model = model_class(config_class(**converter.config_to_hf(config, eod_id=None)))
    shapes = jax.eval_shape(lambda: models.build_model(config).init(jax.random.key(0), np.zeros((1, 8), np.int32)))
    return sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(shapes["params"])), sum(
        p.numel() for p in model.parameters())


def refused_line(tmp_path, family: str, changes: dict) -> str:
    """The error from-hf gives for a saved tiny `family` model whose config.json has `changes`; checks that it is
    one line naming the config file and that nothing was written."""
    from t5x_like.errors import UserError

    random_moe(family).save_pretrained(tmp_path / "hf")
    path = tmp_path / "hf" / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))
    try:
        hf.from_hf(str(tmp_path / "hf"), str(tmp_path / "ours"))
    except UserError as error:
        line = str(error)
    else:
        raise AssertionError(f"from-hf took {changes}")
    assert "\n" not in line and line.startswith(str(tmp_path / "hf")) and "config.json" in line, line
    assert not (tmp_path / "ours").exists()
    return line
