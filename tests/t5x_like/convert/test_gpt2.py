"""GPT-2 <-> Hugging Face / torch: logits equal transformers' after from-hf and after to-hf, round trips
are lossless, one AdamW step matches torch.optim.AdamW, and bad inputs fail clearly.

Tiny random models with odd sizes (head_dim 9, mlp 52) and the real vocabulary (50257, padded to 50304)."""
import dataclasses
import functools
import json
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra (torch, transformers)")
transformers = pytest.importorskip("transformers", reason="needs the torch extra (torch, transformers)")

import models  # noqa: E402
from models.gpt2 import GPT2Config  # noqa: E402
from t5x_like import optim  # noqa: E402
from t5x_like import step_fns  # noqa: E402
from t5x_like.checkpoint import store  # noqa: E402
from t5x_like.convert import __main__ as cli  # noqa: E402
from t5x_like.convert import gpt2, hf, mapping  # noqa: E402
from t5x_like.features import DECODER_INPUT_TOKENS, DECODER_LOSS_WEIGHTS, DECODER_TARGET_TOKENS  # noqa: E402
from t5x_like.inference import loading  # noqa: E402
from t5x_like.lm import make_lm  # noqa: E402
from tests.support.shared_data import shared_file

HF_SIZES = dict(vocab_size=50257, n_positions=40, n_embd=36, n_layer=3, n_head=4, n_inner=52,
                resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
LOGITS_ATOL = 1e-4  # fp32, logits of magnitude ~10


def random_hf_model(seed: int = 0):
    """A GPT2LMHeadModel whose every tensor (biases and norms included) is random."""
    torch.manual_seed(seed)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(**HF_SIZES)).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf")
    model = random_hf_model()
    model.save_pretrained(path)
    return path, model


@pytest.fixture(scope="module")
def tokens():
    return np.random.default_rng(0).integers(0, 50257, (2, 17))


def forward(config, params, tokens):
    return np.asarray(jax.jit(lambda p, t: models.build_model(config).apply({"params": p}, t))(params, tokens))


def hf_logits(model, tokens):
    with torch.no_grad():
        return model(torch.tensor(tokens)).logits.numpy()


@pytest.mark.parametrize("scan_layers", [True, False])
def test_from_hf_logits_equal_transformers(hf_dir, tmp_path, tokens, scan_layers):
    src, model = hf_dir
    hf.from_hf(str(src), str(tmp_path), scan_layers=scan_layers)
    config, tokenizer = loading.read_config(str(tmp_path))
    assert (config.scan_layers, config.vocab_size, config.padded_vocab_size, tokenizer) == (scan_layers, 50257,
                                                                                            50304, None)
    params = hf.restore_on_host(str(tmp_path), config)
    assert ("blocks" in params) == scan_layers
    np.testing.assert_array_equal(params["wte"]["embedding"][50257:], 0.0)
    ours = forward(config, params, tokens)
    np.testing.assert_allclose(ours[..., :50257], hf_logits(model, tokens), atol=LOGITS_ATOL, rtol=0)
    assert (ours[..., 50257:] == np.finfo(np.float32).min).all()


def test_round_trip_through_ours_is_lossless(hf_dir, tmp_path):
    src, model = hf_dir
    cli.main(["from-hf", str(src), str(tmp_path / "ours"), "--no_scan_layers"])
    cli.main(["to-hf", str(tmp_path / "ours"), str(tmp_path / "back")])
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back")
    theirs, ours = model.state_dict(), back.state_dict()
    assert sorted(theirs) == sorted(ours)
    for name in theirs:
        assert torch.equal(theirs[name], ours[name]), name
    written = json.loads((tmp_path / "back" / "config.json").read_text())
    original = model.config.to_dict()
    for key in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner", "layer_norm_epsilon"):
        assert written[key] == original[key], key


def test_pytorch_bin_imports_like_safetensors(tmp_path, tokens):
    model = random_hf_model(seed=1)
    model.config.save_pretrained(tmp_path / "bin")  # an older HF layout: config.json + pytorch_model.bin
    torch.save(model.state_dict(), tmp_path / "bin" / "pytorch_model.bin")
    hf.from_hf(str(tmp_path / "bin"), str(tmp_path / "ours"))
    config, _ = loading.read_config(str(tmp_path / "ours"))
    ours = forward(config, hf.restore_on_host(str(tmp_path / "ours"), config), tokens)
    np.testing.assert_allclose(ours[..., :50257], hf_logits(model, tokens), atol=LOGITS_ATOL, rtol=0)


def our_random_checkpoint(path, scan_layers=True, tokenizer=None):
    """A checkpoint of our own randomly initialised model, saved the way converters save."""
    config = GPT2Config(vocab_size=50257, max_len=40, num_layers=3, num_heads=4, embed_dim=36, mlp_dim=52,
                        dropout_rate=0.0, attention_dropout_rate=0.0, init_std=0.3, scan_layers=scan_layers)
    params = nn.meta.unbox(jax.jit(models.build_model(config).init)(
        jax.random.PRNGKey(3), jnp.zeros((1, 4), jnp.int32))["params"])
    params = jax.tree.map(lambda x: x + 0.1 * jax.random.normal(jax.random.PRNGKey(4), x.shape), params)
    store.save_params(str(path), 7, params, {"config": dataclasses.asdict(config), "tokenizer": tokenizer})
    return config, params


def test_to_hf_and_to_torch_logits_equal_ours(tmp_path, tokens):
    config, params = our_random_checkpoint(tmp_path / "ours", scan_layers=True)
    ours = forward(config, params, tokens)[..., :50257]
    hf.to_hf(str(tmp_path / "ours" / "checkpoints" / "7"), str(tmp_path / "hf"))
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    np.testing.assert_allclose(hf_logits(loaded, tokens), ours, atol=LOGITS_ATOL, rtol=0)

    cli.main(["to-torch", str(tmp_path / "ours"), str(tmp_path / "model.pt")])
    state = torch.load(tmp_path / "model.pt", weights_only=True)
    assert state["lm_head.weight"].shape == (50257, 36)
    fresh = transformers.GPT2LMHeadModel(loaded.config).eval()
    fresh.load_state_dict(state, strict=True)
    np.testing.assert_allclose(hf_logits(fresh, tokens), ours, atol=LOGITS_ATOL, rtol=0)


def test_to_hf_writes_the_recorded_gpt2_tokenizer(tmp_path):
    our_random_checkpoint(tmp_path / "ours", tokenizer=str(shared_file("gpt2-bpe")))
    hf.to_hf(str(tmp_path / "ours"), str(tmp_path / "hf"))
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    from t5x_like.data import load_tokenizer

    ours = load_tokenizer(shared_file("gpt2-bpe"))
    text = "Hangzhou is a beautiful city, isn't it?  Yes — 2,000 years old."
    assert theirs(text)["input_ids"] == ours.encode(text)
    assert theirs.eos_token_id == ours.eod_id == 50256
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["eos_token_id"] == 50256


def test_one_adamw_step_matches_torch(hf_dir, tmp_path):
    """Same batch, same settings: ours (trainer.make_train_step + optim.make_optimizer) vs
    torch.optim.AdamW with weight decay on the same matrices and clip_grad_norm_.

    Tolerance: Adam's first step is lr * g / (|g| + eps), which turns fp32 noise in a gradient
    near 0 into a step of either sign. The attention key biases have exact gradient 0 (softmax
    ignores a per-query shift), so theirs is pure noise; other entries with 0 < |g| < 10 * eps are
    as sensitive. Those (about 6% of the nonzero gradients, nearly all in embedding rows of ids
    absent from the batch) must agree within 2 * lr, every other entry within 2e-6 (lr = 1e-3)."""
    src, model = hf_dir
    lr, weight_decay, eps = 1e-3, 2.0, 1e-8  # decay moves a weight by lr·wd·w ≈ 4e-5: above the tolerance
    hf.from_hf(str(src), str(tmp_path))
    config, _ = loading.read_config(str(tmp_path))
    params = jax.tree.map(jnp.asarray, hf.restore_on_host(str(tmp_path), config))
    batch_tokens = np.random.default_rng(5).integers(0, 50257, (2, 13))
    batch = {DECODER_INPUT_TOKENS: batch_tokens[:, :-1], DECODER_TARGET_TOKENS: batch_tokens[:, 1:],
             DECODER_LOSS_WEIGHTS: np.ones((2, 12), np.float32)}

    opt = optim.make_optimizer(optim.OptimizerSettings(learning_rate=lr, warmup_steps=0, decay="constant",
                               b1=0.9, b2=0.95, eps=eps, weight_decay=weight_decay, clip_grad_norm=1.0), 10)
    state = step_fns.TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=opt.tx.init(params),
                               rng=jax.random.PRNGKey(0))
    step = jax.jit(step_fns.make_train_step(make_lm(config), opt.tx, opt.schedule,
                                           step_fns.StepConfig(cross_entropy="full_logits")))
    new_state, metrics = step(state, batch)

    torch_model = random_hf_model()
    torch_model.train()
    decayed = [p for n, p in torch_model.named_parameters() if n.endswith(".weight") and p.ndim == 2
               and "wte" not in n and "wpe" not in n]
    others = [p for n, p in torch_model.named_parameters() if all(p is not q for q in decayed)]
    torch_opt = torch.optim.AdamW([{"params": decayed, "weight_decay": weight_decay},
                                   {"params": others, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95), eps=eps)
    logits = torch_model(torch.tensor(batch[DECODER_INPUT_TOKENS])).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 50257), torch.tensor(batch[DECODER_TARGET_TOKENS]).reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(torch_model.parameters(), 1.0)
    torch_opt.step()

    assert float(metrics["loss"]) == pytest.approx(loss.item(), rel=1e-5)
    ours = dict(mapping.to_hf_tensors(mapping.flatten(jax.tree.map(np.asarray, new_state.params)), config,
                                      *gpt2.layout(config)))
    theirs = {n: p.detach().numpy() for n, p in torch_model.named_parameters()}
    assert sorted(ours) == sorted(theirs)
    grads = {n: p.grad.numpy() for n, p in torch_model.named_parameters()}
    noisy = {n: (g != 0) & (np.abs(g) < 10 * eps) for n, g in grads.items()}  # exact zeros stay put
    for name in noisy:
        if name.endswith("attn.c_attn.bias"):
            noisy[name][config.embed_dim:2 * config.embed_dim] = True  # key biases
    assert sum(m.sum() for m in noisy.values()) < 0.1 * sum((g != 0).sum() for g in grads.values())
    for name, value in theirs.items():
        steady = ~noisy[name]
        np.testing.assert_allclose(ours[name][steady], value[steady], atol=2e-6, rtol=0, err_msg=name)
        np.testing.assert_allclose(ours[name][~steady], value[~steady], atol=2 * lr, rtol=0, err_msg=name)
    moved = max(np.abs(theirs[n] - p.detach().numpy()).max() for n, p in random_hf_model().named_parameters())
    assert moved > 5e-4  # the step really changed the weights


def test_from_hf_refuses_another_family(hf_dir, tmp_path):
    (tmp_path / "gemma").mkdir()
    (tmp_path / "gemma" / "config.json").write_text(json.dumps({"model_type": "gemma", "vocab_size": 10}))
    with pytest.raises(ValueError, match=r"config.json: model_type 'gemma' has no converter.*'gpt2', 'gpt_neox'"):
        hf.from_hf(str(tmp_path / "gemma"), str(tmp_path / "out"))
    config = dict(json.loads((hf_dir[0] / "config.json").read_text()), scale_attn_by_inverse_layer_idx=True)
    (tmp_path / "scaled").mkdir()
    (tmp_path / "scaled" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="scale_attn_by_inverse_layer_idx=True is not supported"):
        hf.from_hf(str(tmp_path / "scaled"), str(tmp_path / "out"))


def test_checkpoint_without_model_config_is_refused(tmp_path):
    import orbax.checkpoint as ocp

    manager = ocp.CheckpointManager(str(tmp_path / "checkpoints"), item_names=("params",))
    manager.save(1, args=ocp.args.Composite(params=ocp.args.StandardSave({"w": np.ones(3)})))
    manager.wait_until_finished()
    manager.close()
    with pytest.raises(ValueError, match="has no model config"):
        hf.to_hf(str(tmp_path), str(tmp_path / "hf"))
    store.save_params(str(tmp_path / "empty"), 0, {"w": jnp.ones(3)}, {"config": None, "tokenizer": None})
    with pytest.raises(ValueError, match="records no model config"):
        cli.main(["to-torch", str(tmp_path / "empty"), str(tmp_path / "x.pt")])


def test_tokenizer_that_does_not_fit_is_refused(tmp_path):
    small = GPT2Config(vocab_size=300, max_len=16, num_layers=1, num_heads=2, embed_dim=8, mlp_dim=8)
    with pytest.raises(ValueError, match=r"gpt2-bpe has 50257 ids but the model's vocab_size is 300"):
        loading.open_tokenizer(str(shared_file("gpt2-bpe")), small)


@pytest.mark.integration
def test_training_restores_a_converted_checkpoint(hf_dir, tmp_path, synthetic_source):
    """RESTORE_FROM a from-hf checkpoint: the first step's loss is the converted model's loss."""
    from partitioning import make_mesh
    from t5x_like.experiment import ExperimentSettings
    from t5x_like.run import loop
    from t5x_like.run.settings import LoopSettings, RunSettings

    src, _ = hf_dir
    hf.from_hf(str(src), str(tmp_path / "ours"))
    config, _ = loading.read_config(str(tmp_path / "ours"))
    experiment = ExperimentSettings(
        model=config, mesh=make_mesh(data=2, fsdp=2, tensor=2), batch_size=8, feature_lengths={"targets": 16},
        optimizer=optim.OptimizerSettings(learning_rate=1e-3, warmup_steps=0, decay="constant"))
    loop.train(RunSettings(loop=LoopSettings(model_dir=str(tmp_path / "run"), train_steps=1, log_every=1,
                                             restore_from=str(tmp_path / "ours")), experiment=experiment),
               data_source=synthetic_source)
    batch = next(synthetic_source("train", batch_size=8, feature_lengths={"targets": 16}, seed=0, shard_index=0, shard_count=1))
    logits = forward(config, hf.restore_on_host(str(tmp_path / "ours"), config), batch[DECODER_INPUT_TOKENS])
    log_z = jax.nn.logsumexp(logits, axis=-1)
    expected = float((log_z - np.take_along_axis(logits, batch[DECODER_TARGET_TOKENS][..., None], -1)[..., 0]).mean())
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["step"] == 1
    assert rows[0]["loss"] == pytest.approx(expected, rel=1e-5)
