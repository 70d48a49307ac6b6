"""Mixture-of-experts runs migrate to the mixtral family: Megatron-LM's Mixtral 8x7B example script (SOURCE.md),
run as its users run it, gives through `train --print_config` its 8 experts, top-2, the 0.01 load-balancing
coefficient and its expert parallelism; each Megatron-Core MoE flag and GPT-NeoX moe_* key is mapped or listed with
its reason; a GELU / LayerNorm model with experts is refused in one line."""
import re
import shutil
from pathlib import Path

import pytest

from t5x_like.errors import UserError
from t5x_like.migration import translate, upstream
from t5x_like.migration.model import preset_fields
from tests.support.cli import run_cli
from tests.support.migration import printed_config
from tests.support.migration import megatron_flags, migrated, stand_in_tokenizer

DATA = Path(__file__).resolve().parents[2] / "data" / "upstream"
SCRIPT = "train_mixtral_8x7b_distributed.sh"



def resolved_fields(out: translate.Out) -> dict:
    """The migrated model's fields: its preset's, with the overrides migrate writes."""
    return {**preset_fields(out.value("model_config.preset")), **{k: v for k, (v, _) in out.overrides.items()}}

def bare(text: str) -> str:
    """File names without their folders (the tests' files are in tmp_path)."""
    return re.sub(r"(?<![\w.])/[^ ():]*/", "", text)


def skipped(out: translate.Out) -> str:
    return bare("\n".join(f"{what}: {reason}" for what, reason in out.skipped))


def moe(tmp_path, *flags) -> translate.Out:
    return migrated(tmp_path, megatron_flags("llama_tiny") + ["--num-experts", "4", *map(str, flags)])


@pytest.mark.system
def test_megatrons_mixtral_script_prints_its_experts_top_k_coefficient_and_expert_parallelism(tmp_path):
    """As upstream writes it (expert parallel 8, pipeline 4), and with the issue's --expert-model-parallel-size 4."""
    shutil.copy(DATA / "megatron" / SCRIPT, tmp_path)
    stand_in_tokenizer(tmp_path / "tok", 32000)
    edited = (tmp_path / SCRIPT).read_text().replace("--expert-model-parallel-size 8", "--expert-model-parallel-size 4")
    (tmp_path / "ep4.sh").write_text(edited)
    for script, ways in ((SCRIPT, 8), ("ep4.sh", 4)):
        run_cli("t5x_like.migrate", [script, f"--output={ways}.gin", "--", "ckpts", "tok", "corpus_text_document"],
                tmp_path)
        gin_text = (tmp_path / f"{ways}.gin").read_text()
        assert "model_config.preset = 'mixtral_8x7b'  # the mixtral family; upstream's shape is this preset's" \
            in gin_text, gin_text
        unknown = [line.split(" (")[0] for line in gin_text.splitlines() if "not recognised" in line and line.startswith("# --") and not line.startswith("# ----")]
        assert [line for line in unknown if "moe" in line or "expert" in line] == [], unknown
        values = printed_config(run_cli("t5x_like.train", [f"--gin_file={ways}.gin", "--print_config"],
                                        tmp_path).stdout)
        assert (values["model.family"], values["model.num_experts"], values["model.num_experts_per_token"],
                values["model.router_aux_loss_coef"]) == ("mixtral", 8, 2, 0.01), values
        assert (values["EXPERT_PARALLEL"], values["PIPELINE_PARALLEL"], values["MICRO_BATCH_SIZE"]) == (ways, 1, 1)
        assert f"--moe-token-dispatcher-type alltoall ({script}:56): XLA chooses the collectives" in gin_text
        assert f"--pipeline-model-parallel-size 4 ({script}:84): a mixture of experts is not pipelined" in gin_text


def test_megatron_core_moe_flags_set_the_expert_fields(tmp_path):
    out = moe(tmp_path, "--moe-router-topk", 1, "--moe-ffn-hidden-size", 64, "--moe-aux-loss-coeff", 0.02,
              "--moe-z-loss-coeff", 1e-3, "--moe-expert-capacity-factor", 1.25, "--moe-token-drop-policy", "position",
              "--moe-pad-expert-input-to-capacity", "--moe-router-pre-softmax", "--moe-shared-expert-intermediate-size",
              96, "--moe-shared-expert-gate", "--expert-model-parallel-size", 2, "--expert-tensor-parallel-size", 1,
              "--moe-router-load-balancing-type", "aux_loss", "--moe-router-score-function", "softmax",
              "--moe-layer-freq", 1)
    fields = resolved_fields(out)
    assert out.value("model_config.preset") == "qwen1_5_moe_a2_7b"  # a shared expert: not transformers' Mixtral
    assert {k: fields[k] for k in ("num_experts", "num_experts_per_token", "expert_mlp_dim", "router_aux_loss_coef",
                                   "router_z_loss_coef", "capacity_factor", "normalize_router_weights",
                                   "shared_expert_mlp_dim", "qkv_bias")} == dict(
        num_experts=4, num_experts_per_token=1, expert_mlp_dim=64, router_aux_loss_coef=0.02,
        router_z_loss_coef=1e-3, capacity_factor=1.25, normalize_router_weights=False, shared_expert_mlp_dim=96,
        qkv_bias=False)
    assert ("the qwen2_moe family, not mixtral: shared_expert_mlp_dim, normalize_router_weights, expert_mlp_dim as "
            "upstream has them") in "\n".join(out.notes)
    assert out.value("EXPERT_PARALLEL") == 2
    assert "moe" not in skipped(out) and "expert" not in skipped(out), skipped(out)
    assert "about num_layers / k times less here" in "\n".join(out.notes)


def test_megatron_defaults_are_dropless_top_2_renormalised_without_balancing_loss(tmp_path):
    out = moe(tmp_path)
    fields = {name: value for name, (value, _) in out.overrides.items()}
    assert fields["router_aux_loss_coef"] == 0.0 and fields["num_experts"] == 4
    assert "num_experts_per_token" not in fields and "capacity_factor" not in fields  # the preset's: 2, dropless
    assert out.value("EXPERT_PARALLEL") == 1 and "load_balancing_loss_func" not in "\n".join(out.notes)


@pytest.mark.parametrize("kind, coefficient, listed", [
    ("none", 0.0, None), ("sinkhorn", 0.01, "sinkhorn has no equivalent"),
    ("seq_aux_loss", 0.01, "seq_aux_loss has no equivalent")])
def test_load_balancing_types_map_or_are_listed(tmp_path, kind, coefficient, listed):
    out = moe(tmp_path, "--moe-aux-loss-coeff", 0.01, "--moe-router-load-balancing-type", kind)
    assert out.overrides["router_aux_loss_coef"][0] == coefficient
    if listed:
        assert f"--moe-router-load-balancing-type {kind} (args.txt:1): {listed}" in skipped(out)
        assert "balanced by the load-balancing loss over the batch" in skipped(out)


@pytest.mark.parametrize("flags, listed", [
    (["--moe-layer-freq", "2"], "--moe-layer-freq 2 (args.txt:1): every layer's MLP is a mixture of experts here"),
    (["--moe-router-score-function", "sigmoid"], "the router here takes a softmax of its logits: this model differs"),
    (["--moe-expert-capacity-factor", "1.0"], "--moe-token-drop-policy not set: probs, Megatron-LM's default: with a "
                                              "capacity factor, an expert here keeps its first assignments"),
    (["--moe-token-drop-policy", "probs", "--moe-expert-capacity-factor", "1.0"], "--moe-token-drop-policy probs ("),
    (["--moe-pad-expert-input-to-capacity"], "no --moe-expert-capacity-factor: dropless, nothing to pad"),
    (["--moe-shared-expert-intermediate-size", "64"], "without --moe-shared-expert-gate Megatron adds it ungated"),
    (["--moe-grouped-gemm"], "nothing to set: dropless routing here runs grouped matrix multiplies"),
    (["--moe-token-dispatcher-type", "allgather"], "XLA chooses the collectives that bring tokens to their experts"),
    (["--expert-tensor-parallel-size", "2"], "the experts' hidden width splits over TENSOR_PARALLEL here"),
    (["--moe-router-dtype", "fp32"], "XLA computes the router in float32"),
    (["--moe-input-jitter-eps", "0.01"], "the router's input is not jittered here"),
    (["--moe-router-enable-expert-bias"], "no auxiliary-loss-free expert bias here"),
    (["--moe-router-topk-scaling-factor", "2.5"], "the top-k weights here are not scaled"),
    (["--moe-per-layer-logging"], "logged as load_balancing_loss and router_z_loss"),
])
def test_moe_flags_without_an_equivalent_are_listed_with_the_reason(tmp_path, flags, listed):
    out = moe(tmp_path, *flags)
    assert listed in skipped(out), skipped(out)
    assert "not recognised" not in skipped(out)


def test_a_pipelined_moe_run_becomes_data_parallel(tmp_path):
    out = moe(tmp_path, "--pipeline-model-parallel-size", 2, "--expert-model-parallel-size", 2)
    assert (out.value("PIPELINE_PARALLEL"), out.value("NUM_MICROBATCHES")) == (1, None)
    assert (out.value("MICRO_BATCH_SIZE"), out.value("GRAD_ACCUM_STEPS")) == (1, None)  # accumulated as the mesh says
    assert "a mixture of experts is not pipelined here" in skipped(out)


def test_a_dense_runs_moe_flags_are_listed_as_having_no_effect(tmp_path):
    out = migrated(tmp_path, megatron_flags("llama_tiny") + ["--moe-router-topk", "2", "--moe-grouped-gemm",
                                                              "--expert-model-parallel-size", "2"])
    assert out.value("EXPERT_PARALLEL") is None and "num_experts" not in out.overrides
    for flag in ("--moe-router-topk 2 (", "--moe-grouped-gemm (", "--expert-model-parallel-size 2 ("):
        assert f"{flag}args.txt:1): no num_experts > 1: the model is dense" in skipped(out), flag


def test_a_gpt2_class_run_with_experts_is_refused_in_one_line(tmp_path):
    flags = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "2", "--seq-length", "32",
             "--max-position-embeddings", "32", "--num-experts", "8", "--micro-batch-size", "1",
             "--global-batch-size", "8", "--lr", "1e-4", "--train-iters", "10"]
    with pytest.raises(UserError) as raised:
        migrated(tmp_path, flags)
    message = bare(str(raised.value))
    assert "\n" not in message and message.startswith("args.txt:1: --num-experts 8: a mixture of experts migrates only")
    assert "--swiglu True" in message and "the gpt2 family's (GELU MLP, LayerNorm)" in message


NEOX_MOE = """{
  "moe_num_experts": 8, "moe_top_k": 2, "moe_loss_coeff": 0.02, "moe_expert_parallel_size": 2,
  "expert_interval": 1, "moe_glu": true, "moe_lbl_in_fp32": true, "enable_expert_tensor_parallelism": true,
}
"""


def neox(tmp_path: Path, extra: str, files=("llama/7B.yml", "llama/train_config.yml")) -> translate.Out:
    (tmp_path / "moe.yml").write_text(extra)
    paths = [str(DATA / "neox" / name) for name in files] + [str(tmp_path / "moe.yml")]
    read = upstream.read(paths)
    read.gpus = 8
    return translate.translate(read)


def test_neox_moe_keys_set_the_expert_fields_of_a_llama_config(tmp_path):
    out = neox(tmp_path, NEOX_MOE)
    fields = resolved_fields(out)
    # megablocks' top-k probabilities are not renormalised: not transformers' Mixtral
    assert out.value("model_config.preset") == "qwen1_5_moe_a2_7b" and out.value("EXPERT_PARALLEL") == 2
    assert (fields["num_experts"], fields["router_aux_loss_coef"], fields["normalize_router_weights"],
            fields["num_experts_per_token"], fields["capacity_factor"], fields["shared_expert_mlp_dim"],
            fields["qkv_bias"]) == (8, 0.02, False, 2, None, None, False)  # top-2, dropless megablocks
    assert "moe_lbl_in_fp32 (moe.yml:3): XLA computes the router in float32" in skipped(out)
    assert "enable_expert_tensor_parallelism" not in skipped(out) and "expert_interval" not in skipped(out)


def test_neox_defaults_and_deepspeed_moe_are_listed(tmp_path):
    out = neox(tmp_path, '{"moe_num_experts": 4, "moe_type": "deepspeed", "moe_token_dropping": true, '
                         '"moe_train_capacity_factor": 1.5, "moe_eval_capacity_factor": 2.0, "moe_jitter_eps": 0.01}')
    fields = {name: value for name, (value, _) in out.overrides.items()}
    assert (fields["num_experts_per_token"], fields["capacity_factor"], fields["router_aux_loss_coef"]) == (1, 1.5, 0.1)
    listed = skipped(out)
    for reason in ("expert_interval not set: 2, GPT-NeoX's default: every layer's MLP is a mixture of experts here",
                   "moe_min_capacity not set: 4, GPT-NeoX's default: no minimum capacity here",
                   "moe_use_residual not set: True, GPT-NeoX's default: DeepSpeed's residual MoE",
                   "moe_eval_capacity_factor 2.0 (moe.yml:1): one capacity factor here", "the router's input is not jittered here"):
        assert reason in listed, reason
    dropless = neox(tmp_path, '{"moe_num_experts": 4, "moe_train_capacity_factor": 1.5}')
    assert "capacity_factor" not in dropless.overrides
    assert "moe_train_capacity_factor 1.5 (moe.yml:1): moe_type not set: megablocks, GPT-NeoX's default: " \
        "dropless, no capacity" in skipped(dropless)
    assert "moe_glu not set: False, GPT-NeoX's default: the experts here are SwiGLU MLPs" in skipped(dropless)


PYTHIA = ("pythia/160M.yml", "pythia/pythia-paths.yml")


def test_a_neox_gelu_layernorm_model_with_experts_is_refused_and_one_expert_is_dense(tmp_path):
    with pytest.raises(UserError) as raised:
        neox(tmp_path, '{"moe_num_experts": 8}', files=PYTHIA)
    message = bare(str(raised.value))
    assert "moe.yml:1: moe_num_experts 8: a mixture of experts migrates only as the mixtral family" in message
    assert "norm rmsnorm" in message and "the neox family's (GELU MLP, LayerNorm)" in message and "\n" not in message
    dense = neox(tmp_path, '{"moe_num_experts": 1}', files=PYTHIA)
    assert "moe_num_experts 1 (moe.yml:1): no moe_num_experts > 1" in skipped(dense) and "the model is dense" in skipped(dense)


def test_the_pages_mixtral_flags_write_only_what_differs_from_the_preset(tmp_path, monkeypatch):
    """docs/migrating.md (issue 52, item 14): the expert settings go into model_config.overrides where they differ
    from the mixtral preset; its example's 8 experts and top-2 are the preset's, so they are not written again."""
    from tests.docs.doc_commands import REPO, File, read_page

    page = "docs/migrating.md"
    [flags] = [item for item in read_page(page) if isinstance(item, File) and item.name == "mixtral_flags.txt"]
    assert "in `model_config.overrides` where they differ from the mixtral preset" in \
        " ".join((REPO / page).read_text(encoding="utf-8").split())
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mixtral_flags.txt").write_text(flags.text)
    read = upstream.read(["mixtral_flags.txt"], gpus=8)
    out = translate.translate(read)
    assert out.value("model_config.preset") == "mixtral_8x7b" and out.value("EXPERT_PARALLEL") == 4
    assert {"num_experts", "num_experts_per_token"}.isdisjoint(out.overrides)
    assert out.overrides["router_aux_loss_coef"][0] == 0.01
    assert read.settings["num_experts"].value == "8" and read.settings["moe_router_topk"].value == "2"
