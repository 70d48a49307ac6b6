"""Issue 46: a Hugging Face config.json whose values cannot be right is refused by `convert from-hf` in one line
that names the file, the key or the tensor, and the fix; nothing is written.

Each case edits one value of a tiny random model saved by transformers (its own config.json, 5.x keys: rotary
settings in rope_parameters) and imports it. Before issue 46, 19 of these were accepted (a checkpoint written that
no reader could use, or that held other weights than the file said: a vocabulary table cut or padded to the wrong
size, rope_theta negative) and 11 ended in a traceback (docs/testing.md has the table).
"""
import json
import os
import shutil

import pytest

transformers = pytest.importorskip("transformers")
torch = pytest.importorskip("torch")

from t5x_like.convert import hf  # noqa: E402
from t5x_like.errors import UserError  # noqa: E402
from tests.support import hf_models  # noqa: E402
from tests.support.hf_moe import random_moe  # noqa: E402


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> dict[str, str]:
    """{family: a folder with config.json and model.safetensors of a tiny random model}."""
    root = tmp_path_factory.mktemp("hf")
    torch.manual_seed(0)
    models = {
        "llama": hf_models.random_model("llama"),
        "gpt2": transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=300, n_positions=32, n_embd=16, n_layer=2, n_head=2)),
        "neox": transformers.GPTNeoXForCausalLM(transformers.GPTNeoXConfig(
            vocab_size=300, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
            max_position_embeddings=32, rotary_pct=0.5)),
        "t5": hf_models.random_hf_model("v1.1"),
        "bert": transformers.BertForMaskedLM(transformers.BertConfig(
            vocab_size=300, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
            max_position_embeddings=32)),
        "qwen2": hf_models.random_model("qwen2"),
        "qwen3": transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**hf_models.SHAPE, head_dim=16)),
        "qwen2_moe": random_moe("qwen2_moe"),
    }
    for name, model in models.items():
        model.save_pretrained(str(root / name))
    return {name: str(root / name) for name in models}


def rope(**values):
    return {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, **values}}


LLAMA3 = dict(rope_type="llama3", rope_theta=5e5, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
              original_max_position_embeddings=32)

CASES = [  # family, config.json changes (None removes the key), what the error line must say
    ("llama", {"num_attention_heads": 3}, "head_dim=16, hidden_size=64, num_attention_heads=3"),
    ("llama", {"num_attention_heads": 0}, "num_attention_heads=0 must be a positive integer"),
    ("llama", {"num_attention_heads": "4"}, "num_attention_heads='4' must be a positive integer"),
    ("llama", {"num_key_value_heads": 3}, "num_kv_heads 3 does not divide num_heads 4"),
    ("llama", {"num_key_value_heads": 8}, "num_kv_heads 8 does not divide num_heads 4"),
    ("llama", {"vocab_size": 999}, "tensor 'model.embed_tokens.weight' has shape (1000, 64)"),
    ("llama", {"vocab_size": 2000}, "tensor 'model.embed_tokens.weight' has shape (1000, 64)"),
    ("llama", {"vocab_size": 1000.5}, "vocab_size 1000.5 must be a positive integer"),
    ("llama", {"hidden_size": 32}, "head_dim=16, hidden_size=32"),
    ("llama", {"head_dim": 32}, "head_dim=32, hidden_size=64"),
    ("llama", {"num_hidden_layers": 3}, "config.json gives 3 blocks but the weights hold 2"),
    ("llama", {"num_hidden_layers": 1}, "config.json gives 1 blocks but the weights hold 2"),
    ("llama", {"intermediate_size": 90}, "tensor 'model.layers.0.mlp.gate_proj.weight' has shape (88, 64)"),
    ("llama", {"max_position_embeddings": 0}, "max_len 0 must be a positive integer"),
    ("llama", {"rms_norm_eps": -1.0}, "layer_norm_eps -1.0 must be a positive number"),
    ("llama", rope(rope_theta=-1.0), "rope_theta -1.0 must be a positive number"),
    ("llama", rope(rope_theta="abc"), "rope_theta 'abc' must be a positive number"),
    ("llama", {"rope_parameters": None, "rope_theta": 0.0}, "rope_theta 0.0 must be a positive number"),
    ("llama", rope(rope_type="dynamic", factor=2.0), "rope_type='dynamic' is not supported"),
    ("llama", {"rope_parameters": None, "rope_scaling": {"type": "linear", "factor": 2.0}},
     "rope_type='linear' is not supported"),
    ("llama", rope(rope_type="llama3", factor=8.0), "KeyError: 'low_freq_factor'"),
    ("llama", {"rope_parameters": {**LLAMA3, "factor": 0.0}}, "rope_scaling_factor 0.0 must be a positive number"),
    ("llama", {"rope_parameters": {**LLAMA3, "low_freq_factor": 4.0, "high_freq_factor": 1.0}},
     "need factor >= 1 and high > low > 0"),
    ("llama", {"rope_parameters": {**LLAMA3, "original_max_position_embeddings": -32}},
     "rope_original_max_len -32 must be a positive integer"),
    ("llama", {"rope_parameters": None, "rope_scaling": {"factor": 8.0}}, "rope_scaling={'factor': 8.0} names no "
                                                                          "rope_type"),
    # issue 52: config.json switches off a part the weights hold (it would be dropped): refused, naming the tensors
    ("qwen2_moe", {"shared_expert_intermediate_size": 0}, "the weights hold 8 tensor(s) the model it describes has "
                                                          "no place for ('model.layers.0.mlp.shared_expert.down_proj"),
    ("qwen2", {"model_type": "llama", "architectures": ["LlamaForCausalLM"]},
     "the weights hold 6 tensor(s) the model it describes has no place for ('model.layers.0.self_attn.k_proj.bias'"),
    ("qwen3", {"model_type": "llama", "architectures": ["LlamaForCausalLM"]},
     "the weights hold 4 tensor(s) the model it describes has no place for ('model.layers.0.self_attn.k_norm.weight'"),
    ("gpt2", {"n_head": 3}, "embed_dim 16 is not divisible by num_heads 3"),
    ("gpt2", {"n_positions": 16}, "tensor 'transformer.wpe.weight' has shape (32, 16)"),
    ("gpt2", {"n_positions": 64}, "tensor 'transformer.wpe.weight' has shape (32, 16)"),
    ("gpt2", {"vocab_size": 301}, "tensor 'transformer.wte.weight' has shape (300, 16)"),
    ("gpt2", {"n_embd": 32}, "tensor 'transformer.wte.weight' has shape (300, 16)"),
    ("gpt2", {"n_layer": 3}, "config.json gives 3 blocks but the weights hold 2"),
    ("gpt2", {"layer_norm_epsilon": -1}, "layer_norm_eps -1 must be a positive number"),
    ("neox", rope(partial_rotary_factor=2.0), "rotary_pct 2.0 gives 16 rotary dims of a 8-dim head"),
    ("neox", rope(partial_rotary_factor=0.0), "rotary_pct 0.0 gives 0 rotary dims"),
    ("neox", rope(partial_rotary_factor=0.5, rope_theta=0), "rotary_base 0 must be a positive number"),
    ("neox", {"num_attention_heads": 3}, "embed_dim 16 is not divisible by num_heads 3"),
    ("neox", {"vocab_size": 100}, "tensor 'gpt_neox.embed_in.weight' has shape (300, 16)"),
    ("t5", {"num_heads": 4}, "tensor 'encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight'"),
    ("t5", {"d_kv": 8}, "tensor 'encoder.block.0.layer.0.SelfAttention.q.weight' has shape (21, 24)"),
    ("t5", {"relative_attention_num_buckets": 16}, "relative_attention_bias.weight' has shape (8, 3)"),
    ("t5", {"num_decoder_layers": 2}, "config.json gives 2 blocks but the weights hold 3"),
    ("t5", {"vocab_size": 100}, "tensor 'shared.weight' has shape (200, 24)"),
    ("bert", {"type_vocab_size": 5}, "tensor 'bert.embeddings.token_type_embeddings.weight' has shape (2, 16)"),
    ("bert", {"num_attention_heads": 3}, "embed_dim 16 is not divisible by num_heads 3"),
    ("bert", {"max_position_embeddings": 64}, "tensor 'bert.embeddings.position_embeddings.weight' has shape (32, 16)"),
    ("bert", {"vocab_size": 100}, "tensor 'bert.embeddings.word_embeddings.weight' has shape (300, 16)"),
]


def edited_copy(source: str, folder: str, changes: dict) -> str:
    shutil.copytree(source, folder)
    path = os.path.join(folder, "config.json")
    with open(path) as f:
        config = json.load(f)
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    with open(path, "w") as f:
        json.dump(config, f)
    return folder


@pytest.mark.parametrize("family, changes, says", CASES, ids=[f"{f}-{json.dumps(c)[:70]}" for f, c, _ in CASES])
def test_a_config_json_that_cannot_be_right_is_one_line_and_writes_nothing(saved, tmp_path, family, changes, says):
    src = edited_copy(saved[family], str(tmp_path / "model"), changes)
    dst = str(tmp_path / "imported")
    with pytest.raises(UserError) as error:
        hf.from_hf(src, dst)
    line = str(error.value)
    assert "\n" not in line and line.startswith(src) and says in line, line
    assert "config.json" in line and ("repair" in line or "not supported" in line), line
    assert not os.path.exists(dst)


@pytest.mark.parametrize("family", sorted({family for family, _, _ in CASES}))
def test_the_unedited_models_import(saved, tmp_path, family, capfd):
    """The cases' models themselves import: each refusal above is the edited value's. Saved without a tokenizer,
    each import says at once that it records none (issue 52: generate used to ask for --tokenizer only later)."""
    assert os.path.isdir(hf.from_hf(saved[family], str(tmp_path / "imported")))
    assert f"note: {saved[family]} has no tokenizer files (tokenizer.json, vocab.json, merges.txt), so the " \
           "checkpoint records none: generate and eval will need --tokenizer=PATH" in capfd.readouterr().err


def state_dict_folder(folder, model, state: dict) -> str:
    """A Hugging Face folder as older transformers (or a base model) saved it: config.json + pytorch_model.bin."""
    os.makedirs(folder)
    model.config.to_json_file(os.path.join(folder, "config.json"))
    torch.save(state, os.path.join(folder, "pytorch_model.bin"))
    return str(folder)


def test_a_tied_copy_that_differs_from_what_it_shares_is_refused(tmp_path):
    """config.json ties GPT-2's head to wte, and the weights hold another lm_head.weight: refused, not dropped."""
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=300, n_positions=32, n_embd=16, n_layer=2,
                                                                 n_head=2))
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    state["lm_head.weight"] = state["lm_head.weight"] + 1.0
    src = state_dict_folder(tmp_path / "hf", model, state)
    with pytest.raises(UserError, match=r"ties 'lm_head.weight' to another tensor, but the weights hold a different"):
        hf.from_hf(src, str(tmp_path / "ours"))
    assert not (tmp_path / "ours").exists()


def test_a_base_model_checkpoint_with_older_buffers_imports(tmp_path):
    """The Hub's `gpt2` is a GPT2Model's state_dict (no `transformer.` prefix) with the causal-mask buffers older
    transformers saved: it imports as the same weights under the language model's names."""
    import numpy as np

    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(vocab_size=300, n_positions=32, n_embd=16, n_layer=2,
                                                                 n_head=2))
    base = {name.removeprefix("transformer."): t for name, t in model.state_dict().items() if name != "lm_head.weight"}
    for layer in range(2):
        base[f"h.{layer}.attn.bias"] = torch.tril(torch.ones(1, 1, 32, 32))
        base[f"h.{layer}.attn.masked_bias"] = torch.tensor(-1e4)
    model.save_pretrained(tmp_path / "lm")
    state_dict_folder(tmp_path / "base", model, base)
    import jax

    from t5x_like.inference import loading

    imported = [hf.from_hf(str(tmp_path / name), str(tmp_path / f"ours-{name}")) for name in ("lm", "base")]
    params = [hf.restore_on_host(path, loading.read_config(path)[0]) for path in imported]
    jax.tree.map(np.testing.assert_array_equal, *params)


def test_bert_pretraining_parts_a_masked_lm_has_no_place_for_are_named(tmp_path, capfd):
    """BertForPreTraining's pooler and next-sentence head are left out with a note (a masked-LM model has none)."""
    torch.manual_seed(0)
    transformers.BertForPreTraining(transformers.BertConfig(
        vocab_size=300, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
        max_position_embeddings=32)).save_pretrained(tmp_path / "hf")
    hf.from_hf(str(tmp_path / "hf"), str(tmp_path / "ours"))
    notes = capfd.readouterr().err
    assert "note: left out 2 tensor(s) ('bert.pooler.dense.bias', ...): the pretraining pooler" in notes, notes
    assert "note: left out 2 tensor(s) ('cls.seq_relationship.bias', ...): the next-sentence head" in notes, notes
