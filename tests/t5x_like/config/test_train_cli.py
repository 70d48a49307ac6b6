"""The train CLI's configuration side: --print_config, the operative config, --help's macros,
merged overrides, the vocabulary from the tokenizer, RESTORE_FROM's architecture, gin quoting."""
import dataclasses
import re
import subprocess
import sys

import gin
import numpy as np
import pytest

from models.gpt2 import GPT2Config
from t5x_like import experiment
from t5x_like.config import configurables, describe, frontend
from t5x_like.data.token_file import TokenFileWriter, token_dtype
from t5x_like.errors import UserError
from t5x_like.run import directory, loop
from tests.support.cli import REPO
from tests.support.environment import cpu_env

ENV = cpu_env(2)


def cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "t5x_like.train", *args], cwd=REPO, env=ENV,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


@pytest.mark.system
def test_print_config_shows_defaults_and_the_model_and_leaves_model_dir_untouched(tmp_path):
    model_dir = tmp_path / "run"
    done = cli("--gin_file=quickstart.gin", f"--gin.MODEL_DIR='{model_dir}'", "--gin.BATCH_SIZE=8",
               "--gin.model_config.overrides={'dropout_rate': 0.05}", "--print_config")
    assert done.returncode == 0, done.stderr[-3000:]
    out = done.stdout
    for line in ("BATCH_SIZE = 8", "make_optimizer.weight_decay = 0.1", "make_optimizer.b1 = 0.9",
                 "make_optimizer.b2 = 0.95", "make_optimizer.clip_grad_norm = 1.0", "build_experiment.z_loss = 0.0",
                 "LossScaleConfig.window = 1000", "make_source.data_split = %DATA_SPLIT",
                 "# Model: gpt2: 4 layers, width 256, 4 heads x 64, mlp 1024, vocab 8192",
                 "#     dropout_rate = 0.05", "#     attention_dropout_rate = 0.0"):
        assert line in out, line
    # 4 blocks of 12·256² + 13·256 weights, 8192 + 256 embedding rows, the final norm.
    assert f"#   {4 * (12 * 256 * 256 + 13 * 256) + (8192 + 256) * 256 + 2 * 256:,} parameters" in out
    assert not model_dir.exists()


@pytest.mark.system
def test_print_config_needs_no_model_dir_and_training_still_does(tmp_path):
    """From an empty folder, as a user first tries a run file: --print_config without MODEL_DIR prints the settings,
    the model and the schedule (WARMUP_STEPS as a fraction resolved to steps) and writes nothing; the same command
    without --print_config stops on the missing MODEL_DIR."""
    command = [sys.executable, "-m", "t5x_like.train", "--gin_file=quickstart.gin", "--gin.TRAIN_STEPS=1000",
               "--gin.WARMUP_STEPS=0.1", "--gin.LEARNING_RATE=6e-4"]
    shown = subprocess.run([*command, "--print_config"], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                           timeout=300)
    assert shown.returncode == 0, shown.stderr[-3000:]
    lines = shown.stdout.splitlines()
    assert "MODEL_DIR = None" in lines
    assert "#   MODEL_DIR unset: training needs it (--gin.MODEL_DIR=\"'runs/NAME'\")" in lines
    assert lines[-1] == ("# Schedule: warmup 100 steps (WARMUP_STEPS = 0.1 of 1000), cosine decay to step 1000, floor "
                         "6e-05 (min_learning_rate_ratio 0.1 x LEARNING_RATE; min_learning_rate unset)")
    trained = subprocess.run(command, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=300)
    assert trained.returncode == 1
    assert trained.stderr.strip().splitlines()[-1].startswith("error: MODEL_DIR is required: pass --gin.MODEL_DIR=")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.system
def test_a_mesh_larger_than_the_one_cpu_device_says_how_to_simulate_devices(tmp_path):
    """`--gin.TENSOR_PARALLEL=2` on a CPU with one device (no XLA_FLAGS): one line naming the setting, the device
    count it needs and the XLA_FLAGS that simulates them; nothing written."""
    env = {k: v for k, v in ENV.items() if k != "XLA_FLAGS"}
    done = subprocess.run([sys.executable, "-m", "t5x_like.train", "--gin_file=quickstart.gin",
                           "--gin.MODEL_DIR='runs/tp'", "--gin.TENSOR_PARALLEL=2"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.strip().splitlines()[-1] == (
        "error: TENSOR_PARALLEL=2: the mesh needs 2 devices, but only 1 is present; to run it on this CPU, simulate "
        "2 devices: start the command with XLA_FLAGS=--xla_force_host_platform_device_count=2 (or lower those sizes).")
    assert list(tmp_path.iterdir()) == []


def test_print_config_without_model_dir_describes_the_run(clean_gin):
    """train.py's parse (MODEL_DIR may stay unset under --print_config): the description says training needs it and
    reads no checkpoint; an unset MODEL_DIR is still an error for training (run/test_loop.py)."""
    settings = frontend.parse_gin(["quickstart.gin"], ["TRAIN_STEPS=1000",
                                                     "optim.make_optimizer.min_learning_rate=1e-5"], [],
                                  printing=True)
    text = describe.describe_run(settings)
    assert "MODEL_DIR = None" in text and "#   MODEL_DIR unset: training needs it" in text
    assert "floor 1e-05 (min_learning_rate, absolute; min_learning_rate_ratio is ignored)" in text
    gin.clear_config()
    frontend.parse_gin(["quickstart.gin"], ["MODEL_DIR='runs/given'"], [], printing=True)
    assert gin.query_parameter("%MODEL_DIR") == "runs/given"


@pytest.mark.system
def test_help_lists_the_macros_with_defaults_and_comments():
    done = cli("--help", timeout=120)
    assert "--[no]print_config" in done.stdout
    assert "DATA_SPLIT" in done.stdout and "'949,50,1'" in done.stdout
    assert "train,validation,test proportions by document" in done.stdout
    assert re.search(r"^\s*MODEL_DIR\s+required", done.stdout, re.M)


@pytest.mark.system
def test_an_unquoted_string_is_one_line_naming_the_quoting(tmp_path):
    done = cli("--gin_file=quickstart.gin", f"--gin.MODEL_DIR='{tmp_path}'", "--gin.RULES=fsdp", "--print_config")
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: --gin.RULES=fsdp") and "--gin.RULES=\"'fsdp'\"" in last
    assert "Traceback" not in done.stderr and "USAGE" not in done.stderr


@pytest.mark.parametrize("binding, hint", [
    ("MODEL_DIR=/x/y", "--gin.MODEL_DIR=\"'/x/y'\""),
    ("RULES = fsdp", "--gin.RULES=\"'fsdp'\""),
    ("model_config.remat_policy=full", "--gin.model_config.remat_policy=\"'full'\""),
])
def test_unquoted_strings_say_how_to_quote(clean_gin, binding, hint):
    with pytest.raises(UserError, match=hint.replace('"', '.').replace("'", ".")):
        frontend.parse_gin(["quickstart.gin"], ["MODEL_DIR='/tmp/x'", binding], [])


def test_quoted_values_references_and_numbers_parse(clean_gin):
    frontend.parse_gin(["quickstart.gin"], ["MODEL_DIR='/tmp/x'", "RULES='fsdp'", "LEARNING_RATE=1e-3",
                                         "DATA_SPLIT=\"98,2,0\"", "build_experiment.loss_scale=@trainer.LossScaleConfig()"], [])
    assert gin.query_parameter("%RULES") == "fsdp" and gin.query_parameter("%LEARNING_RATE") == 1e-3


def test_an_unknown_parameter_is_a_user_error(clean_gin):
    with pytest.raises(UserError, match="--gin.train.lr=0.1: Configurable 'train' doesn't have a parameter named 'lr'"):
        frontend.parse_gin(["quickstart.gin"], ["MODEL_DIR='/tmp/x'", "train.lr=0.1"], [])


def test_unknown_macro_is_a_user_error(clean_gin):
    with pytest.raises(UserError, match="no gin file defines the macro BACTH_SIZE"):
        frontend.parse_gin(["quickstart.gin"], ["BACTH_SIZE = 4", "MODEL_DIR = '/tmp/x'"], [])


def test_command_line_overrides_merge_with_the_files(clean_gin):
    frontend.parse_gin(["quickstart.gin"], ["MODEL_DIR='/tmp/x'", "model_config.overrides={'dropout_rate': 0.05}",
                                         "model_config.overrides={'mlp_dim': 512}"], [])
    assert gin.query_parameter("model_config.overrides") == {
        "dropout_rate": 0.05, "attention_dropout_rate": 0.0, "mlp_dim": 512}
    config = configurables.model_config()
    assert (config.dropout_rate, config.attention_dropout_rate, config.mlp_dim) == (0.05, 0.0, 512)
    with gin.unlock_config():
        frontend.apply_bindings(["model_config.overrides=None"])  # None clears them
    assert gin.query_parameter("model_config.overrides") is None


def test_the_tiny_model_takes_the_corpus_tokenizers_vocabulary(clean_gin, tmp_path):
    prefix = str(tmp_path / "neox")
    made_with = {"path": "20B_tokenizer.json", "sha256": "0" * 64, "vocab_size": 50277, "eod_id": 0}
    with TokenFileWriter(prefix, token_dtype(50277), {"tokenizer": made_with}) as writer:
        writer.write(np.tile(np.arange(50000, 50277), 40), np.full(40, 277))
    settings = frontend.parse_gin(["quickstart.gin"], [f"MODEL_DIR='{tmp_path / 'run'}'", f"DATA_PATH='{prefix}'"], [])
    assert configurables.model_config().vocab_size == 50277
    assert "vocab 50277 (padded to 50304)" in describe.describe_run(settings)


def test_operative_config_is_written_to_model_dir(clean_gin, tmp_path):
    settings = frontend.parse_gin(["quickstart.gin"],
                                  [f"MODEL_DIR='{tmp_path}'", "optim.make_optimizer.weight_decay=0.01"], [])
    directory.write_config(str(tmp_path), 0, settings.config_text, settings.operative_config)
    assert (tmp_path / "config.gin").read_text() == gin.config_str()
    text = (tmp_path / "operative_config.gin").read_text()
    assert "make_optimizer.weight_decay = 0.01" in text and "make_optimizer.b2 = 0.95" in text
    gin.clear_config()
    gin.parse_config(text)  # it is gin: a run can be repeated from it
    assert gin.query_parameter("make_optimizer.weight_decay") == 0.01


SMALL = GPT2Config(vocab_size=256, max_len=16, num_layers=2, num_heads=4, embed_dim=32, mlp_dim=64, dtype="float32")


def test_restore_from_takes_the_checkpoints_architecture():
    run = dataclasses.replace(SMALL, num_layers=4, embed_dim=64, dropout_rate=0.0, dtype="bfloat16")
    config = experiment.resolve_model_config(run, 1, experiment.Restored(SMALL, adopt_architecture=True))
    assert (config.num_layers, config.embed_dim) == (2, 32)
    assert (config.dropout_rate, config.dtype) == (0.0, "bfloat16")  # the run's own choices stay


def test_resuming_a_different_model_names_the_gin_line_to_add():
    run = dataclasses.replace(SMALL, num_layers=4)
    with pytest.raises(UserError, match=r"--gin.model_config.overrides=\"\{'num_layers': 2\}\""):
        experiment.resolve_model_config(run, 1, experiment.Restored(SMALL))


def test_a_user_error_inside_a_gin_call_reads_as_the_message_alone(clean_gin, tmp_path):
    with pytest.raises(UserError) as raised:
        frontend.plain_user_errors(frontend.parse_gin)(
            ["quickstart.gin"], [f"MODEL_DIR='{tmp_path}'", "model_config.overrides={'num_heads': 5}"], [])
    assert str(raised.value) == (
        "model_config (preset 'gpt2_tiny', overrides {'dropout_rate': 0.0, 'attention_dropout_rate': 0.0, "
        "'num_heads': 5}): embed_dim 256 is not divisible by num_heads 5; choose a head count that divides the width.")


def test_print_config_of_a_mesh_larger_than_this_machine_still_describes_the_model(clean_gin, tmp_path):
    settings = frontend.parse_gin(["quickstart.gin"],
                                  [f"MODEL_DIR='{tmp_path / 'run'}'", "FSDP_PARALLEL=16", "TENSOR_PARALLEL=2"], [])
    assert (settings.experiment.mesh.fsdp, settings.experiment.mesh.tensor) == (16, 2)
    text = describe.describe_run(settings)
    assert ("#   mesh not checked on this machine's 8 devices (FSDP_PARALLEL=16 TENSOR_PARALLEL=2: the mesh needs 32 "
            "devices, but only 8 are present; to run it on this CPU, simulate 32 devices") in text
    assert "vocab 8192 (padded to 8192)" in text and "5,322,240 parameters" in text
    assert "make_mesh.fsdp = %FSDP_PARALLEL" in text and "FSDP_PARALLEL = 16" in text


def test_finetuning_a_from_hf_import_takes_its_architecture(clean_gin, tmp_path, random_hf_gpt2):
    import jax

    from t5x_like.checkpoint import store
    from t5x_like.convert import hf

    random_hf_gpt2(0.1).save_pretrained(tmp_path / "hf")  # 2 layers, width 36, 50257 ids, 40 positions
    hf.from_hf(str(tmp_path / "hf"), str(tmp_path / "imported"))
    settings = frontend.parse_gin(["quickstart.gin"], [
        f"MODEL_DIR='{tmp_path / 'finetune'}'", f"RESTORE_FROM='{tmp_path / 'imported'}'", "TRAIN_STEPS=0",
        "SEQ_LEN=16", "BATCH_SIZE=8", "optim.make_optimizer.decay='constant'"], [])
    assert "#     num_layers = 2" in describe.describe_run(settings)
    assert loop.train(settings).step == 0
    saved = store.read_model_info(str(tmp_path / "finetune"))["config"]
    assert (saved["num_layers"], saved["embed_dim"], saved["vocab_size"], saved["max_len"]) == (2, 36, 50257, 40)
    assert (saved["dropout_rate"], saved["dtype"]) == (0.0, "float32")  # quickstart's own choices
    got = jax.device_get(store.restore_params(str(tmp_path / "finetune"), None))
    want = jax.device_get(store.restore_params(str(tmp_path / "imported"), None))
    jax.tree.map(np.testing.assert_array_equal, got, want)
    # extended with the same command and more steps: MODEL_DIR's checkpoint wins, with the model it records
    gin.clear_config()
    settings = frontend.parse_gin(["quickstart.gin"], [
        f"MODEL_DIR='{tmp_path / 'finetune'}'", f"RESTORE_FROM='{tmp_path / 'imported'}'", "TRAIN_STEPS=2",
        "SEQ_LEN=16", "BATCH_SIZE=8", "optim.make_optimizer.decay='constant'"], [])
    described = describe.describe_run(settings)
    assert "#     embed_dim = 36" in described and f"#   resumes from {tmp_path / 'finetune'}" in described
    assert loop.train(settings).step == 2
    assert "TRAIN_STEPS = 2" in (tmp_path / "finetune" / "config.gin").read_text()
    assert store.read_model_info(str(tmp_path / "finetune"))["config"] == saved


@pytest.fixture(scope="module")
def qwen2_moe_import(tmp_path_factory):
    """A from-hf import of a tiny random Qwen2-MoE (shared expert) with the builtin corpus's 8192 ids."""
    transformers = pytest.importorskip("transformers", reason="needs the torch extra (torch, transformers)")
    from t5x_like.convert import hf

    folder = tmp_path_factory.mktemp("qwen2_moe")
    transformers.set_seed(0)
    transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig(
        vocab_size=8192, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)).save_pretrained(folder / "hf")
    hf.from_hf(str(folder / "hf"), str(folder / "imported"))
    return folder / "imported"


def test_restore_from_an_import_of_another_family_brings_its_model(clean_gin, tmp_path, qwen2_moe_import):
    """Continuing a Qwen2-MoE import with the Llama quickstart: the checkpoint brings its model (family included),
    the run file its settings (as from_pretrained); the parameters start as the import's."""
    import jax

    from t5x_like.checkpoint import store

    settings = frontend.parse_gin(["quickstart_llama.gin"], [
        f"MODEL_DIR='{tmp_path / 'run'}'", f"RESTORE_FROM='{qwen2_moe_import}'", "TRAIN_STEPS=0", "SEQ_LEN=16",
        "optim.make_optimizer.decay='constant'"], [])
    assert "# Model: qwen2_moe: 2 layers, width 32" in describe.describe_run(settings)
    assert loop.train(settings).step == 0
    saved = store.read_model_info(str(tmp_path / "run"))["config"]
    assert (saved["family"], saved["num_experts"], saved["shared_expert_mlp_dim"]) == ("qwen2_moe", 4, 32)
    assert (saved["dtype"], saved["dropout_rate"]) == ("float32", 0.0)  # quickstart_llama's own choices
    got = jax.device_get(store.restore_params(str(tmp_path / "run"), None))
    jax.tree.map(np.testing.assert_array_equal, got, jax.device_get(store.restore_params(str(qwen2_moe_import), None)))


@pytest.mark.parametrize("files, bindings, message", [
    (["quickstart_llama.gin", "models/qwen3_moe_tiny.gin"], [], "the command line chooses a 'qwen3_moe' one"),
    (["quickstart_llama.gin"], ["model_config.preset='qwen3_tiny'"], "the command line chooses a 'qwen3' one"),
    (["quickstart_t5.gin"], [], "'qwen2_moe' model (decoder-only), which this run file's encoder-decoder settings"),
], ids=["a model file after the run file", "a preset binding", "another kind of model"])
def test_restore_from_refuses_an_explicit_model_or_another_kind(clean_gin, tmp_path, qwen2_moe_import, files,
                                                                bindings, message):
    settings = frontend.parse_gin(files, [f"RESTORE_FROM='{qwen2_moe_import}'", *bindings], [],
                                  printing=True)
    with pytest.raises(UserError, match=re.escape(message)):
        describe.describe_run(settings)


def test_the_extra_gin_file_of_the_environment_has_the_last_word(clean_gin, tmp_path, monkeypatch):
    """T5X_LIKE_EXTRA_GIN (docs/configure.md): parsed after --gin_file and --gin.NAME=VALUE, its overrides merged."""
    extra = tmp_path / "last.gin"
    extra.write_text("TRAIN_STEPS = 2\nmodel_config.overrides = {'mlp_dim': 64}\n")
    monkeypatch.setenv(frontend.EXTRA_GIN_ENV, str(extra))
    frontend.parse_gin(["quickstart.gin"], ["MODEL_DIR='/tmp/x'", "TRAIN_STEPS=500",
                                         "model_config.overrides={'dropout_rate': 0.05}"], [])
    assert gin.query_parameter("%TRAIN_STEPS") == 2
    assert gin.query_parameter("model_config.overrides") == {
        "dropout_rate": 0.05, "attention_dropout_rate": 0.0, "mlp_dim": 64}
    gin.clear_config()
    monkeypatch.setenv(frontend.EXTRA_GIN_ENV, str(tmp_path / "missing.gin"))
    with pytest.raises(UserError, match=f"{frontend.EXTRA_GIN_ENV}=.*missing.gin: no such file"):
        frontend.parse_gin(["quickstart.gin"], ["MODEL_DIR='/tmp/x'"], [])
