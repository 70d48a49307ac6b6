"""`python -m t5x_like.convert`:

    to-hf    SRC DST        MODEL_DIR or step dir -> a directory AutoModelForCausalLM.from_pretrained loads
    from-hf  SRC DST        Hugging Face directory -> DST/checkpoints/<step> (eval, generate, RESTORE_FROM)
    to-torch SRC FILE.pt    MODEL_DIR or step dir -> a plain state_dict with Hugging Face names
    from-modelcenter SRC DST   ModelCenter's CPM-2 folder (config.json, pytorch_model.pt, vocab.txt) -> DST/checkpoints/<step>
    to-modelcenter SRC DST     CPM-2 checkpoint -> a ModelCenter folder (config.json, pytorch_model.pt in float16, vocab.txt)
    from-neox SRC DST       GPT-NeoX's own checkpoint (global_stepN/layer_XX-model_YY-model_states.pt,
                            tensor-parallel shards merged) -> DST/checkpoints/<step>, e.g.
        python -m t5x_like.convert from-neox /ckpts/20B/global_step150000 /runs/neox20b --preset=neox_20b \
          --tokenizer=/data/20B_tokenizer.json
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Sequence

import models
from t5x_like import checks
from t5x_like.checkpoint import store
from t5x_like.convert import hf
from t5x_like.errors import UserError, exit_on_user_error


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m t5x_like.convert", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    to_hf = commands.add_parser("to-hf", help="checkpoint -> Hugging Face directory")
    to_hf.add_argument("src", help="MODEL_DIR (latest step) or a step directory")
    to_hf.add_argument("dst", help="output directory")
    to_hf.add_argument("--tokenizer", default=None,
                       help="the tokenizer to write (default: the one the checkpoint records), in any form training "
                            "takes: a directory or tokenizer.json, GPT-2 BPE files, vocab.txt, a sentencepiece .model")
    to_torch = commands.add_parser("to-torch", help="checkpoint -> torch state_dict file")
    to_torch.add_argument("src", help="MODEL_DIR (latest step) or a step directory")
    to_torch.add_argument("file", help="output .pt file")
    from_hf = commands.add_parser("from-hf", help="Hugging Face directory -> params-only checkpoint")
    from_hf.add_argument("src", help="directory with config.json and model.safetensors or pytorch_model.bin")
    from_hf.add_argument("dst", help="output MODEL_DIR (the checkpoint goes to DST/checkpoints/<step>)")
    from_hf.set_defaults(run_import=import_hf)
    exports = export_commands(commands)
    for command in exports:
        command.set_defaults(command_kind="export")
    for command in (to_hf, *exports):
        command.add_argument("--overwrite", action="store_true",
                             help="DST may hold an earlier export: its model and tokenizer files are replaced (files "
                                  "of other kinds are left alone)")
    for command in (from_hf, *converter_commands(commands)):
        command.add_argument("--step", type=int, default=0, help="step number to record")
        command.add_argument("--no_scan_layers", dest="scan_layers", action="store_false",
                             help="record scan_layers=False: readers run the blocks unrolled (the checkpoint "
                                  "holds them stacked either way)")
        command.add_argument("--vocab_pad_multiple", type=int, default=128,
                             help="pad the vocabulary to a multiple of this (padding rows are zeros)")
        command.add_argument("--dtype", default="float32", choices=sorted(models.DTYPES),
                             help="compute dtype recorded in the model config (weights stay float32)")
    return parser.parse_args(argv)


def converter_commands(commands) -> list[argparse.ArgumentParser]:
    """The import commands converters add for their upstream's own checkpoints (`add_import_command`, e.g.
    from-neox), each running through its `run_import`."""
    return [converter.add_import_command(commands) for converter in hf.FAMILIES.values()
            if hasattr(converter, "add_import_command")]


def export_commands(commands) -> list[argparse.ArgumentParser]:
    """The export commands converters add for their upstream's own checkpoints (`add_export_command`, e.g.
    to-modelcenter), each running through its `run_export` (which returns what it wrote, for the user)."""
    return [converter.add_export_command(commands) for converter in hf.FAMILIES.values()
            if hasattr(converter, "add_export_command")]


def import_hf(args: argparse.Namespace) -> str:
    """The from-hf command: the checkpoint's path."""
    return hf.from_hf(args.src, args.dst, step=args.step, scan_layers=args.scan_layers,
                      vocab_pad_multiple=args.vocab_pad_multiple, dtype=args.dtype)


def check_arguments(args: argparse.Namespace) -> None:
    """Refuse bad values and unwritable outputs before converting anything."""
    if args.command == "to-hf":
        checks.output_dir("DST", args.dst, new_folder_for="the Hugging Face files")
        refuse_a_folder_in_use(args.dst, args.overwrite, args.command)
    elif args.command == "to-torch":
        checks.output_file("FILE", args.file)
    elif getattr(args, "command_kind", None) == "export":
        checks.output_dir("DST", args.dst, new_folder_for="the exported files")
        refuse_a_folder_in_use(args.dst, args.overwrite, args.command)
    else:
        checks.non_negative_int("--step", args.step)
        checks.positive_int("--vocab_pad_multiple", args.vocab_pad_multiple)
        checks.output_dir("DST", args.dst)
        refuse_existing_checkpoints(args.dst)


def refuse_a_folder_in_use(dst: str, overwrite: bool, command: str) -> None:
    """to-hf and the exports (to-modelcenter) write into an empty or new folder; one holding files (another model's
    export, anything else) only with --overwrite, and then the earlier export's files go first (hf.remove_export)."""
    held = sorted(os.listdir(dst)) if os.path.isdir(dst) else []
    if held and not overwrite:
        shown = ", ".join(held[:4]) + (", ..." if len(held) > 4 else "")
        raise UserError(f"DST={dst} already holds files ({shown}); {command} writes into a new or empty folder: "
                        "give another DST, or add --overwrite to replace the model there.")
    if held:
        hf.remove_export(dst)


def refuse_existing_checkpoints(dst: str) -> None:
    """A converter writes a new MODEL_DIR: never a step into a training run (or another import)."""
    directory = os.path.join(dst, store.CHECKPOINT_SUBDIR)
    steps = sorted(int(n) for n in os.listdir(directory) if n.isdigit()) if os.path.isdir(directory) else []
    if steps or os.path.exists(os.path.join(dst, "metrics.jsonl")):
        held = f"checkpoints (steps {', '.join(map(str, steps[-3:]))})" if steps else "a training run (metrics.jsonl)"
        raise UserError(f"DST={dst} already holds {held}; a converted checkpoint goes into a new directory: give "
                        "another DST, then fine-tune from it with --gin.RESTORE_FROM=\"'DST'\".")


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    check_arguments(args)
    if args.command == "to-hf":
        hf.to_hf(args.src, args.dst, args.tokenizer)
        print(f"wrote {args.dst} (config.json, model.safetensors and the tokenizer's files)")
    elif args.command == "to-torch":
        hf.to_torch(args.src, args.file)
        print(f"wrote {args.file}")
    elif getattr(args, "command_kind", None) == "export":
        print(f"wrote {args.run_export(args)}")
    else:  # from-hf, or an import a converter adds
        print(f"wrote {args.run_import(args)}")


if __name__ == "__main__":
    exit_on_user_error(main)()
