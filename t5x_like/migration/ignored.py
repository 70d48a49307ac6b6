"""Upstream settings with no equivalent here, and why: each is listed in the migrated gin file (never dropped
silently) and in docs/migrating.md's tables."""
from __future__ import annotations

from t5x_like.migration.rows import Row, translates
from t5x_like.migration.translate import Out
from t5x_like.migration.upstream import Upstream

FUSIONS = ("scaled_upper_triang_masked_softmax_fusion", "scaled_masked_softmax_fusion", "bias_gelu_fusion",
           "bias_dropout_fusion", "masked_softmax_fusion", "rope_fusion", "layernorm_fusion",
           "gradient_accumulation_fusion", "apply_query_key_layer_scaling", "attention_softmax_in_fp32")
MEGATRON_CORE_KERNELS = ("--use-mcore-models", "--transformer-impl", "--attention-backend", "--use-flash-attn",
                         "--no-masked-softmax-fusion", "--no-bias-gelu-fusion", "--no-bias-swiglu-fusion",
                         "--no-bias-dropout-fusion", "--no-rope-fusion", "--no-gradient-accumulation-fusion",
                         "--cross-entropy-loss-fusion")
"""Megatron-Core's choices among its own implementations and fused kernels."""
IGNORED = (
    Row((), "XLA compiles and fuses the kernels (ATTENTION picks the attention kernel)",
        megatron=tuple(f"--{name.replace('_', '-')}" for name in FUSIONS) + ("--fp16-lm-cross-entropy",)
        + MEGATRON_CORE_KERNELS,
        neox=FUSIONS + ("attention_config",)),
    Row((), "XLA chooses the collectives; the mesh comes from the *_PARALLEL macros",
        megatron=("--distributed-backend", "--local_rank", "--DDP-impl", "--use-cpu-initialization"),
        neox=("distributed_backend",)),
    Row((), "token files are read as Megatron's mmap .bin/.idx whatever this says", megatron=("--data-impl",),
        neox=("data_impl",)),
    Row((), "communication buckets and their overlap are XLA's to choose", neox=(
        "zero_optimization.allgather_partitions", "zero_optimization.allgather_bucket_size",
        "zero_optimization.overlap_comm", "zero_optimization.reduce_scatter", "zero_optimization.reduce_bucket_size",
        "zero_optimization.contiguous_gradients"), deepspeed=(
        "zero_optimization.allgather_partitions", "zero_optimization.allgather_bucket_size",
        "zero_optimization.overlap_comm", "zero_optimization.reduce_scatter", "zero_optimization.reduce_bucket_size",
        "zero_optimization.contiguous_gradients", "zero_allow_untested_optimizer"),
        megatron=("--zero-reduce-scatter", "--zero-contigious-gradients", "--overlap-grad-reduce",
                  "--overlap-param-gather")),
    Row((), "DeepSpeed's engine: the settings of its config (--deepspeed_config) are migrated with the others",
        megatron=("--deepspeed",)),
    Row((), "remat applies per layer; activations are laid out by the mesh (RULES)",
        megatron=("--checkpoint-num-layers", "--partition-activations", "--contigious-checkpointing",
                  "--checkpoint-in-cpu", "--synchronize-each-layer", "--distribute-checkpointed-activations",
                  "--deepspeed-activation-checkpointing", "--profile-backward"),
        neox=("checkpoint_num_layers", "partition_activations", "synchronize_each_layer"),
        deepspeed=("activation_checkpointing.partition_activations",
                   "activation_checkpointing.contiguous_memory_optimization",
                   "activation_checkpointing.cpu_checkpointing", "activation_checkpointing.number_checkpoints",
                   "activation_checkpointing.synchronize_checkpoint_boundary", "activation_checkpointing.profile")),
    Row((), "GPT-2 and NeoX blocks here have their biases, as CPM's --hidden-bias gives them", megatron=("--hidden-bias",)),
    Row((), "the output layer is split over 'tensor' by the rules (RULES)", neox=("output_layer_parallelism",)),
    Row((), "metrics.jsonl and the console line carry step times and tokens/s; XLA's profiler is separate",
        neox=("wall_clock_breakdown", "log_dir"), deepspeed=("wall_clock_breakdown",),
        megatron=("--log-throughput", "--profile", "--profile-step-start", "--profile-step-end")),
    Row((), "checkpoints are orbax's; `python -m t5x_like.convert` writes Hugging Face / PyTorch files from them",
        megatron=("--ckpt-format",)),
    Row((), "PyTorch's memory habits: XLA plans the step's memory when it compiles it",
        megatron=("--manual-gc", "--empty-unused-memory-level")),
    Row((), "gradients are reduced in the parameters' dtype (float32)", megatron=("--grad-reduce-in-bf16",)),
    Row((), "the loss here is always the mean over the global batch's tokens, as with this flag",
        megatron=("--calculate-per-token-loss",)),
    Row((), "one learning rate for every parameter (no separate rate for the embedding and output layer)",
        megatron=("--decoupled-lr", "--decoupled-min-lr")),
    Row((), "no context parallelism (attention over a sequence split across devices); --sequence-parallel maps "
        "to RULES", megatron=("--context-parallel-size", "--cp-comm-type")),
    Row((), "collectives have no timeout here: `train --initialization_timeout_seconds` bounds the start and "
        "`--heartbeat_timeout_seconds` names a process that stops", megatron=("--distributed-timeout-minutes",)),
    Row((), "the run stops at TRAIN_STEPS; a preemption (SIGTERM) saves a checkpoint and stops",
        megatron=("--exit-duration-in-mins",)),
    Row((), "token files are read with their index as they are; no index cache is written",
        megatron=("--data-cache-path", "--no-mmap-bin-files", "--no-create-attention-mask-in-dataloader")),
    Row((), "the tokenizer file carries its own pre-tokenizer pattern", megatron=("--tiktoken-pattern",)),
    Row((), "the data loader has its own workers (data.make_source.worker_count)",
        megatron=("--num-workers",), neox=("num_workers",)),
    Row((), "a checkpoint's integrity is checked on restore", neox=("checkpoint_validation_with_forward_pass",)),
    Row((), "CPM-2-Finetune's modes and files: a run trains, validating every EVAL_EVERY steps (--do-train, "
        "--do-valid), RESTORE_FROM brings parameters only (--no-load-optim), logs go to MODEL_DIR (--log-file); "
        "the test split: `eval --task=seq2seq` (--do-eval); validation batches are BATCH_SIZE rows "
        "(--eval-batch-size); the whole training split is read (--train-ratio: cut the file instead)",
        megatron=("--do-train", "--do-valid", "--do-eval", "--no-load-optim", "--log-file", "--eval-batch-size",
                  "--train-ratio")),
)


@translates(*IGNORED)
def ignored(upstream: Upstream, out: Out) -> None:
    for row in IGNORED:
        for key in sorted(row.keys()):
            out.skip(upstream.get(key), row.note)
