"""The mesh and the global batch: tensor and pipeline sizes, the data-parallel and ZeRO axes, and the batch as
upstream means it (its micro batch per GPU as MICRO_BATCH_SIZE, so the accumulation follows from the devices a run
has, as upstream's from its GPUs), with Megatron's batch-size ramp-up."""
from __future__ import annotations

from t5x_like.data.rampup import BatchRampup
from t5x_like.errors import UserError
from t5x_like.migration.rows import Row, translates
from t5x_like.migration.translate import Out, provenance, shown
from t5x_like.migration.upstream import Setting, Upstream

MESH_ROWS = (
    Row(("TENSOR_PARALLEL",), megatron=("--tensor-model-parallel-size", "--model-parallel-size"),
        neox=("model_parallel_size",)),
    Row(("PIPELINE_PARALLEL", "NUM_MICROBATCHES"), "with a pipeline, the accumulation steps are its microbatches, as "
        "in DeepSpeed's pipeline engine", megatron=("--pipeline-model-parallel-size", "--pipe-parallel-size"),
        neox=("pipe_parallel_size",)),
    Row(("BATCH_SIZE",), "global, in sequences: train_batch_size, else micro batch x accumulation steps x data-"
        "parallel ways (`migrate --num_gpus=N` when the files do not say how many GPUs ran)",
        megatron=("--global-batch-size",), neox=("train_batch_size",), deepspeed=("train_batch_size",)),
    Row(("BATCH_SIZE_RAMPUP",), "(start, increment, samples), Megatron's rule step by step; every step computes "
        "BATCH_SIZE rows (those past its batch count nothing), so the ramp-up saves no compute",
        megatron=("--rampup-batch-size",)),
    Row(("MICRO_BATCH_SIZE", "GRAD_ACCUM_STEPS"), "the micro batch per GPU is MICRO_BATCH_SIZE, per data-parallel "
        "shard: the accumulation steps follow from BATCH_SIZE and the devices the run has, as upstream's from its "
        "GPUs (the accumulation steps alone, with no GPU count: GRAD_ACCUM_STEPS)",
        megatron=("--micro-batch-size", "--batch-size", "--gas"),
        neox=("train_micro_batch_size_per_gpu", "gradient_accumulation_steps"),
        deepspeed=("train_micro_batch_size_per_gpu", "gradient_accumulation_steps")),
    Row(("RULES", "DATA_PARALLEL", "FSDP_PARALLEL"), "stage 0: data parallel; 1 and 2: 'zero1' (the optimizer state "
        "sharded over FSDP_PARALLEL); 3: 'fsdp'; `_tensor` variants with tensor parallelism",
        megatron=("--use-distributed-optimizer",), neox=("zero_optimization.stage",),
        deepspeed=("zero_optimization.stage",)),
    Row(("RULES",), "'tensor_sequence' or 'fsdp_tensor_sequence'", megatron=("--sequence-parallel",)),
    Row(("build_experiment.offload_optimizer_state",), "the optimizer state in host memory (parameters stay on the "
        "devices)", neox=("zero_optimization.cpu_offload", "zero_optimization.offload_optimizer.device"),
        deepspeed=("zero_optimization.cpu_offload", "zero_optimization.offload_optimizer.device")),
)


def count(upstream: Upstream, *keys: str, default: int = 1) -> tuple[int, Setting | None]:
    setting = upstream.get(*keys)
    return (default if setting is None else setting.number(int)), setting


@translates(*MESH_ROWS)
def mesh_and_batch(upstream: Upstream, out: Out) -> None:
    out.section = "mesh and batch"
    tensor, tensor_setting = count(upstream, "tensor_model_parallel_size", "model_parallel_size")
    stages, stage_setting = count(upstream, "pipeline_model_parallel_size", "pipe_parallel_size")
    stages = max(stages, 1)  # NeoX / CPM: 0 = no pipeline engine, 1 = one stage
    out.set("TENSOR_PARALLEL", tensor, provenance(tensor_setting, f"1: {out.default()}"))
    out.set("PIPELINE_PARALLEL", stages, provenance(stage_setting, f"1: {out.default()}"))
    macro, value, why = global_batch(upstream, out, tensor * stages)
    batch_size_rampup(upstream, out)
    if macro == "MICRO_BATCH_SIZE":
        out.set(macro, value, f"{why}: per data-parallel shard; the accumulation steps (a pipeline's microbatches) "
                "follow from BATCH_SIZE and the devices the run has, as upstream derives them")
    elif stages > 1:
        out.set("NUM_MICROBATCHES", value, f"{why}: the pipeline's microbatches")
        out.set("GRAD_ACCUM_STEPS", 1, "the pipeline accumulates over its microbatches")
    else:
        out.set("GRAD_ACCUM_STEPS", value, why)
    sharding(upstream, out, tensor)


def global_batch(upstream: Upstream, out: Out, model_ways: int) -> tuple[str, int, str]:
    """BATCH_SIZE from train_batch_size, or micro x accumulation x data-parallel ways; returns how it splits:
    ('MICRO_BATCH_SIZE', rows per data-parallel GPU, why) when the micro batch is known (the accumulation then
    follows from the mesh here, as upstream's from its GPUs), else ('GRAD_ACCUM_STEPS', steps, why)."""
    total = agreed(upstream, out, "train_batch_size", "global_batch_size")
    micro = agreed(upstream, out, "train_micro_batch_size_per_gpu", "micro_batch_size", "batch_size")
    steps = agreed(upstream, out, "gradient_accumulation_steps", "gas")
    gpus = upstream.gpus
    if gpus is not None and gpus % model_ways:
        raise UserError(f"{gpus} GPUs do not divide into tensor x pipeline = {model_ways} ways; check --num_gpus.")
    ways = gpus // model_ways if gpus else None
    gpus_why = f"{gpus} GPUs / {model_ways} (tensor x pipeline)" if gpus else ""
    if total is None:
        return micro_batch_total(upstream, out, micro, steps, ways, gpus_why)
    batch = total.number(int)
    out.set("BATCH_SIZE", batch, provenance(total))
    if micro is not None:
        if ways:
            inferred_steps(batch, micro.number(int), ways)
        return "MICRO_BATCH_SIZE", micro.number(int), provenance(micro)
    if steps is not None and ways:
        return "MICRO_BATCH_SIZE", inferred_micro(batch, steps.number(int), ways), \
            f"{provenance(total)} / ({provenance(steps)} x {gpus_why})"
    accumulation = 1 if steps is None else steps.number(int)
    return "GRAD_ACCUM_STEPS", accumulation, provenance(steps, f"1: {out.default()}")


def micro_batch_total(upstream: Upstream, out: Out, micro: Setting | None, steps: Setting | None, ways: int | None,
                      gpus_why: str) -> tuple[str, int, str]:
    """BATCH_SIZE = micro batch x accumulation steps x data-parallel ways (no global batch given)."""
    if micro is None:
        raise UserError(f"{upstream.files[0]}: no batch size (train_batch_size, --global-batch-size, "
                        "train_micro_batch_size_per_gpu or --micro-batch-size / --batch-size); add one.")
    if ways is None:
        raise UserError(f"{upstream.files[0]}: the global batch is {provenance(micro)} x the accumulation steps x the "
                        "data-parallel ways, which depend on how many GPUs ran it (the files do not say): pass "
                        "--num_gpus=N (e.g. 96 for NeoX's 20B.yml, 32 for its Pythia configs).")
    accumulation = 1 if steps is None else steps.number(int)
    out.set("BATCH_SIZE", micro.number(int) * accumulation * ways,
            f"{provenance(micro)} x {accumulation} accumulation steps x {gpus_why}")
    return "MICRO_BATCH_SIZE", micro.number(int), provenance(micro)


def batch_size_rampup(upstream: Upstream, out: Out) -> None:
    """BATCH_SIZE_RAMPUP from --rampup-batch-size START INCREMENT SAMPLES, checked as training checks it."""
    setting = upstream.get("rampup_batch_size")
    if setting is None:
        return
    words = setting.value if isinstance(setting.value, list) else [setting.value]
    if len(words) != 3 or not all(str(word).isdigit() for word in words):
        raise UserError(f"{setting.where}: --rampup-batch-size {shown(setting.value)} is not three whole numbers "
                        "START INCREMENT SAMPLES (e.g. 32 32 6000000); fix the value.")
    value = tuple(int(word) for word in words)
    try:
        BatchRampup(*value, batch_size=out.value("BATCH_SIZE"))
    except UserError as e:
        raise UserError(f"{setting.where}: --rampup-batch-size {shown(setting.value)}: {e}") from None
    out.set("BATCH_SIZE_RAMPUP", value, provenance(setting))
    out.notes.append(f"{provenance(setting)}: Megatron-LM's learning-rate schedule advances by the samples each step "
                     "reads, so more slowly during the ramp-up; here it advances by steps")


def rampup_of(out: Out) -> BatchRampup | None:
    """The ramp-up BATCH_SIZE_RAMPUP sets, None without one."""
    value = out.value("BATCH_SIZE_RAMPUP")
    return None if value is None else BatchRampup(*value, batch_size=out.value("BATCH_SIZE"))


def inferred_steps(batch: int, micro: int, ways: int) -> int:
    if batch % (micro * ways):
        raise UserError(f"train_batch_size {batch} is not a multiple of micro batch {micro} x {ways} data-parallel "
                        "ways (DeepSpeed refuses it too); check --num_gpus.")
    return batch // (micro * ways)


def inferred_micro(batch: int, steps: int, ways: int) -> int:
    if batch % (steps * ways):
        raise UserError(f"train_batch_size {batch} is not a multiple of {steps} accumulation steps x {ways} "
                        "data-parallel ways (DeepSpeed refuses it too); check --num_gpus.")
    return batch // (steps * ways)


def agreed(upstream: Upstream, out: Out, *keys: str) -> Setting | None:
    """The first of `keys` given (a DeepSpeed config's before a script's), noting when the others disagree."""
    given = [upstream.settings[k] for k in keys if k in upstream.settings]
    setting = upstream.get(*keys)
    for other in given[1:]:
        if str(other.value) != str(setting.value):
            out.notes.append(f"{provenance(other)} differs from {provenance(setting)}; the latter is used, as "
                             "DeepSpeed's engine applies its config")
    return setting


def sharding(upstream: Upstream, out: Out, tensor: int) -> None:
    """RULES and the data-parallel axes from the ZeRO stage, the distributed optimizer and sequence parallelism."""
    stage_setting = upstream.get("zero_optimization.stage")
    stage = 0 if stage_setting is None else stage_setting.number(int)
    distributed = upstream.get("use_distributed_optimizer")
    if distributed is not None and distributed.flag():
        stage, stage_setting = max(stage, 1), distributed
    sequence = upstream.get("sequence_parallel")
    suffix = "_tensor" if tensor > 1 else ""
    rules = ("fsdp" + suffix) if stage >= 3 else ("zero1" + suffix) if stage >= 1 else \
        ("tensor" if tensor > 1 else "data_parallel")
    if sequence is not None and sequence.flag():
        if stage in (1, 2):
            out.skip(sequence, "no rule set combines ZeRO-1 with sequence parallelism; RULES keeps ZeRO-1")
        else:
            rules = "fsdp_tensor_sequence" if stage >= 3 else "tensor_sequence"
    why = provenance(stage_setting, f"ZeRO stage 0: {out.default()}")
    if stage == 2:
        why += " (ZeRO-2's gradient sharding is XLA's to choose; the optimizer state is sharded as ZeRO-1's)"
    out.set("RULES", rules, why)
    out.set("DATA_PARALLEL", 1 if stage else -1, "the data-parallel ways: every device left")
    out.set("FSDP_PARALLEL", -1 if stage else 1, "the ZeRO group: every device left" if stage else "no ZeRO")
    offload = upstream.get("zero_optimization.offload_optimizer.device", "zero_optimization.cpu_offload")
    if offload is not None and str(offload.value).lower() in ("cpu", "nvme", "true"):
        out.set("build_experiment.offload_optimizer_state", True, provenance(offload))
