"""Loading a checkpoint for inference (shared by eval, generate and convert): its model config and
tokenizer, its parameters restored sharded onto a mesh chosen by command-line flags."""
from __future__ import annotations

import argparse
import dataclasses
import math
import os
import sys
from typing import Any, Callable

import jax
import numpy as np

import models
from partitioning import Partitioner, make_mesh
from partitioning.mesh import can_simulate, too_few_devices
from t5x_like import checks
from t5x_like.checkpoint import store
from t5x_like.cluster import processes
from t5x_like.data.tokenizer import load_user_tokenizer
from t5x_like.data.tokenizer_files import recorded_tokenizer_path
from t5x_like.errors import UserError
from t5x_like.lm import make_lm


def read_config(checkpoint: str):
    """(model config, a path that loads the tokenizer the checkpoint records, or None) of a checkpoint
    (MODEL_DIR or step dir)."""
    info = store.read_model_info(checkpoint)
    if not info.get("config"):
        raise UserError(f"checkpoint {checkpoint} records no model config; it was not written by "
                        "t5x_like.train or t5x_like.convert. Re-save it with a current version.")
    return models.config_from_dict(info["config"]), recorded_tokenizer_path(info.get("tokenizer"))


def open_tokenizer(path: str | None, config, checkpoint: str = "", flag: str = "--tokenizer"):
    """The tokenizer at `path` (the value of `flag`, or else the one `checkpoint` records), checked to fit the
    model's vocabulary."""
    if not path:
        raise UserError(f"checkpoint {checkpoint} records no tokenizer; pass --tokenizer=PATH.")
    if flag != "--tokenizer" and not os.path.exists(path.removeprefix("cpm:")):  # recorded by an older version
        raise UserError(f"{flag} is {path}, which does not exist (the checkpoint was written by an older version "
                        "that recorded the path as typed); pass --tokenizer=PATH.")
    tokenizer = load_user_tokenizer(flag, path)
    if tokenizer.vocab_size > config.vocab_size:
        raise UserError(f"tokenizer {path} has {tokenizer.vocab_size} ids but the model's vocab_size is "
                        f"{config.vocab_size}: it is not this model's tokenizer. Pass the tokenizer the model "
                        "was trained with (--tokenizer).")
    return tokenizer


def checkpoint_tokenizer(checkpoint: str, config, override: str | None = None):
    """`override` (--tokenizer) when given, else the tokenizer the checkpoint records."""
    if override:
        return open_tokenizer(override, config, checkpoint)
    return open_tokenizer(read_config(checkpoint)[1], config, checkpoint,
                          flag=f"the tokenizer checkpoint {checkpoint} records")


MAX_UNUSED_VOCAB_ROWS = 1024
"""Embedding rows past a model's tokenizer: models pad their vocabulary (GPT-NeoX-20B 50277 -> 50432, T5
32100 -> 32128), but by fewer rows than this."""


def check_tokenizer_matches(checkpoint: str, tokenizer, config, flag: str = "--tokenizer"):
    """`tokenizer` (given by `flag`), refused when it is not the one the checkpoint was trained with: another
    sha256 than the one it records (or than the recorded path's, for older records), or, with nothing recorded
    to compare, far fewer ids than the model's vocabulary (as the converters refuse it)."""
    record = store.read_model_info(checkpoint).get("tokenizer")
    recorded = record if isinstance(record, dict) else None
    if recorded is None and isinstance(record, str) and os.path.exists(record.removeprefix("cpm:")):
        loaded = load_user_tokenizer(f"the tokenizer checkpoint {checkpoint} records", record)
        recorded = {"path": record, "sha256": loaded.sha256, "vocab_size": loaded.vocab_size}
    if recorded and recorded.get("sha256") != tokenizer.sha256:
        raise UserError(
            f"{flag}={tokenizer.path} is another vocabulary than the one checkpoint {checkpoint} was trained with "
            f"({recorded['path']}: {recorded['vocab_size']} ids, sha256 {recorded['sha256'][:12]}…; this one: "
            f"{tokenizer.vocab_size} ids, sha256 {tokenizer.sha256[:12]}…), so its ids mean other text to the model; "
            "leave out --tokenizer to use the recorded one, or pass that tokenizer.")
    unused = config.vocab_size - tokenizer.vocab_size
    if not recorded and unused > MAX_UNUSED_VOCAB_ROWS:
        raise UserError(f"{flag}={tokenizer.path} has {tokenizer.vocab_size} ids but the model's vocab_size is "
                        f"{config.vocab_size}, so {unused} embedding rows would never be used: it is not this "
                        "model's tokenizer. Pass the tokenizer the model was trained with.")
    return tokenizer


def abstract_params(config) -> tuple[Any, Any]:
    """(unboxed ShapeDtypeStructs, logical PartitionSpecs) of the model's parameters."""
    return make_lm(config).abstract_params()


def restore_params(checkpoint: str, config, shardings_for: Callable[[Any], Any]) -> Any:
    """The checkpoint's parameters laid out by `shardings_for(logical specs)` (any mesh)."""
    abstract, specs = abstract_params(config)
    return store.restore_params(checkpoint, store.with_shardings(abstract, shardings_for(specs)))


def restore_sharded(checkpoint: str, config, partitioner: Partitioner) -> Any:
    """Parameters sharded by the partitioner's rules, after checking every dimension divides."""
    abstract, specs = abstract_params(config)
    partitioner.check_divisible(abstract, specs)
    return restore_params(checkpoint, config, partitioner.shardings)


def add_mesh_flags(parser: argparse.ArgumentParser) -> None:
    """The mesh flags, and the multi-host flags train takes (auto-detected on SLURM and TPU pods)."""
    parser.add_argument("--coordinator_address", default=None, help="multi-host: host:port of process 0")
    parser.add_argument("--num_processes", type=int, default=None, help="multi-host: number of processes")
    parser.add_argument("--process_id", type=int, default=None, help="multi-host: this process's index")
    parser.add_argument("--heartbeat_timeout_seconds", type=int, default=processes.HEARTBEAT_TIMEOUT_SECONDS,
                        help="multi-host: a process silent this long is declared dead; the others exit")
    parser.add_argument("--initialization_timeout_seconds", type=int,
                        default=processes.INITIALIZATION_TIMEOUT_SECONDS,
                        help="multi-host: how long to wait for every process to connect; then exit naming the missing")
    parser.add_argument("--data_parallel", type=int, default=-1, help="mesh 'data' size (-1 = fill)")
    parser.add_argument("--fsdp_parallel", type=int, default=1, help="mesh 'fsdp' size")
    parser.add_argument("--tensor_parallel", type=int, default=1, help="mesh 'tensor' size")
    parser.add_argument("--rules", default="fsdp_tensor", help="logical-axis rule set (partitioning/rules.py)")
    parser.add_argument("--dtype", default=None, choices=sorted(models.DTYPES),
                        help="compute dtype (default: the checkpoint's; on CPU float32 for a float16/bfloat16 one)")


MESH_FLAGS = ("data_parallel", "fsdp_parallel", "tensor_parallel")


def check_flags(args: argparse.Namespace) -> None:
    """The mesh and multi-host flags, checked before anything is loaded (in flag names, with the fix)."""
    checks.positive_int("--heartbeat_timeout_seconds", args.heartbeat_timeout_seconds)
    checks.positive_int("--initialization_timeout_seconds", args.initialization_timeout_seconds)
    if args.num_processes is not None:
        checks.positive_int("--num_processes", args.num_processes)
    if args.process_id is not None:
        checks.non_negative_int("--process_id", args.process_id)
    check_mesh_flags(args)


def check_mesh_flags(args: argparse.Namespace) -> None:
    """The mesh sizes, the rule set and the compute dtype."""
    from partitioning import rules

    sizes = {f"--{name}": checks.integer(f"--{name}", getattr(args, name)) for name in MESH_FLAGS}
    given = " ".join(f"{flag}={size}" for flag, size in sizes.items())
    if any(size < 1 and size != -1 for size in sizes.values()) or list(sizes.values()).count(-1) > 1:
        raise UserError(f"{given}: mesh sizes are positive, or -1 for one of them to fill the devices.")
    checks.one_of("--rules", args.rules, tuple(rules.RULE_SETS))
    if args.dtype is not None:
        checks.one_of("--dtype", args.dtype, tuple(sorted(models.DTYPES)))


def check_mesh_fits(args: argparse.Namespace) -> None:
    """The mesh flags against the devices (all processes' devices: call it after join_cluster)."""
    sizes = [getattr(args, name) for name in MESH_FLAGS]
    known, devices = math.prod(size for size in sizes if size != -1), jax.device_count()
    given = " ".join(f"--{name}={size}" for name, size in zip(MESH_FLAGS, sizes))
    if known > devices:
        raise UserError(f"{given}: {too_few_devices(known, devices, can_simulate(jax.devices()))}")
    if (devices % known) if -1 in sizes else (known != devices):
        raise UserError(f"{given}: the sizes multiply to {known}, which does not "
                        f"{'divide' if -1 in sizes else 'equal'} the {devices} devices here; choose sizes whose "
                        "product is the device count, or leave one at -1 (fill).")


def partitioner_from(args: argparse.Namespace) -> Partitioner:
    check_mesh_fits(args)
    mesh = make_mesh(data=args.data_parallel, fsdp=args.fsdp_parallel, tensor=args.tensor_parallel)
    return Partitioner(mesh, args.rules)


def join_cluster(args: argparse.Namespace) -> None:
    """Start jax.distributed from the multi-host flags or the environment (nothing for one process).
    Every process then loads the model sharded over all processes' devices and computes the same
    results; only process 0 (distributed.is_primary) prints and writes files."""
    processes.initialize(args.coordinator_address, args.num_processes, args.process_id,
                           initialization_timeout=args.initialization_timeout_seconds,
                           heartbeat_timeout_seconds=args.heartbeat_timeout_seconds)


EMULATED_ON_CPU = ("float16", "bfloat16")
"""Compute dtypes a CPU has no fast arithmetic for: XLA emulates them (a small GPT-2's forward pass: float16 1.3x,
bfloat16 1.4x float32's time on the development machine's CPU)."""


def compute_config(args: argparse.Namespace, *, announce: bool = False):
    """The checkpoint's model config in the compute dtype of this run: --dtype when given, else the recorded one,
    except where the devices are CPUs and it is float16/bfloat16 (emulated there): float32, which `announce`
    says in one line (process 0). Parameters are float32 either way."""
    config, _ = read_config(args.checkpoint)
    dtype = args.dtype or config.dtype
    if not args.dtype and config.dtype in EMULATED_ON_CPU and jax.default_backend() == "cpu":
        dtype = "float32"
        if announce and processes.is_primary():
            print(f"compute dtype: float32 (checkpoint {args.checkpoint} records {config.dtype}, which CPUs only "
                  f"emulate, more slowly; --dtype={config.dtype} keeps it)", file=sys.stderr, flush=True)
    return dataclasses.replace(config, dtype=dtype) if dtype != config.dtype else config


def load_for_inference(args: argparse.Namespace, *, with_tokenizer: bool = True):
    """(config, params, tokenizer or None, partitioner) for the --checkpoint / --tokenizer / mesh flags, the config
    in the run's compute dtype (compute_config)."""
    config = compute_config(args, announce=True)
    tokenizer = checkpoint_tokenizer(args.checkpoint, config, args.tokenizer) \
        if with_tokenizer or args.tokenizer else None
    if args.tokenizer:  # checked against the checkpoint's even where the task does not use it
        check_tokenizer_matches(args.checkpoint, tokenizer, config)
    partitioner = partitioner_from(args)
    return config, restore_sharded(args.checkpoint, config, partitioner), tokenizer, partitioner


def global_array(rows: np.ndarray, sharding) -> jax.Array:
    """A host array (the same on every host) laid out as `sharding`."""
    return jax.make_array_from_callback(rows.shape, sharding, lambda index: rows[index])
