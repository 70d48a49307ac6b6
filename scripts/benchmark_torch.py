"""The PyTorch reference for GPT-2 training throughput: what a user would run instead of this stack.

    python scripts/benchmark_torch.py --preset=gpt2_small --batch_size=16 --seq_len=1024 --steps=20

A nanoGPT-style GPT-2 written here with the preset's shapes: learned positions, pre-LN blocks,
GELU(tanh), fused q/k/v projection, tied input/output embeddings with the vocabulary padded to the
same multiple of 128 as ours (so the parameter counts agree), SDPA causal attention (flash on GPU),
bf16 autocast, fused AdamW (betas 0.9/0.95, weight decay 0.1 on matrices) behind global-norm
clipping at 1.0, and `torch.compile` on the model. Dropout is off, as in benchmark_train.py.

FLOPs and MFU use the model config's own `train_flops_per_example` (6N over the matmul weights
plus causal attention), the formula benchmark_train.py reports for ours, so the two MFUs compare.
Random tokens stand in for data; timing starts after --warmup steps and ends with a device sync.
Peak memory is torch.cuda.max_memory_allocated (None on CPU).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import configs  # noqa: E402
import models  # noqa: E402
from t5x_like import metrics  # noqa: E402

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


class Block(nn.Module):
    """x + attn(ln_1(x)), then x + mlp(ln_2(x))."""

    def __init__(self, embed: int, heads: int, eps: float):
        super().__init__()
        self.heads = heads
        self.ln_1 = nn.LayerNorm(embed, eps=eps)
        self.qkv = nn.Linear(embed, 3 * embed)
        self.attn_proj = nn.Linear(embed, embed)
        self.ln_2 = nn.LayerNorm(embed, eps=eps)
        self.fc = nn.Linear(embed, 4 * embed)
        self.mlp_proj = nn.Linear(4 * embed, embed)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, embed = x.shape
        q, k, v = self.qkv(x).split(embed, dim=2)
        q, k, v = (t.view(batch, length, self.heads, embed // self.heads).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.attn_proj(out.transpose(1, 2).contiguous().view(batch, length, embed))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    """GPT-2 with a tied output head over the padded vocabulary."""

    def __init__(self, config):
        super().__init__()
        e = config.embed_dim
        self.wte = nn.Embedding(config.padded_vocab_size, e)
        self.wpe = nn.Embedding(config.max_len, e)
        self.blocks = nn.ModuleList(Block(e, config.num_heads, config.layer_norm_eps)
                                    for _ in range(config.num_layers))
        self.ln_f = nn.LayerNorm(e, eps=config.layer_norm_eps)
        self.init_weights(config.init_std, config.num_layers)

    def init_weights(self, std: float, num_layers: int) -> None:
        """GPT-2's init: N(0, std) weights, zero biases, residual projections at std / sqrt(2L)."""
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                nn.init.zeros_(p)
            elif "ln_" in name:
                nn.init.ones_(p)
            else:
                scaled = name.endswith(("attn_proj.weight", "mlp_proj.weight"))
                nn.init.normal_(p, std=std / math.sqrt(2 * num_layers) if scaled else std)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        x = self.wte(tokens) + self.wpe(positions)
        for block in self.blocks:
            x = block(x)
        return self.ln_f(x) @ self.wte.weight.T


def count_params(model: GPT, config) -> int:
    """Parameters less the vocabulary's padding rows (as t5x_like.train.count_params counts ours)."""
    total = sum(p.numel() for p in model.parameters())
    return total - (config.padded_vocab_size - config.vocab_size) * config.embed_dim


def make_optimizer(model: nn.Module, device: torch.device) -> torch.optim.AdamW:
    """AdamW as optim.make_optimizer: decay on matrices only; fused where the device allows."""
    matrices = [p for n, p in model.named_parameters() if p.dim() == 2 and not n.startswith(("wte", "wpe"))]
    others = [p for n, p in model.named_parameters() if not (p.dim() == 2 and not n.startswith(("wte", "wpe")))]
    groups = [{"params": matrices, "weight_decay": 0.1}, {"params": others, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=1e-4, betas=(0.9, 0.95), eps=1e-8, fused=device.type == "cuda")


def model_config(preset: str, overrides: dict):
    """Our model config for the preset: the same shapes, padded vocabulary and FLOPs formula."""
    values = dict(configs.get_model_config(preset).to_dict(), dropout_rate=0.0, attention_dropout_rate=0.0)
    values.update(overrides)
    return models.config_from_dict(values)


def train_step(model, optimizer, tokens, targets, dtype: torch.dtype) -> torch.Tensor:
    with torch.autocast(tokens.device.type, dtype=dtype, enabled=dtype != torch.float32):
        logits = model(tokens)
    loss = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.detach()


def peak_tflops(device: torch.device) -> float | None:
    return metrics.peak_tflops(torch.cuda.get_device_name(device)) if device.type == "cuda" else None


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


def measure(*, preset: str, batch_size: int, seq_len: int, steps: int, warmup: int, dtype: str = "bfloat16",
            compile_model: bool = True, overrides: dict | None = None, seed: int = 0) -> dict:
    """One timed run: a row of tokens/s, step time, TFLOP/s, MFU and peak memory (keys as benchmark_train's)."""
    config = model_config(preset, overrides or {})
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(seed)
    torch.backends.cuda.matmul.allow_tf32 = True
    model = GPT(config).to(device)
    num_params = count_params(model, config)
    optimizer = make_optimizer(model, device)
    compiled = torch.compile(model, dynamic=False) if compile_model else model
    # the batch benchmark_train.py draws for ours (numpy's generator, this seed), so losses compare
    data = torch.from_numpy(np.random.default_rng(seed).integers(
        0, config.vocab_size, (batch_size, seq_len + 1), dtype=np.int32)).long().to(device)
    tokens, targets = data[:, :-1].contiguous(), data[:, 1:].contiguous()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    start_compile = time.perf_counter()
    first_loss = float(train_step(compiled, optimizer, tokens, targets, DTYPES[dtype]))
    compile_s = time.perf_counter() - start_compile
    for _ in range(warmup - 1):
        train_step(compiled, optimizer, tokens, targets, DTYPES[dtype])
    sync()
    start = time.perf_counter()
    for _ in range(steps):
        loss = train_step(compiled, optimizer, tokens, targets, DTYPES[dtype])
    sync()
    step_time = (time.perf_counter() - start) / steps
    flops = config.train_flops_per_example({"targets": seq_len}) * batch_size
    tflops = flops / step_time / 1e12
    peak = peak_tflops(device)
    memory = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    return {
        "framework": "torch", "torch": torch.__version__, "preset": preset, "num_params": num_params,
        "device": device_name(device), "devices": 1, "dtype": dtype, "compiled": compile_model,
        "batch_size": batch_size, "seq_len": seq_len, "steps": steps, "warmup": warmup,
        "step_time_s": step_time, "tokens_per_sec": batch_size * seq_len / step_time,
        "tflops_per_device": tflops, "mfu": tflops / peak if peak else None,
        "peak_memory_gib": memory, "memory_source": "torch.cuda.max_memory_allocated" if memory else "unknown",
        "first_loss": first_loss, "final_loss": float(loss), "first_step_s": compile_s,
    }


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="gpt2_small")
    p.add_argument("--overrides", default="{}", help="JSON dict of model config overrides")
    p.add_argument("--batch_size", type=int, default=8)
    p.add_argument("--seq_len", type=int, default=1024)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2, help="untimed steps first (compilation), at least 1")
    p.add_argument("--dtype", default="bfloat16", choices=list(DTYPES))
    p.add_argument("--no_compile", action="store_true", help="eager mode (torch.compile off)")
    p.add_argument("--json", help="also write the result row to this file")
    args = p.parse_args(argv)
    if args.warmup < 1:
        p.error("--warmup must be at least 1 (the first step compiles)")
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    row = measure(preset=args.preset, batch_size=args.batch_size, seq_len=args.seq_len, steps=args.steps,
                  warmup=args.warmup, dtype=args.dtype, compile_model=not args.no_compile,
                  overrides=json.loads(args.overrides))
    print(json.dumps(row, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(row, f, indent=2)


if __name__ == "__main__":
    main()
