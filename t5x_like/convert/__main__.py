"""`python -m t5x_like.convert`:

    to-hf    SRC DST        MODEL_DIR or step dir -> a directory AutoModelForCausalLM.from_pretrained loads
    from-hf  SRC DST        Hugging Face directory -> DST/checkpoints/<step> (eval, generate, RESTORE_FROM)
    to-torch SRC FILE.pt    MODEL_DIR or step dir -> a plain state_dict with Hugging Face names
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

import models
from t5x_like.convert import hf
from t5x_like.errors import exit_on_user_error


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m t5x_like.convert", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    to_hf = commands.add_parser("to-hf", help="checkpoint -> Hugging Face directory")
    to_hf.add_argument("src", help="MODEL_DIR (latest step) or a step directory")
    to_hf.add_argument("dst", help="output directory")
    to_torch = commands.add_parser("to-torch", help="checkpoint -> torch state_dict file")
    to_torch.add_argument("src", help="MODEL_DIR (latest step) or a step directory")
    to_torch.add_argument("file", help="output .pt file")
    from_hf = commands.add_parser("from-hf", help="Hugging Face directory -> params-only checkpoint")
    from_hf.add_argument("src", help="directory with config.json and model.safetensors or pytorch_model.bin")
    from_hf.add_argument("dst", help="output MODEL_DIR (the checkpoint goes to DST/checkpoints/<step>)")
    from_hf.add_argument("--step", type=int, default=0, help="step number to record")
    from_hf.add_argument("--no_scan_layers", dest="scan_layers", action="store_false",
                         help="store blocks as block_0, block_1, ... (default: stacked for nn.scan)")
    from_hf.add_argument("--vocab_pad_multiple", type=int, default=128,
                         help="pad the vocabulary to a multiple of this (padding rows are zeros)")
    from_hf.add_argument("--dtype", default="float32", choices=sorted(models.DTYPES),
                         help="compute dtype recorded in the model config (weights stay float32)")
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.command == "to-hf":
        hf.to_hf(args.src, args.dst)
        print(f"wrote {args.dst} (config.json, model.safetensors)")
    elif args.command == "to-torch":
        hf.to_torch(args.src, args.file)
        print(f"wrote {args.file}")
    else:
        path = hf.from_hf(args.src, args.dst, step=args.step, scan_layers=args.scan_layers,
                          vocab_pad_multiple=args.vocab_pad_multiple, dtype=args.dtype)
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
