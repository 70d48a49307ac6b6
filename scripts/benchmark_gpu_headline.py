"""The GPU suite's headline (issue 45): the mixture-of-experts item and docs/gpu/headline.json.

`moe` runs scripts/benchmark_moe.py in a child: an MoE model against the dense model with the same active
parameters, dropless and with a capacity, one row each. `headline(results)` reads a suite's results into the
four figures README quotes:

    {"device": ..., "gpt2_124m": {"tokens_per_s", "mfu", "vs_torch"}, "gpt2_1_5b": {"mfu"},
     "moe": {"vs_dense_same_active"}, "source": {"command", "jax", "date"}}

`--plan=headline` (scripts/benchmark_gpu.py) is the prepared device check: the 124M pair at the first batch
size, the 1.5B runs and the MoE item within one call's budget, then `--headline` writes the file.
"""
from __future__ import annotations

import datetime
import json
import os

MOE_FULL = ("mixtral_tiny", 16, {"num_layers": 12, "embed_dim": 768, "num_heads": 12, "num_key_value_heads": 12,
                                 "mlp_dim": 1536, "num_experts": 8, "vocab_size": 50304, "max_len": 1024})
"""(preset, batch, overrides) of the GPU's MoE item: GPT-2 124M's shape with 8 experts of 1536, top-2, so a token
goes through a 3072-wide MLP's weights, as GPT-2 124M's; the dense side is that Llama-class model."""
MOE_SMOKE = ("mixtral_tiny", 2, {"num_layers": 1})

PLAN_HEADLINE = ("small", "xl", "moe")
"""The items of the headline check, in order (about 10 minutes of an H100/H200: the 124M pair, the 1.5B runs,
the MoE rows)."""


def item_moe(recorder, suite, tmp, budget, *, run_child, scripts: str, smoke: bool) -> None:
    """benchmark_moe.py in a child: one recorded row per variant (dense, dropless, capacity)."""
    preset, batch, overrides = MOE_SMOKE if smoke else MOE_FULL
    path = os.path.join(tmp, "moe.json")
    argv = [os.path.join(scripts, "benchmark_moe.py"), f"--preset={preset}", f"--batch_size={batch}",
            f"--seq_len={suite.seq_len}", f"--steps={suite.steps}", f"--warmup={suite.warmup}",
            f"--overrides={json.dumps(overrides)}", f"--output={path}",
            *(["--dtype=float32"] if smoke else ["--dtype=bfloat16"])]
    rc, output = run_child(recorder, argv, budget(420))
    if rc != 0 or not os.path.exists(path):
        tail = [line for line in output.strip().splitlines() if line.strip()][-1:] or [""]
        recorder.add("moe", {"label": "moe", "note": "timed out" if rc is None else f"exit {rc}: {tail[0][:200]}"})
        return
    with open(path) as f:
        for row in json.load(f):
            recorder.add("moe", dict(row, label=row["variant"]))


def ok(rows: list[dict]) -> list[dict]:
    return [r for r in rows if "note" not in r]


def headline(results: dict) -> dict:
    """The four figures from a suite's results (None where the suite has no row for one)."""
    items = results["items"]
    small = ok(items.get("small", []))
    first = min((r["batch_size"] for r in small), default=None)
    ours = next((r for r in small if r.get("framework") == "jax" and r["batch_size"] == first
                 and r["label"] == f"ours B={first}"), None)
    torch = next((r for r in small if r.get("framework") == "torch" and r["batch_size"] == first), None)
    xl = [r for r in ok(items.get("xl", [])) if r.get("framework") == "jax"]
    moe = {r["variant"]: r for r in ok(items.get("moe", []))}
    dropless = next((r for name, r in moe.items() if "dropless" in name), None)
    device = (results["environment"].get("nvidia-smi") or (ours or {}).get("device") or "unknown")
    return {
        "device": device,
        "gpt2_124m": {"tokens_per_s": ours and ours["tokens_per_sec"], "mfu": ours and ours.get("mfu"),
                      "vs_torch": ours and torch and ours["tokens_per_sec"] / torch["tokens_per_sec"]},
        "gpt2_1_5b": {"mfu": max((r["mfu"] for r in xl if r.get("mfu") is not None), default=None)},
        "moe": {"vs_dense_same_active": dropless and dropless["vs_dense"]},
        "source": {"command": results.get("command"), "jax": results["environment"].get("jax"),
                   "date": datetime.date.today().isoformat()},
    }


def write_headline(results: dict, path: str) -> dict:
    figures = headline(results)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(figures, f, indent=2)
        f.write("\n")
    return figures
