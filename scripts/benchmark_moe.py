"""A mixture of experts' train step against a dense step with the same active parameters, and dropless routing
against a capacity: tokens/s of each, and their ratios to the dense step.

    python scripts/benchmark_moe.py --preset=mixtral_tiny --batch_size=16 --seq_len=128 --steps=10

Three rows over the same batch of random tokens (scripts/benchmark_train.py times each: compilation in the
warm-up, then --steps steps): the MoE preset with dropless routing (grouped matmuls over tokens sorted by
expert), the same with --capacity_factor (each expert a fixed [capacity, embed] buffer, the rest dropped), and
the preset's dense family (the MoE config's dense base, e.g. Mixtral -> Llama) whose MLP is as wide as the k
experts a token goes through (mlp_dim = k x expert width): per token the same matmul weights, so the same
FLOPs. Prints a markdown table; --json writes the rows.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import benchmark_train  # noqa: E402  (the timing of one train step)

import models  # noqa: E402
from models.config import DecoderOnlyConfig, MoEConfig  # noqa: E402

MOE_FIELDS = [name for name in MoEConfig.__dataclass_fields__ if name not in DecoderOnlyConfig.__dataclass_fields__]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--capacity_factor", type=float, default=1.25)
    p.add_argument("--output", help="also write the rows as JSON here")
    ours, rest = p.parse_known_args(argv)
    args = benchmark_train.parse_args(["--preset=mixtral_tiny", "--dtype=float32", *rest])
    args.capacity_factor, args.output = ours.capacity_factor, ours.output
    return args


def dense_values(moe: dict) -> dict:
    """The values of the dense model with the same active parameters: the MoE config's dense base family, its
    MLP as wide as the k experts a token takes (and the shared expert, when there is one)."""
    config = models.config_from_dict(moe)
    base = next(cls for cls in type(config).__mro__[1:] if cls is not MoEConfig and not issubclass(cls, MoEConfig)
                and cls in {family.config for family in models.FAMILIES.values()})
    family = next(name for name, entry in models.FAMILIES.items() if entry.config is base)
    width = config.num_experts_per_token * config.expert_width + (config.shared_expert_mlp_dim or 0)
    values = {k: v for k, v in moe.items() if k not in MOE_FIELDS}
    return dict(values, family=family, mlp_dim=width)


def rows(args: argparse.Namespace) -> list[dict]:
    moe = benchmark_train.model_values(args)
    if not issubclass(models.FAMILIES[moe["family"]].config, MoEConfig):
        raise SystemExit(f"--preset={args.preset}: not a mixture of experts (family {moe['family']!r}).")
    variants = {"dense, same active parameters": dense_values(moe),
                "MoE, dropless": dict(moe, capacity_factor=None),
                f"MoE, capacity factor {args.capacity_factor}": dict(moe, capacity_factor=args.capacity_factor)}
    results = []
    for name, values in variants.items():
        row = benchmark_train.measure(args, values)
        row.update(variant=name, family=values["family"],
                   active_params_per_token=models.config_from_dict(values).matmul_params())
        results.append(row)
    for row in results:
        row["vs_dense"] = row["tokens_per_sec"] / results[0]["tokens_per_sec"]
    return results


def table(results: list[dict]) -> str:
    lines = ["| variant | family | active params / token | step (ms) | tokens/s | vs dense |", "|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['variant']} | {r['family']} | {r['active_params_per_token']:,} | {r['step_time_s'] * 1e3:.1f} "
                     f"| {r['tokens_per_sec']:,.0f} | {r['vs_dense']:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    results = rows(args)
    first = results[1]
    print(f"{args.preset}: batch {args.batch_size} x {args.seq_len}, {args.dtype}, {first['devices']} "
          f"{first['device']} device(s), mesh {first['mesh']}, {args.steps} timed steps")
    print(table(results))
    if args.output:
        with open(args.output, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
