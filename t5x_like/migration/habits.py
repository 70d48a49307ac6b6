"""BMTrain / ModelCenter's and GPT2-Chinese's settings and their equivalents here, for docs/migrating.md's tables.
Their runs are Python scripts and command lines, not configurations a migration reads, so these rows document
only (a test checks that each setting of ours they name exists)."""
from __future__ import annotations

from t5x_like.migration.rows import Row, documents

documents(
    Row(("SEED", "train --coordinator_address"), "the mesh and the multi-host flags replace the process group",
        bmtrain=("bmt.init_distributed(seed=...)",)),
    Row(("RULES", "FSDP_PARALLEL"), "BMTrain's ZeRO-3 by default is RULES='fsdp' with FSDP_PARALLEL=-1; ZeRO-2 is "
        "'zero1' (the optimizer state sharded)", bmtrain=("bmt.Block(..., zero_level=3)", "zero_level=2")),
    Row(("model_config.remat_policy",), "'full' recomputes each layer as a checkpointed block does",
        bmtrain=("bmt.CheckpointBlock", "bmt.Block(..., use_checkpoint=True)")),
    Row(("OPTIMIZER", "optim.make_optimizer.weight_decay", "optim.make_optimizer.b1", "optim.make_optimizer.b2"),
        "BMTrain's Adam defaults: betas (0.9, 0.999), weight decay 0",
        bmtrain=("bmt.optim.AdamOptimizer(lr, betas, weight_decay)",)),
    Row(("build_experiment.offload_optimizer_state",), "the optimizer state in host memory",
        bmtrain=("bmt.optim.AdamOffloadOptimizer",)),
    Row(("optim.make_optimizer.decay", "WARMUP_STEPS", "LEARNING_RATE"), "decay='noam' with WARMUP_STEPS = "
        "warmup_iter and LEARNING_RATE = start_lr / sqrt(warmup_iter): BMTrain's Noam peaks there (start_lr is not "
        "the peak)", bmtrain=("bmt.lr_scheduler.Noam(start_lr, warmup_iter)",)),
    Row(("optim.make_optimizer.decay", "optim.make_optimizer.decay_steps"), "'cosine' / 'linear' / 'constant' "
        "(exponential has no equivalent)", bmtrain=("bmt.lr_scheduler.Cosine", "Linear", "NoDecay")),
    Row(("trainer.LossScaleConfig.initial_scale_power", "trainer.LossScaleConfig.window",
         "trainer.LossScaleConfig.min_scale"), "DTYPE='float16' scales the loss: the initial scale as a power of 2 "
        "(1024 is 10), loss_scale_steps as the window, min_loss_scale; loss_scale_factor is 2 here",
        bmtrain=("bmt.optim.OptimManager(loss_scale, loss_scale_steps, min_loss_scale)",)),
    Row(("optim.make_optimizer.clip_grad_norm",), bmtrain=("optim_manager.clip_grad_norm(max_norm=...)",)),
    Row(("EPOCHS",), "passes over the training split; validation runs after each (ModelCenter's quickstart: 5 "
        "epochs, dev after each)", bmtrain=("for epoch in range(5): ... evaluate on dev",)),
    Row(("BATCH_SIZE",), "global: DistributedDataLoader's batch_size is per process", bmtrain=(
        "DistributedDataLoader(batch_size=...)",)),
    Row(("train.log_every",), "metrics.jsonl and the console line (loss, learning rate, loss scale, grad norm)",
        bmtrain=("bmt.print_rank(...)",)),
)

documents(
    Row(("EPOCHS",), "validation and a checkpoint at the end of each epoch", gpt2_chinese=("train.py --epochs",)),
    Row(("BATCH_SIZE", "GRAD_ACCUM_STEPS"), gpt2_chinese=("--batch_size", "--gradient_accumulation")),
    Row(("LEARNING_RATE", "WARMUP_STEPS", "optim.make_optimizer.decay", "optim.make_optimizer.min_learning_rate"),
        "its WarmupLinearSchedule: decay='linear' to min_learning_rate=0", gpt2_chinese=("--lr", "--warmup_steps")),
    Row(("optim.make_optimizer.weight_decay", "optim.make_optimizer.b2"), "transformers' AdamW as it calls it: "
        "weight decay 0, betas (0.9, 0.999)", gpt2_chinese=("transformers.AdamW(lr, correct_bias=True)",)),
    Row(("DTYPE", "optim.make_optimizer.clip_grad_norm"), "'float16' with loss scaling (apex O1)",
        gpt2_chinese=("--fp16", "--max_grad_norm")),
    Row(("SEQ_LEN",), "rows are consecutive SEQ_LEN windows (its --stride 768 over n_ctx 1024 overlaps them; no "
        "equivalent)", gpt2_chinese=("n_ctx", "--stride")),
    Row(("TOKENIZER",), "its layout: TOKENIZER='gpt2_chinese:vocab.txt' (articles as [MASK] ... [CLS], newlines "
        "as [SEP])", gpt2_chinese=("--tokenizer_path", "make_vocab.py")),
    Row((), "articles of any length are kept (its build_files drops those of min_length characters or fewer)",
        gpt2_chinese=("--min_length",)),
    Row(("MODEL_DIR", "RESTORE_FROM", "train.tensorboard_dir"), "a Hugging Face checkpoint starts a run after "
        "`convert from-hf`", gpt2_chinese=("--output_dir", "--pretrained_model", "--writer_dir")),
    Row(("train.log_every",), gpt2_chinese=("--log_step",)),
    Row(("generate --checkpoint", "generate --tokenizer"), "after `convert from-hf` of its model directory",
        gpt2_chinese=("generate.py --model_path", "--tokenizer_path")),
    Row(("generate --prompt", "generate --max_new_tokens", "generate --num_samples"),
        gpt2_chinese=("--prefix", "--length", "--nsamples")),
    Row(("generate --temperature", "generate --top_k", "generate --top_p", "generate --repetition_penalty"),
        "its defaults: temperature 1, top-k 8, no top-p", gpt2_chinese=("--temperature", "--topk", "--topp",
                                                                        "--repetition_penalty")),
    Row(("generate --output", "generate --interactive"), "JSONL; --interactive reads prompts as they are typed",
        gpt2_chinese=("--save_samples", "--save_samples_path")),
    Row(("generate --batch_size",), "every decode uses its KV cache (its --fast_pattern)",
        gpt2_chinese=("--batch_size", "--fast_pattern")),
)
