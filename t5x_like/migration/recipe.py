"""The training recipe: the learning-rate schedule and the optimizer, and the precision with its loss scaling (the
mesh and the global batch: batch.py). Upstream defaults are written out where a file leaves a setting unsaid (ours
may differ: Adam's b2 is 0.999 there, 0.95 here)."""
from __future__ import annotations

import math

from models.layers.dense import Einsum
from t5x_like.errors import UserError
from t5x_like.migration.batch import rampup_of
from t5x_like.migration.rows import Row, translates
from t5x_like.migration.translate import Out, provenance
from t5x_like.migration.upstream import MEGATRON, Setting, Upstream

SCHEDULE_ROWS = (
    Row(("TRAIN_STEPS",), "Megatron's --train-samples: divided by the global batch (with --rampup-batch-size, "
        "counted through the ramp-up as Megatron counts it)", megatron=("--train-iters", "--train-samples"),
        neox=("train_iters",)),
    Row(("LEARNING_RATE",), "the peak", megatron=("--lr",), neox=("optimizer.params.lr",),
        deepspeed=("optimizer.params.lr", "scheduler.params.warmup_max_lr")),
    Row(("optim.make_optimizer.decay",), "'cosine', 'linear', 'constant'; Megatron's 'inverse-square-root' is "
        "'noam'; DeepSpeed's WarmupLR is 'constant', WarmupDecayLR 'linear'; 'exponential' has no equivalent",
        megatron=("--lr-decay-style",), neox=("lr_decay_style",), deepspeed=("scheduler.type",)),
    Row(("optim.make_optimizer.decay_steps",), "steps, or a fraction of TRAIN_STEPS; the rate stays at its minimum "
        "after", megatron=("--lr-decay-iters",), neox=("lr_decay_iters",),
        deepspeed=("scheduler.params.total_num_steps",)),
    Row(("optim.make_optimizer.min_learning_rate",), "absolute (`min_learning_rate_ratio` is the relative form); "
        "upstream's default is 0", megatron=("--min-lr",), neox=("min_lr",),
        deepspeed=("scheduler.params.warmup_min_lr",)),
    Row(("WARMUP_STEPS",), "steps, or a fraction of the decay length (0.01), as Megatron and NeoX count it; the "
        "ramp is linear from 0", megatron=("--warmup", "--lr-warmup-fraction", "--lr-warmup-iters"),
        neox=("warmup",), deepspeed=("scheduler.params.warmup_num_steps", "scheduler.params.warmup_type")),
    Row(("optim.make_optimizer.decay_steps", "WARMUP_STEPS"), "counts of samples, divided by the global batch "
        "(with --rampup-batch-size: the steps that take that many samples)",
        megatron=("--lr-decay-samples", "--lr-warmup-samples")),
)
DECAY_STYLES = {"cosine": "cosine", "linear": "linear", "constant": "constant", "inverse-square-root": "noam",
                "WarmupLR": "constant", "WarmupDecayLR": "linear"}


@translates(*SCHEDULE_ROWS)
def schedule(upstream: Upstream, out: Out) -> None:
    out.section = "schedule and optimizer"
    steps = upstream.get("train_iters")
    if steps is not None:
        out.set("TRAIN_STEPS", steps.number(int), provenance(steps))
    elif (samples := upstream.get("train_samples")) is not None:
        out.set("TRAIN_STEPS", *train_steps(samples, out))
    peak = upstream.get("optimizer.params.lr", "scheduler.params.warmup_max_lr", "lr")
    if peak is None:
        raise UserError(f"{upstream.files[0]}: no learning rate (--lr, or optimizer.params.lr); add it.")
    out.set("LEARNING_RATE", peak.number(), provenance(peak))
    style = upstream.get("scheduler.type", "lr_decay_style")
    name = "linear" if style is None else str(style.value)
    if name not in DECAY_STYLES:
        out.skip(style, "no such schedule here (cosine, linear, constant, noam, rsqrt); 'cosine' is used")
    out.set("optim.make_optimizer.decay", DECAY_STYLES.get(name, "cosine"), provenance(style, f"linear: {out.default()}"))
    lengths(upstream, out)


def train_steps(samples: Setting, out: Out) -> tuple[int, str]:
    """TRAIN_STEPS from --train-samples: over BATCH_SIZE, or through the ramp-up as Megatron's update_train_iters
    counts it (its steps while at most the ramp-up's samples are read, then whole batches of what is left)."""
    rampup = rampup_of(out)
    if rampup is None:
        return in_steps(samples, out)
    return rampup.train_steps(samples.number(int)), f"{provenance(samples)}, counted through BATCH_SIZE_RAMPUP"


def lengths(upstream: Upstream, out: Out) -> None:
    """decay_steps, the floor and the warmup (steps, or Megatron's / NeoX's fraction of the decay length)."""
    decay = upstream.get("scheduler.params.total_num_steps", "lr_decay_iters", "lr_decay_samples")
    if decay is not None:
        out.set("optim.make_optimizer.decay_steps", *in_steps(decay, out))
    floor = upstream.get("scheduler.params.warmup_min_lr", "min_lr")
    out.set("optim.make_optimizer.min_learning_rate", 0.0 if floor is None else floor.number(),
            provenance(floor, f"0: {out.default()}"))
    if floor is not None and floor.key == "scheduler.params.warmup_min_lr" and floor.number():
        out.notes.append(f"{provenance(floor)}: DeepSpeed ramps up from it; the warmup here starts from 0")
    warmup = upstream.get("scheduler.params.warmup_num_steps", "lr_warmup_iters", "lr_warmup_samples",
                          "lr_warmup_fraction", "warmup")
    if warmup is not None and warmup.key == "scheduler.params.warmup_num_steps":
        kind = upstream.get("scheduler.params.warmup_type")
        if kind is None or kind.value != "linear":
            out.skip(kind or warmup, "DeepSpeed's warmup_type 'log' (its default) has no equivalent: the ramp here "
                     "is linear")
    if warmup is None:
        modern = upstream.kind == MEGATRON and {"micro_batch_size", "global_batch_size"} & set(upstream.settings)
        out.set("WARMUP_STEPS", 0 if modern else 0.01, f"{'0' if modern else '0.01'}: {out.default()}")
    elif warmup.key in ("warmup", "lr_warmup_fraction"):
        fraction = warmup.number()  # 0.0: no warmup, which training takes as 0 steps
        out.set("WARMUP_STEPS", fraction or 0, provenance(warmup) + (": a fraction of the decay length" if fraction
                                                                     else ": no warmup"))
    else:
        out.set("WARMUP_STEPS", *in_steps(warmup, out))


def in_steps(setting: Setting, out: Out) -> tuple[int, str]:
    """Steps, from a count of steps or of samples (Megatron's *_samples: divided by the global batch)."""
    if not setting.key.endswith("_samples"):
        return setting.number(int), provenance(setting)
    rampup = rampup_of(out)
    if rampup is None:
        return math.ceil(setting.number(int) / out.value("BATCH_SIZE")), f"{provenance(setting)} / BATCH_SIZE"
    return rampup.steps_to_consume(setting.number(int)), f"{provenance(setting)}: the steps that take as many " \
        "through BATCH_SIZE_RAMPUP"


OPTIMIZER_ROWS = (
    Row(("OPTIMIZER",), "Adam and AdamW are 'adamw' (decoupled weight decay, as Megatron's and DeepSpeed's Adam)",
        megatron=("--optimizer",), neox=("optimizer.type",), deepspeed=("optimizer.type",)),
    Row(("optim.make_optimizer.b1", "optim.make_optimizer.b2"), "upstream's default (0.9, 0.999); ours is (0.9, "
        "0.95)", megatron=("--adam-beta1", "--adam-beta2"), neox=("optimizer.params.betas",),
        deepspeed=("optimizer.params.betas",)),
    Row(("optim.make_optimizer.eps",), megatron=("--adam-eps",), neox=("optimizer.params.eps",),
        deepspeed=("optimizer.params.eps",)),
    Row(("optim.make_optimizer.weight_decay", "optim.make_optimizer.decay_embeddings"), "Megatron and NeoX decay "
        "every weight but biases and norms: decay_embeddings=True", megatron=("--weight-decay",),
        neox=("weight_decay", "optimizer.params.weight_decay"), deepspeed=("optimizer.params.weight_decay",)),
    Row(("optim.make_optimizer.clip_grad_norm",), "0 = none", megatron=("--clip-grad",), neox=("gradient_clipping",),
        deepspeed=("gradient_clipping",)),
)
OPTIMIZER_DEFAULTS = {"megatron": (0.01, 1.0), "neox": (0.1, 1.0)}  # weight decay, clipping
ADAM = ("adam", "adamw", "fusedadam", "cpu_adam", "deepspeedcpuadam")


@translates(*OPTIMIZER_ROWS)
def optimizer(upstream: Upstream, out: Out) -> None:
    kind = upstream.get("optimizer.type", "optimizer")
    if kind is not None and str(kind.value).lower() not in ADAM:
        out.skip(kind, "AdamW (and Adafactor) only; AdamW is used")
    out.set("OPTIMIZER", "adamw", provenance(kind, f"Adam: {out.default()}"))
    betas = upstream.get("optimizer.params.betas")
    b1, b2 = upstream.get("adam_beta1"), upstream.get("adam_beta2")
    if betas is not None:
        out.set("optim.make_optimizer.b1", float(betas.value[0]), provenance(betas))
        out.set("optim.make_optimizer.b2", float(betas.value[1]), provenance(betas))
    else:
        out.set("optim.make_optimizer.b1", 0.9 if b1 is None else b1.number(), provenance(b1, f"0.9: {out.default()}"))
        out.set("optim.make_optimizer.b2", 0.999 if b2 is None else b2.number(),
                provenance(b2, f"0.999: {out.default()}"))
    eps = upstream.get("optimizer.params.eps", "adam_eps")
    out.set("optim.make_optimizer.eps", 1e-8 if eps is None else eps.number(), provenance(eps, f"1e-8: {out.default()}"))
    decay_default, clip_default = OPTIMIZER_DEFAULTS[upstream.kind]
    decay = upstream.get("optimizer.params.weight_decay", "weight_decay")
    out.set("optim.make_optimizer.weight_decay", decay_default if decay is None else decay.number(),
            provenance(decay, f"{decay_default}: {out.default()}"))
    out.set("optim.make_optimizer.decay_embeddings", True, "Megatron and NeoX decay the embeddings too")
    clip = upstream.get("gradient_clipping", "clip_grad")
    out.set("optim.make_optimizer.clip_grad_norm", clip_default if clip is None else clip.number(),
            provenance(clip, f"{clip_default}: {out.default()}"))


PRECISION_ROWS = (
    Row(("DTYPE",), "'float16' (with loss scaling) or 'bfloat16'; neither: 'float32'",
        megatron=("--fp16", "--bf16"), neox=("precision", "fp16.enabled", "fp16.fp16", "bf16.enabled"),
        deepspeed=("fp16.enabled", "bf16.enabled")),
    Row(("trainer.LossScaleConfig.static_scale",), "a fixed scale; 0 = dynamic", megatron=("--loss-scale",),
        neox=("fp16.loss_scale",), deepspeed=("fp16.loss_scale",)),
    Row(("trainer.LossScaleConfig.initial_scale_power",), "Megatron: log2 of --initial-loss-scale (2**32 by "
        "default)", megatron=("--initial-loss-scale",), neox=("fp16.initial_scale_power",),
        deepspeed=("fp16.initial_scale_power",)),
    Row(("trainer.LossScaleConfig.window",), megatron=("--loss-scale-window",), neox=("fp16.loss_scale_window",),
        deepspeed=("fp16.loss_scale_window",)),
    Row(("trainer.LossScaleConfig.hysteresis",), megatron=("--hysteresis",), neox=("fp16.hysteresis",),
        deepspeed=("fp16.hysteresis",)),
    Row(("trainer.LossScaleConfig.min_scale",), megatron=("--min-loss-scale", "--min-scale"),
        neox=("fp16.min_loss_scale",), deepspeed=("fp16.min_loss_scale",)),
)
LOSS_SCALE = (("initial_scale_power", "fp16.initial_scale_power", "initial_loss_scale", 16, 32),
              ("window", "fp16.loss_scale_window", "loss_scale_window", 1000, 1000),
              ("hysteresis", "fp16.hysteresis", "hysteresis", 2, 2),
              ("min_scale", "fp16.min_loss_scale", "min_loss_scale", 1.0, 1.0))
"""(LossScaleConfig field, DeepSpeed key, Megatron key, DeepSpeed's default, Megatron's default)."""


@translates(*PRECISION_ROWS)
def precision(upstream: Upstream, out: Out) -> None:
    out.section = "precision"
    deepspeed_fp16, megatron_fp16 = upstream.get("fp16.enabled"), upstream.get("fp16")
    fp16 = deepspeed_fp16 if deepspeed_fp16 is not None else megatron_fp16
    bf16 = upstream.get("bf16.enabled", "bf16")
    named = upstream.get("precision")
    upstream.get("fp16.fp16")  # NeoX's legacy alias of fp16.enabled
    if fp16 is not None and bf16 is not None and fp16.flag() and bf16.flag():
        raise UserError(f"{provenance(fp16)} and {provenance(bf16)} are both on: Megatron-LM and DeepSpeed refuse "
                        "float16 and bfloat16 together; keep one.")
    if (fp16 is not None and fp16.flag()) or (named is not None and named.value == "fp16"):
        out.set("DTYPE", "float16", provenance(fp16 or named))
        loss_scale(upstream, out, deepspeed=deepspeed_fp16 is not None)
    elif (bf16 is not None and bf16.flag()) or (named is not None and named.value == "bfloat16"):
        out.set("DTYPE", "bfloat16", provenance(bf16 or named))
    else:
        out.set("DTYPE", "float32", "neither fp16 nor bf16: upstream trains in float32 ('bfloat16' is faster)")


AMAX_HISTORY = Einsum.amax_history_length
FP8_ROWS = (
    Row(("model_config.matmul_dtype",), "'fp8': the matmuls in E4M3 forward and E5M2 for gradients (Megatron's "
        f"'hybrid'), each tensor scaled from the max of a {AMAX_HISTORY}-step amax history (Megatron's delayed "
        f"scaling with --fp8-amax-history-len {AMAX_HISTORY} --fp8-amax-compute-algo max); not with a pipeline",
        megatron=("--fp8-format", "--fp8-recipe", "--fp8-amax-history-len", "--fp8-amax-compute-algo")),
    Row((), "parameters are stored and gathered in their own dtype; the FP8 casts happen inside each matmul",
        megatron=("--fp8-param-gather",)),
)
FP8_SAME = {"fp8_recipe": "delayed", "fp8_amax_history_len": AMAX_HISTORY, "fp8_amax_compute_algo": "max"}
"""Megatron's FP8 settings whose value here is fixed (flax's fp8 ops): another value is listed as not migrated."""


@translates(*FP8_ROWS)
def fp8(upstream: Upstream, out: Out) -> None:
    """--fp8-format turns FP8 matmuls on (Transformer Engine's recipe: E4M3 forward, E5M2 backward)."""
    out.section = "precision"
    fp8_format = upstream.get("fp8_format")
    settings = {key: upstream.get(key) for key in FP8_SAME}
    out.skip(upstream.get("fp8_param_gather"), FP8_ROWS[1].note)
    if fp8_format is None or (out.value("PIPELINE_PARALLEL") or 1) > 1:
        off = "FP8 is off upstream (no --fp8-format)" if fp8_format is None else \
            "FP8 matmuls do not run pipelined here yet (the pipeline carries no FP8 state): the run trains in DTYPE"
        for setting in (fp8_format, *settings.values()):
            out.skip(setting, off)
        return
    why = provenance(fp8_format)
    if fp8_format.value != "hybrid":
        why += ": gradients in E5M2 here (Megatron's 'hybrid'), not E4M3"
    out.set("model_config.matmul_dtype", "fp8", why)
    for key, same in FP8_SAME.items():
        setting = settings[key]
        if setting is not None and str(setting.value) != str(same):
            out.skip(setting, f"FP8 scaling here is fixed at {key[4:].replace('_', ' ')} {same!r} (flax's fp8 ops)")


def loss_scale(upstream: Upstream, out: Out, *, deepspeed: bool) -> None:
    """DeepSpeed's fp16 section when the run has one (it is what DeepSpeed's engine uses), else Megatron's flags."""
    out.set("build_experiment.loss_scale", LossScale(), "the float16 loss scaling below")
    static = upstream.get("fp16.loss_scale" if deepspeed else "loss_scale")
    scale = 0.0 if static is None or static.value is None else static.number()
    out.set("trainer.LossScaleConfig.static_scale", scale, provenance(static, f"dynamic: {out.default()}"))
    for field, ds_key, megatron_key, ds_default, megatron_default in LOSS_SCALE:
        keys = (ds_key,) if deepspeed else (megatron_key, "min_scale") if field == "min_scale" else (megatron_key,)
        setting = upstream.get(*keys)
        default = ds_default if deepspeed else megatron_default
        value = default if setting is None else setting.number()
        if field == "initial_scale_power" and setting is not None and not deepspeed:
            value = math.log2(value)  # Megatron gives the scale itself
        out.set(f"trainer.LossScaleConfig.{field}", float(value) if field == "min_scale" else round(value),
                provenance(setting, f"{default}: {'DeepSpeed' if deepspeed else 'Megatron-LM'}'s default"))


class LossScale:
    """Renders as the gin reference @trainer.LossScaleConfig()."""

    def __repr__(self) -> str:
        return "@trainer.LossScaleConfig()"
