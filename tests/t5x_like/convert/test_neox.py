"""GPT-NeoX <-> Hugging Face / torch / GPT-NeoX's own checkpoints: logits equal transformers' after
from-hf, to-hf, to-torch and from-neox (2 tensor-parallel shards), HF -> ours -> HF is lossless, greedy
generation equals transformers' generate, and one AdamW step matches torch.optim.AdamW.

Tiny random models with the 20B tokenizer's real vocabulary (50277 ids, padded to 50304 here and
to 50432 in the NeoX-layout checkpoint, as NeoX pads for 2 tensor-parallel ranks)."""
import dataclasses
import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="needs the torch extra (torch, transformers)")
transformers = pytest.importorskip("transformers", reason="needs the torch extra (torch, transformers)")

import models  # noqa: E402
from partitioning import Partitioner, make_mesh  # noqa: E402
from t5x_like import step_fns  # noqa: E402
from t5x_like import optim  # noqa: E402
from t5x_like.convert import __main__ as cli  # noqa: E402
from t5x_like.convert import hf, mapping, neox  # noqa: E402
from t5x_like.data.tokenizer import load_tokenizer  # noqa: E402
from t5x_like.errors import UserError  # noqa: E402
from t5x_like.features import DECODER_INPUT_TOKENS, DECODER_LOSS_WEIGHTS, DECODER_TARGET_TOKENS  # noqa: E402
from t5x_like.inference import decoding, loading  # noqa: E402
from t5x_like.lm import make_lm  # noqa: E402
from tests.support.shared_data import shared_file, shared_file_if_present

VOCAB = 50277
LOGITS_ATOL = 1e-4  # fp32, logits of magnitude ~10
TP, NEOX_PADDED_VOCAB = 2, 50432  # NeoX pads to a multiple of 128 x its tensor-parallel size


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, random_hf_neox):
    path = tmp_path_factory.mktemp("hf")
    model = random_hf_neox(0.2, vocab_size=VOCAB)
    model.save_pretrained(path)
    return path, model


@pytest.fixture(scope="module")
def tokens():
    return np.random.default_rng(0).integers(0, VOCAB, (2, 17))


def forward(config, params, tokens):
    return np.asarray(jax.jit(lambda p, t: models.build_model(config).apply({"params": p}, t))(params, tokens))


def hf_logits(model, tokens):
    with torch.no_grad():
        return model(torch.tensor(tokens)).logits.numpy()


def assert_logits_equal_hf(checkpoint, model, tokens):
    config, _ = loading.read_config(str(checkpoint))
    ours = forward(config, hf.restore_on_host(str(checkpoint), config), tokens)
    np.testing.assert_allclose(ours[..., :VOCAB], hf_logits(model, tokens), atol=LOGITS_ATOL, rtol=0)
    assert (ours[..., VOCAB:] == np.finfo(np.float32).min).all()
    return config


@pytest.mark.parametrize("scan_layers", [True, False])
def test_from_hf_logits_equal_transformers(hf_dir, tmp_path, tokens, scan_layers):
    src, model = hf_dir
    hf.from_hf(str(src), str(tmp_path), scan_layers=scan_layers)
    config = assert_logits_equal_hf(tmp_path, model, tokens)
    assert (config.family, config.scan_layers, config.vocab_size, config.padded_vocab_size) == (
        "neox", scan_layers, VOCAB, 50304)
    params = hf.restore_on_host(str(tmp_path), config)
    for table in ("embed_in", "embed_out"):
        np.testing.assert_array_equal(params[table]["embedding"][VOCAB:], 0.0)


def test_round_trip_through_ours_is_lossless(hf_dir, tmp_path):
    src, model = hf_dir
    cli.main(["from-hf", str(src), str(tmp_path / "ours"), "--no_scan_layers"])
    cli.main(["to-hf", str(tmp_path / "ours"), str(tmp_path / "back")])
    back = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "back")
    theirs, ours = model.state_dict(), back.state_dict()
    assert sorted(theirs) == sorted(ours)
    for name in theirs:
        assert torch.equal(theirs[name], ours[name]), name
    written = back.config.to_dict()
    for key in ("vocab_size", "max_position_embeddings", "hidden_size", "num_hidden_layers", "num_attention_heads",
                "intermediate_size", "layer_norm_eps", "use_parallel_residual", "rope_parameters",
                "tie_word_embeddings", "hidden_act"):
        assert written[key] == model.config.to_dict()[key], key


@pytest.mark.parametrize("parallel", [True, False])
def test_to_hf_and_to_torch_logits_equal_ours(random_hf_neox, tmp_path, tokens, parallel):
    """Our checkpoint (here made from a random HF model, rotary on whole heads) -> to-hf / to-torch ->
    transformers gives our logits."""
    model = random_hf_neox(0.3, rotary_pct=1.0, parallel=parallel, seed=3, vocab_size=VOCAB)
    model.save_pretrained(tmp_path / "src")
    hf.from_hf(str(tmp_path / "src"), str(tmp_path / "ours"), step=7)
    config, _ = loading.read_config(str(tmp_path / "ours"))
    ours = forward(config, hf.restore_on_host(str(tmp_path / "ours"), config), tokens)[..., :VOCAB]

    hf.to_hf(str(tmp_path / "ours" / "checkpoints" / "7"), str(tmp_path / "hf"))
    loaded = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf").eval()
    np.testing.assert_allclose(hf_logits(loaded, tokens), ours, atol=LOGITS_ATOL, rtol=0)

    cli.main(["to-torch", str(tmp_path / "ours"), str(tmp_path / "torch" / "pytorch_model.bin")])
    state = torch.load(tmp_path / "torch" / "pytorch_model.bin", weights_only=True)
    assert state["embed_out.weight"].shape == (VOCAB, 64)
    assert not any("rotary" in name for name in state)
    loaded.config.save_pretrained(tmp_path / "torch")  # a pytorch_model.bin directory, as Pythia's were published
    from_bin = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "torch").eval()
    np.testing.assert_allclose(hf_logits(from_bin, tokens), ours, atol=LOGITS_ATOL, rtol=0)


def neox_checkpoint(model, path: Path, parallel: bool) -> None:
    """Write `model`'s weights as GPT-NeoX's pipeline checkpoint with TP tensor-parallel ranks, split as
    NeoX splits them: column-parallel on the output dim, row-parallel on the input dim, vocabulary
    rows padded to NEOX_PADDED_VOCAB and split; row-parallel biases are per rank what NeoX adds
    (a TP-th each before the all-reduce with the parallel residual, the whole bias after it without)."""
    state = {n: t.detach().clone() for n, t in model.state_dict().items()}
    layers = model.config.num_hidden_layers
    path.mkdir(parents=True)

    def save(layer, shards):
        for rank, shard in enumerate(shards):
            torch.save(shard, path / neox.NEOX_FILE.format(layer, rank))

    def vocab_split(table):
        padded = torch.nn.functional.pad(table, (0, 0, 0, NEOX_PADDED_VOCAB - VOCAB), value=3.0)
        return padded.chunk(TP, dim=0)

    save(0, [{"word_embeddings.weight": t.clone()} for t in vocab_split(state["gpt_neox.embed_in.weight"])])
    inv_freq = model.gpt_neox.rotary_emb.inv_freq
    for i in range(layers):
        prefix = f"gpt_neox.layers.{i}."
        shards = [{"attention.rotary_emb.inv_freq": inv_freq.clone()} for _ in range(TP)]
        for names, split in ((neox.COLUMN_PARALLEL, lambda t: t.chunk(TP, dim=0)),
                             (neox.ROW_PARALLEL, lambda t: t.chunk(TP, dim=1)),
                             (neox.ROW_PARALLEL_BIASES, lambda t: [t / TP if parallel else t] * TP),
                             (neox.NORMS, lambda t: [t] * TP)):
            for name in names:
                for shard, part in zip(shards, split(state[prefix + name])):
                    shard[name] = part.clone()
        save(i + 2, shards)
    save(layers + 3, [{"norm.weight": state["gpt_neox.final_layer_norm.weight"].clone(),
                       "norm.bias": state["gpt_neox.final_layer_norm.bias"].clone()} for _ in range(TP)])
    save(layers + 4, [{"final_linear.weight": t.clone()} for t in vocab_split(state["lm_head.weight"])])


@pytest.mark.parametrize("parallel", [True, False])
def test_from_neox_tensor_parallel_shards_give_transformers_logits(random_hf_neox, tmp_path, tokens, parallel):
    model = random_hf_neox(0.2, parallel=parallel, seed=4, vocab_size=VOCAB)
    neox_checkpoint(model, tmp_path / "global_step10", parallel)
    config = neox.config_from_hf(model.config.to_dict(), "test")
    tokenizer = shared_file_if_present("gpt-neox-20b-tokenizer", "20B_tokenizer.json")
    tokenizer = tokenizer and str(tokenizer)
    path = neox.from_neox(str(tmp_path / "global_step10"), str(tmp_path / "ours"), config, tokenizer=tokenizer,
                          step=10)
    assert path.endswith("checkpoints/10")
    assert_logits_equal_hf(tmp_path / "ours", model, tokens)
    recorded = loading.read_config(str(tmp_path / "ours"))[1]
    assert (recorded and load_tokenizer(recorded).sha256) == (tokenizer and load_tokenizer(tokenizer).sha256)


def test_to_hf_writes_the_recorded_20b_tokenizer(random_hf_neox, tmp_path):
    tokenizer = shared_file("gpt-neox-20b-tokenizer", "20B_tokenizer.json")
    model = random_hf_neox(0.2, seed=4, vocab_size=VOCAB)
    neox_checkpoint(model, tmp_path / "global_step1", parallel=True)
    config = neox.config_from_hf(model.config.to_dict(), "test")
    neox.from_neox(str(tmp_path / "global_step1"), str(tmp_path / "ours"), config, tokenizer=str(tokenizer))
    hf.to_hf(str(tmp_path / "ours"), str(tmp_path / "hf"))
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    from t5x_like.data import load_tokenizer

    ours = load_tokenizer(tokenizer)
    text = "Hangzhou is a beautiful city, isn't it?  Yes — 2,000 years old."
    assert theirs(text)["input_ids"] == ours.encode(text)
    assert theirs.eos_token_id == ours.eod_id == 0
    assert json.loads((tmp_path / "hf" / "config.json").read_text())["eos_token_id"] == 0


def test_from_neox_refuses_what_does_not_match(random_hf_neox, tmp_path):
    model = random_hf_neox(0.2, seed=4, vocab_size=VOCAB)
    neox_checkpoint(model, tmp_path / "ckpt", parallel=True)
    config = neox.config_from_hf(model.config.to_dict(), "test")
    with pytest.raises(UserError, match="5 layer files, but the model has 3 transformer layers"):
        neox.from_neox(str(tmp_path / "ckpt"), str(tmp_path / "out"),
                       dataclasses.replace(config, num_layers=3))
    with pytest.raises(UserError, match=r"word_embeddings.weight is \[50432, 64\], which does not fit"):
        neox.from_neox(str(tmp_path / "ckpt"), str(tmp_path / "out"),
                       dataclasses.replace(config, vocab_size=60000))
    with pytest.raises(UserError, match="no layer_00-model_00-model_states.pt"):
        neox.from_neox(str(tmp_path), str(tmp_path / "out"), config)
    with pytest.raises(UserError, match="--preset=gpt2_small is a gpt2 model.*neox_20b"):
        neox.preset_config("gpt2_small")
    assert neox.preset_config("neox_20b", scan_layers=False).num_layers == 44


def test_greedy_generation_equals_transformers_generate(random_hf_neox, tmp_path):
    model = random_hf_neox(0.3, seed=5, vocab_size=VOCAB)  # spread logits: no near-ties for argmax
    model.save_pretrained(tmp_path / "hf")
    hf.from_hf(str(tmp_path / "hf"), str(tmp_path / "ours"), scan_layers=False)
    config, _ = loading.read_config(str(tmp_path / "ours"))
    partitioner = Partitioner(make_mesh(data=4, tensor=2), "fsdp_tensor")
    params = loading.restore_sharded(str(tmp_path / "ours"), config, partitioner)
    eod, new = 0, 8
    prompts = [[464, 1748, 286], list(range(1000, 1009)), [31, 7, 1999, 2, 50, 311, 4, 8000, 9, 10, 11]]
    ours = decoding.Generator(config, params, partitioner, eod_id=eod, max_new_tokens=new,
                              settings=decoding.Sampling(temperature=0.0), batch_size=4).generate(prompts)
    for prompt, row in zip(prompts, ours):
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                 do_sample=False, max_new_tokens=new, eos_token_id=eod, pad_token_id=eod)
        assert row == decoding.cut_at(out[0, len(prompt):].numpy(), eod)
    assert len(set(map(tuple, ours))) == len(prompts) and all(len(r) == new for r in ours)


def test_one_adamw_step_matches_torch(hf_dir, tmp_path):
    """Same batch, same settings: ours (trainer.make_train_step with the default chunked loss over the
    untied head + optim.make_optimizer) vs
    torch.optim.AdamW with weight decay on every weight matrix, the two vocabulary tables included
    (GPT-NeoX's rule, which the NeoX recipes select with decay_embeddings=True), and clip_grad_norm_. Tolerance as GPT-2's test explains: entries whose gradient is within
    10 * eps of 0 (fp32 noise becomes a step of either sign) agree within 2 * lr, all others 5e-6 (0.5% of lr:
    where |g| is a few hundred eps, fp32 summation order still moves m / sqrt(v) by a little)."""
    src, model = hf_dir
    lr, weight_decay, eps = 1e-3, 2.0, 1e-8  # decay moves a weight by lr·wd·w ≈ 4e-5: above the tolerance
    hf.from_hf(str(src), str(tmp_path))
    config, _ = loading.read_config(str(tmp_path))
    params = jax.tree.map(jnp.asarray, hf.restore_on_host(str(tmp_path), config))
    batch_tokens = np.random.default_rng(5).integers(0, VOCAB, (2, 13))
    batch = {DECODER_INPUT_TOKENS: batch_tokens[:, :-1], DECODER_TARGET_TOKENS: batch_tokens[:, 1:],
             DECODER_LOSS_WEIGHTS: np.ones((2, 12), np.float32)}

    opt = optim.make_optimizer(optim.OptimizerSettings(learning_rate=lr, warmup_steps=0, decay="constant",
                               b1=0.9, b2=0.95, eps=eps, weight_decay=weight_decay, decay_embeddings=True,
                               clip_grad_norm=1.0), 10)
    state = step_fns.TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=opt.tx.init(params),
                               rng=jax.random.PRNGKey(0))
    step = jax.jit(step_fns.make_train_step(make_lm(config), opt.tx, opt.schedule, step_fns.StepConfig()))
    new_state, metrics = step(state, batch)

    torch_model = transformers.GPTNeoXForCausalLM.from_pretrained(src)
    torch_model.train()
    decayed = [p for n, p in torch_model.named_parameters() if n.endswith(".weight") and p.ndim == 2]
    others = [p for n, p in torch_model.named_parameters() if all(p is not q for q in decayed)]
    torch_opt = torch.optim.AdamW([{"params": decayed, "weight_decay": weight_decay},
                                   {"params": others, "weight_decay": 0.0}], lr=lr, betas=(0.9, 0.95), eps=eps)
    logits = torch_model(torch.tensor(batch[DECODER_INPUT_TOKENS])).logits
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB),
                                             torch.tensor(batch[DECODER_TARGET_TOKENS]).reshape(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(torch_model.parameters(), 1.0)
    torch_opt.step()

    assert float(metrics["loss"]) == pytest.approx(loss.item(), rel=1e-5)
    ours = dict(mapping.to_hf_tensors(mapping.flatten(jax.tree.map(np.asarray, new_state.params)), config,
                                      *neox.layout(config)))
    saved_name = {"lm_head.weight": "embed_out.weight"}
    theirs = {saved_name.get(n, n): p.detach().numpy() for n, p in torch_model.named_parameters()}
    grads = {saved_name.get(n, n): p.grad.numpy() for n, p in torch_model.named_parameters()}
    assert sorted(ours) == sorted(theirs)
    noisy = {n: (g != 0) & (np.abs(g) < 10 * eps) for n, g in grads.items()}
    for name in noisy:
        if name.endswith("attention.query_key_value.bias"):  # key biases: exact gradient 0, theirs is noise
            noisy[name].reshape(config.num_heads, 3, config.head_dim)[:, 1] = True
    assert sum(m.sum() for m in noisy.values()) < 0.1 * sum((g != 0).sum() for g in grads.values())
    for name, value in theirs.items():
        steady = ~noisy[name]
        np.testing.assert_allclose(ours[name][steady], value[steady], atol=5e-6, rtol=0, err_msg=name)
        np.testing.assert_allclose(ours[name][~steady], value[~steady], atol=2 * lr, rtol=0, err_msg=name)
    before = {saved_name.get(n, n): p.detach().numpy() for n, p in model.named_parameters()}
    assert max(np.abs(theirs[n] - before[n]).max() for n in theirs) > 5e-4  # the step really changed the weights


def test_hf_config_with_unsupported_settings_is_refused(hf_dir, tmp_path):
    config = dict(json.loads((hf_dir[0] / "config.json").read_text()), hidden_act="gelu_new")
    (tmp_path / "tanh").mkdir()
    (tmp_path / "tanh" / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="hidden_act='gelu_new' is not supported by our GPT-NeoX"):
        hf.from_hf(str(tmp_path / "tanh"), str(tmp_path / "out"))
