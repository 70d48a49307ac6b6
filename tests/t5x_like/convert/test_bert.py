"""BERT / RoBERTa <-> Hugging Face / torch: logits of BertForMaskedLM, BertForSequenceClassification,
RobertaForMaskedLM and RobertaForSequenceClassification equal ours after from-hf (rows with padding
included, at every position) and after to-hf / to-torch, round trips are lossless, one AdamW step of
masked-LM training matches torch.optim.AdamW, and unsupported configs fail clearly.

Tiny random models with odd sizes (head_dim 9, mlp 52, vocabulary 300 padded to 384) whose every
tensor (biases and norms included) is random. Tolerance: fp32 logits of magnitude ~5 within 1e-4."""
import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra (torch, transformers)")
transformers = pytest.importorskip("transformers", reason="needs the torch extra (torch, transformers)")

import models  # noqa: E402
from t5x_like import optim  # noqa: E402
from t5x_like import step_fns  # noqa: E402
from t5x_like.convert import __main__ as cli  # noqa: E402
from t5x_like.convert import bert, hf, mapping  # noqa: E402
from t5x_like.features import (ENCODER_INPUT_TOKENS, ENCODER_LOSS_WEIGHTS, ENCODER_SEGMENT_IDS,  # noqa: E402
                               ENCODER_TARGET_TOKENS, ENCODER_TOKEN_TYPES)
from t5x_like.inference import loading  # noqa: E402
from t5x_like.lm import make_lm  # noqa: E402

LOGITS_ATOL = 1e-4
VOCAB = 300
CLASSES = {
    "BertForMaskedLM": ("BertConfig", 40),
    "BertForSequenceClassification": ("BertConfig", 40),
    "RobertaForMaskedLM": ("RobertaConfig", 42),
    "RobertaForSequenceClassification": ("RobertaConfig", 42),
}


def random_hf_model(name: str, seed: int = 0):
    config_name, positions = CLASSES[name]
    roberta = name.startswith("Roberta")
    config = getattr(transformers, config_name)(
        vocab_size=VOCAB, hidden_size=36, num_hidden_layers=2, num_attention_heads=4, intermediate_size=52,
        max_position_embeddings=positions, type_vocab_size=1 if roberta else 2, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, num_labels=3)
    torch.manual_seed(seed)
    model = getattr(transformers, name)(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.2)
    return model


@pytest.fixture(scope="module", params=list(CLASSES))
def hf_dir(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    model = random_hf_model(request.param)
    model.save_pretrained(path)
    return path, model


def padded_batch(config, seed: int = 0):
    """Two rows of 17 tokens, the second with 6 padding positions; token types 1 from position 9 where
    the model has two."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(3, VOCAB, (2, 17))
    mask = np.ones((2, 17), np.int32)
    mask[1, 11:] = 0
    tokens[1, 11:] = config.pad_token_id
    types = np.zeros_like(tokens)
    if config.type_vocab_size > 1:
        types[:, 9:] = 1
    return tokens, mask, types


def ours_logits(config, params, tokens, mask, types):
    fn = jax.jit(lambda p, t, s, tt: models.build_model(config).apply({"params": p}, t, segment_ids=s,
                                                                      token_types=tt))
    logits = np.asarray(fn(params, tokens, mask, types))
    return logits[..., :config.vocab_size] if config.head == "mlm" else logits


def hf_logits(model, tokens, mask, types):
    with torch.no_grad():
        return model(torch.tensor(tokens), attention_mask=torch.tensor(mask),
                     token_type_ids=torch.tensor(types)).logits.numpy()


@pytest.mark.parametrize("scan_layers", [True, False])
def test_from_hf_logits_equal_transformers_with_padding(hf_dir, tmp_path, scan_layers):
    src, model = hf_dir
    hf.from_hf(str(src), str(tmp_path), scan_layers=scan_layers)
    config, _ = loading.read_config(str(tmp_path))
    classifies = type(model).__name__.endswith("SequenceClassification")
    assert config.head == ("classification" if classifies else "mlm")
    assert (config.family, config.scan_layers) == (model.config.model_type, scan_layers)
    params = hf.restore_on_host(str(tmp_path), config)
    np.testing.assert_array_equal(params["embeddings"]["word"]["embedding"][VOCAB:], 0.0)
    batch = padded_batch(config)
    ours, theirs = ours_logits(config, params, *batch), hf_logits(model, *batch)
    assert ours.shape == theirs.shape == ((2, 3) if classifies else (2, 17, VOCAB))
    np.testing.assert_allclose(ours, theirs, atol=LOGITS_ATOL, rtol=0)


def test_round_trip_through_ours_is_lossless(hf_dir, tmp_path):
    src, model = hf_dir
    cli.main(["from-hf", str(src), str(tmp_path / "ours"), "--no_scan_layers"])
    cli.main(["to-hf", str(tmp_path / "ours"), str(tmp_path / "back")])
    back = type(model).from_pretrained(tmp_path / "back")
    theirs, ours = model.state_dict(), back.state_dict()
    assert sorted(theirs) == sorted(ours)
    for name in theirs:
        assert torch.equal(theirs[name], ours[name]), name
    written = json.loads((tmp_path / "back" / "config.json").read_text())
    original = model.config.to_dict()
    for key in ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size", "max_position_embeddings", "type_vocab_size", "layer_norm_eps", "pad_token_id"):
        assert written[key] == original[key], key
    assert written["architectures"] == [type(model).__name__]


def test_to_torch_state_dict_loads_strictly(hf_dir, tmp_path):
    src, model = hf_dir
    hf.from_hf(str(src), str(tmp_path / "ours"))
    cli.main(["to-torch", str(tmp_path / "ours"), str(tmp_path / "model.pt")])
    state = torch.load(tmp_path / "model.pt", weights_only=True)
    fresh = type(model)(model.config).eval()
    fresh.load_state_dict(state, strict=True)
    config, _ = loading.read_config(str(tmp_path / "ours"))
    batch = padded_batch(config, seed=1)
    np.testing.assert_allclose(hf_logits(fresh, *batch), hf_logits(model, *batch), atol=0, rtol=0)


def test_to_hf_of_our_own_model_equals_ours(tmp_path):
    """Our randomly initialised RoBERTa classifier, written for Hugging Face, computes our logits."""
    config = models.FAMILIES["roberta"].config(
        vocab_size=VOCAB, max_len=42, num_layers=2, num_heads=4, embed_dim=36, mlp_dim=52, dropout_rate=0.0,
        attention_dropout_rate=0.0, init_std=0.3, head="classification", num_labels=3, labels=("no", "maybe", "yes"))
    import dataclasses

    import flax.linen as nn

    from t5x_like.checkpoint import store

    tokens, mask, types = padded_batch(config, seed=2)
    params = nn.meta.unbox(jax.jit(models.build_model(config).init)(jax.random.PRNGKey(3), tokens)["params"])
    store.save_params(str(tmp_path / "ours"), 7, params,
                            {"config": dataclasses.asdict(config), "tokenizer": None})
    hf.to_hf(str(tmp_path / "ours"), str(tmp_path / "hf"))
    loaded = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    assert type(loaded).__name__ == "RobertaForSequenceClassification"
    assert loaded.config.id2label == {0: "no", 1: "maybe", 2: "yes"}
    hf.from_hf(str(tmp_path / "hf"), str(tmp_path / "back"))
    assert loading.read_config(str(tmp_path / "back"))[0].labels == ("no", "maybe", "yes")
    np.testing.assert_allclose(hf_logits(loaded, tokens, mask, types), ours_logits(config, params, tokens, mask, types),
                               atol=LOGITS_ATOL, rtol=0)


def test_one_adamw_step_of_masked_lm_matches_torch(tmp_path):
    """Same batch, same settings: ours (trainer.make_train_step over the encoder-only LM, chunked
    cross-entropy over the masked positions) vs BertForMaskedLM with labels -100 elsewhere and
    torch.optim.AdamW (weight decay on the same matrices) after clip_grad_norm_.

    Tolerance, as in the GPT-2 test: Adam's first step is lr * g / (|g| + eps), so entries whose
    gradient is pure fp32 noise (exact 0 in theory: the attention key biases) or tiny
    (0 < |g| < 10 * eps) may step either way and must agree within 2 * lr; every other entry within 2e-6."""
    lr, weight_decay, eps = 1e-3, 2.0, 1e-8
    model = random_hf_model("BertForMaskedLM", seed=4)
    model.save_pretrained(tmp_path / "hf")
    hf.from_hf(str(tmp_path / "hf"), str(tmp_path / "ours"))
    config, _ = loading.read_config(str(tmp_path / "ours"))
    params = jax.tree.map(jnp.asarray, hf.restore_on_host(str(tmp_path / "ours"), config))
    tokens, mask, types = padded_batch(config, seed=5)
    masked = (np.random.default_rng(6).random(tokens.shape) < 0.3) & (mask == 1)
    inputs = np.where(masked, 4, tokens)  # 4 stands for [MASK]
    batch = {ENCODER_INPUT_TOKENS: inputs, ENCODER_SEGMENT_IDS: mask, ENCODER_TOKEN_TYPES: types,
             ENCODER_TARGET_TOKENS: tokens, ENCODER_LOSS_WEIGHTS: masked.astype(np.float32)}

    opt = optim.make_optimizer(optim.OptimizerSettings(learning_rate=lr, warmup_steps=0, decay="constant",
                               b1=0.9, b2=0.999, eps=eps, weight_decay=weight_decay, clip_grad_norm=1.0), 10)
    state = step_fns.TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=opt.tx.init(params),
                               rng=jax.random.PRNGKey(0))
    step = jax.jit(step_fns.make_train_step(make_lm(config), opt.tx, opt.schedule, step_fns.StepConfig()))
    new_state, metrics = step(state, batch)

    torch_model = random_hf_model("BertForMaskedLM", seed=4)
    torch_model.train()
    named = dict(torch_model.named_parameters())
    decayed = [p for n, p in named.items() if n.endswith(".weight") and p.ndim == 2 and "embeddings" not in n]
    others = [p for p in named.values() if all(p is not q for q in decayed)]
    torch_opt = torch.optim.AdamW([{"params": decayed, "weight_decay": weight_decay},
                                   {"params": others, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.999), eps=eps)
    labels = torch.tensor(np.where(masked, tokens, -100))
    loss = torch_model(torch.tensor(inputs), attention_mask=torch.tensor(mask), token_type_ids=torch.tensor(types),
                       labels=labels).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(torch_model.parameters(), 1.0)
    torch_opt.step()

    assert float(metrics["loss"]) == pytest.approx(loss.item(), rel=1e-5)
    assert float(metrics["tokens"]) == masked.sum()
    ours = dict(mapping.to_hf_tensors(mapping.flatten(jax.tree.map(np.asarray, new_state.params)), config,
                                      *bert.layout(config)))
    theirs = {n: p.detach().numpy() for n, p in named.items()}
    assert sorted(ours) == sorted(theirs)
    grads = {n: p.grad.numpy() for n, p in named.items()}
    noisy = {n: (g != 0) & (np.abs(g) < 10 * eps) for n, g in grads.items()}
    for name in noisy:
        if name.endswith("attention.self.key.bias"):
            noisy[name][:] = True
    for name, value in theirs.items():
        steady = ~noisy[name]
        np.testing.assert_allclose(ours[name][steady], value[steady], atol=2e-6, rtol=0, err_msg=name)
        np.testing.assert_allclose(ours[name][~steady], value[~steady], atol=2 * lr, rtol=0, err_msg=name)
    before = {n: p.detach().numpy() for n, p in random_hf_model("BertForMaskedLM", seed=4).named_parameters()}
    assert max(np.abs(theirs[n] - before[n]).max() for n in theirs) > 5e-4  # the step really moved the weights


@pytest.mark.parametrize("field, value, message", [
    ("hidden_act", "relu", "hidden_act='relu' is not supported"),
    ("position_embedding_type", "relative_key", "position_embedding_type='relative_key' is not supported"),
])
def test_unsupported_configs_are_refused(tmp_path, field, value, message):
    model = random_hf_model("BertForMaskedLM")
    model.save_pretrained(tmp_path / "hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    (tmp_path / "hf" / "config.json").write_text(json.dumps({**config, field: value}))
    with pytest.raises(ValueError, match=message):
        hf.from_hf(str(tmp_path / "hf"), str(tmp_path / "out"))


def test_googles_original_names_convert(tmp_path):
    """bert-base-uncased as published on the Hub: LayerNorm `gamma` / `beta`, plus the pooler and the NSP
    head (`cls.seq_relationship`) beside the masked-LM head; the logits equal transformers' (which renames
    on load) within LOGITS_ATOL."""
    from safetensors.torch import save_file

    model = random_hf_model("BertForMaskedLM", seed=3)
    model.save_pretrained(tmp_path / "modern")
    state = {name.replace("LayerNorm.weight", "LayerNorm.gamma").replace("LayerNorm.bias", "LayerNorm.beta"):
             tensor.clone() for name, tensor in model.state_dict().items() if name != "cls.predictions.decoder.weight"}
    assert sum(name.endswith("LayerNorm.gamma") for name in state) == 2 * 2 + 2  # two per layer, embeddings, head
    state.update({"bert.pooler.dense.weight": torch.randn(36, 36), "bert.pooler.dense.bias": torch.randn(36),
                  "cls.seq_relationship.weight": torch.randn(2, 36), "cls.seq_relationship.bias": torch.randn(2)})
    (tmp_path / "google").mkdir()
    save_file(state, str(tmp_path / "google" / "model.safetensors"))
    (tmp_path / "google" / "config.json").write_text((tmp_path / "modern" / "config.json").read_text())
    hf.from_hf(str(tmp_path / "google"), str(tmp_path / "ours"))
    config, _ = loading.read_config(str(tmp_path / "ours"))
    batch = padded_batch(config, seed=2)
    np.testing.assert_allclose(ours_logits(config, hf.restore_on_host(str(tmp_path / "ours"), config), *batch),
                               hf_logits(model, *batch), atol=LOGITS_ATOL, rtol=0)
