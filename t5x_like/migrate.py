"""`python -m t5x_like.migrate`: an upstream run's configuration -> a gin run file that trains the same model and
recipe here.

    python -m t5x_like.migrate run_gpt2.sh --deepspeed_config=ds_config_gpt2.json --output=cpm.gin
    python -m t5x_like.migrate train_gpt3_175b.sh --output=gpt3.gin -- ckpts tb vocab.json merges.txt corpus
    python -m t5x_like.migrate configs/20B.yml configs/local_setup.yml --num_gpus=96 --output=neox20b.gin
    python -m t5x_like.train --gin_file=cpm.gin --print_config

It reads Megatron-LM / CPM-Pretrain argument lists (a script that starts pretrain_*.py, or a file of --flag value
words), GPT-NeoX YAML configs (several merge as NeoX merges them) and DeepSpeed JSON configs, each kind told from
its content. Words after `--` are the script's own arguments, as `bash SCRIPT ARG...` would give them ($1, $2,
"$@", shift); paths among them are kept as written, as the script's own paths are. Every value in the gin file
names the upstream setting it came from; settings with no equivalent are listed at its end with the reason. The
global batch is DeepSpeed's train_batch_size, or micro batch x accumulation steps x data-parallel ways: when the
files do not say how many GPUs ran them (NeoX configs, a launcher without a count), pass --num_gpus.
`--settings_table` prints docs/migrating.md's tables of every setting and its equivalent here.
"""
from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Sequence

from t5x_like import checks
from t5x_like.errors import UserError, exit_on_user_error
from t5x_like.migration import rows, translate, upstream


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    """The options, and the script's own arguments (the words after `--`) as `script_arguments`."""
    argv = list(argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    parser = argparse.ArgumentParser(prog="python -m t5x_like.migrate", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("upstream", nargs="*", help="Megatron-LM script or flags file, GPT-NeoX YAML file(s), "
                        "DeepSpeed JSON config; after `--`, the script's own arguments ($1, $2, ...)")
    parser.add_argument("--deepspeed_config", default=None,
                        help="the run's DeepSpeed JSON config (default: the one the script names, if it exists)")
    parser.add_argument("--num_gpus", type=int, default=None,
                        help="GPUs the upstream run used (default: the launcher's count, when it gives one)")
    parser.add_argument("--output", default=None, help="the gin file to write (default: print it)")
    parser.add_argument("--settings_table", action="store_true",
                        help="print the tables of upstream settings and their equivalents here, then exit")
    args, unknown = parser.parse_known_args(argv[:cut])
    args.script_arguments = argv[cut + 1:]
    if unknown:
        raise UserError(f"unrecognized arguments: {' '.join(unknown)}; {script_arguments_hint(args, unknown)}")
    return args


def script_arguments_hint(args: argparse.Namespace, words: list[str]) -> str:
    """How to give `words` as the launch script's own arguments: after `--` (`--help` lists migrate's options)."""
    script = next(iter(args.upstream), "SCRIPT")
    return (f"a launch script's own arguments ($1, $2, ...) go after `--`: python -m t5x_like.migrate {script} "
            f"-- {shlex.join(args.script_arguments + words)} (`--help` lists migrate's own options).")


def check_upstream_files(args: argparse.Namespace) -> None:
    """Every upstream file exists; a word that is no file after a script is likely one of its arguments."""
    for k, path in enumerate(args.upstream):
        if not os.path.exists(path):
            hint = script_arguments_hint(args, args.upstream[k:]) if k and os.path.isfile(args.upstream[0]) else \
                "check the path."
            raise UserError(f"{path}: no such file; {hint}")


def settings_tables() -> str:
    translate.load_translations()
    return "\n\n".join(f"### {rows.TOOL_TITLES[tool]}\n\n{table}" for tool, table in rows.tables().items()) + "\n"


@exit_on_user_error
def main(argv: Sequence[str] | None = None) -> str:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.settings_table:
        sys.stdout.write(settings_tables())
        return ""
    if not args.upstream:
        raise SystemExit("python -m t5x_like.migrate: give the upstream file(s) to migrate (--help shows how).")
    if args.num_gpus is not None:
        checks.positive_int("--num_gpus", args.num_gpus)
    if args.output:
        checks.output_file("--output", args.output, suffixes=(".gin",))
    check_upstream_files(args)
    read = upstream.read(args.upstream, args.deepspeed_config, arguments=args.script_arguments, gpus=args.num_gpus)
    out = translate.translate(read)
    command = shlex.join(["python", "-m", "t5x_like.migrate", *(sys.argv[1:] if argv is None else argv)])
    text = translate.render(out, command)
    if not args.output:
        sys.stdout.write(text)
        return text
    with open(args.output, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {args.output}: {len(out.bindings) + len(out.overrides)} settings; {len(out.skipped)} upstream "
          f"settings have no equivalent (listed at its end). Check it with:\n"
          f"  python -m t5x_like.train --gin_file={args.output} --print_config")
    return text


if __name__ == "__main__":
    main()
