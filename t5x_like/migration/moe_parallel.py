"""A mixture of experts' parallelism and kernels: the experts split over the mesh axis `expert` (EXPERT_PARALLEL);
how tokens reach them (Megatron's token dispatchers, grouped GEMMs, fused permutes) is XLA's and the dropless
grouped matmuls' here; a pipeline, which the mixtral family does not have, becomes more data parallelism."""
from __future__ import annotations

from t5x_like.migration import moe
from t5x_like.migration.rows import Row, translates
from t5x_like.migration.translate import Out, provenance
from t5x_like.migration.upstream import Upstream

ROWS = (
    Row(("EXPERT_PARALLEL",), "the experts split this many ways over the mesh axis `expert` (Megatron carves it "
        "out of the data-parallel ranks; here the batch splits over it too)",
        megatron=("--expert-model-parallel-size",), neox=("moe_expert_parallel_size",)),
    Row((), "the experts' hidden width splits over TENSOR_PARALLEL, as a dense MLP's does (another size is listed)",
        megatron=("--expert-tensor-parallel-size",), neox=("enable_expert_tensor_parallelism",)),
    Row((), "nothing to set: dropless routing here runs grouped matrix multiplies (jax.lax.ragged_dot) by itself",
        megatron=("--moe-grouped-gemm", "--moe-use-legacy-grouped-gemm"), neox=("use_tutel",)),
    Row((), "XLA chooses the collectives that bring tokens to their experts (all-gather or all-to-all) from the "
        "sharding of the `expert` axis", megatron=("--moe-token-dispatcher-type", "--moe-enable-deepep",
                                                   "--moe-permute-fusion", "--moe-shared-expert-overlap")),
    Row((), "XLA computes the router in float32 and plans memory and remat by itself",
        megatron=("--moe-router-dtype", "--moe-layer-recompute"), neox=("moe_lbl_in_fp32",)),
    Row((), "one optimizer over all parameters (experts' included); the routing statistics are logged as "
        "load_balancing_loss and router_z_loss", megatron=("--moe-per-layer-logging",),
        neox=("create_moe_param_group",)),
)
NOT_PIPELINED = ("a mixture of experts is not pipelined here (its router statistics do not pass between "
                 "stages): PIPELINE_PARALLEL 1, those devices data parallel")


@translates(*ROWS)
def experts_parallel(upstream: Upstream, out: Out) -> None:
    """EXPERT_PARALLEL; without experts every setting here is listed as having no effect."""
    out.section = "mesh and batch"
    if moe.experts(upstream.settings, upstream.kind) is None:
        moe.skip_dense(upstream, out, ROWS)
        return
    ways = upstream.get("expert_model_parallel_size", "moe_expert_parallel_size")
    out.set("EXPERT_PARALLEL", 1 if ways is None else ways.number(int), provenance(ways, f"1: {out.default()}"))
    split = upstream.get("expert_tensor_parallel_size")
    if split is not None and split.number(int) != (out.value("TENSOR_PARALLEL") or 1):
        out.skip(split, "the experts' hidden width splits over TENSOR_PARALLEL here, as a dense MLP's does")
    upstream.get("enable_expert_tensor_parallelism")
    for row in ROWS[2:]:
        for key in sorted(row.keys()):
            out.skip(upstream.get(key), row.note)
    unpipelined(upstream, out)


def unpipelined(upstream: Upstream, out: Out) -> None:
    """Upstream's pipeline stages become data parallelism: with MICRO_BATCH_SIZE the accumulation follows from the
    mesh; without it (no GPU count), the pipeline's microbatches are accumulated."""
    stages = out.value("PIPELINE_PARALLEL") or 1
    if stages <= 1:
        return
    micro = next((b for b in out.bindings if b.name == "NUM_MICROBATCHES"), None)
    if micro is not None:
        out.bindings = [b for b in out.bindings if b.name not in ("NUM_MICROBATCHES", "GRAD_ACCUM_STEPS")]
        out.set("GRAD_ACCUM_STEPS", micro.value, f"{micro.why}, accumulated")
    stage_why = next(b.why for b in out.bindings if b.name == "PIPELINE_PARALLEL")
    out.set("PIPELINE_PARALLEL", 1, NOT_PIPELINED)
    out.skipped.append((stage_why, NOT_PIPELINED))
