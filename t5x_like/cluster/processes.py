"""Multi-host initialisation.

`initialize()` works out who this process is, from (in order) explicit flags, the JAX_* environment
variables, a SLURM `srun` step, or a Cloud TPU VM (jax's own cluster detection), and starts
`jax.distributed` with bounded timeouts; with none of these it does nothing (one process). A process
that waits longer than `--initialization_timeout_seconds` for the others exits with one line naming
who is missing; once connected, t5x_like.cluster.agreement watches the others (`--heartbeat_timeout_seconds`).
`is_primary()` says whether this process writes metrics, TensorBoard and the config.
"""
from __future__ import annotations

import dataclasses
import glob
import importlib.util
import os
import re
import sys
import threading
from collections.abc import Mapping

import jax
from absl import logging

from t5x_like import checks
from t5x_like.cluster import peers

# jax's SLURM convention: a port derived from the job id, in the top 4096 ports, unless
# JAX_COORDINATOR_PORT says otherwise; every task of the step computes the same one.
_SLURM_PORT_BASE = 65536 - 4096
HEARTBEAT_TIMEOUT_SECONDS = 100
INITIALIZATION_TIMEOUT_SECONDS = 300
BACKSTOP_S = 30  # jax's own connection timeout comes this much after ours (it aborts with a C++ stack dump)


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
    """Where this process sits in a multi-process job, and what told us so.

    `coordinator_address`, `num_processes` and `process_id` are None only for a TPU VM, where jax's own
    cluster detection fills them in from the TPU metadata.
    """
    source: str
    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    local_device_ids: tuple[int, ...] | None = None


def connect(spec, initialization_timeout: int, heartbeat_timeout_seconds: int) -> None:
    """jax.distributed.initialize for the job `spec` describes; past `initialization_timeout`, one line naming the
    process that did not connect (jax's own timeouts, which abort with a C++ stack dump, come later)."""
    deadline = threading.Timer(initialization_timeout, _not_connected, (spec, initialization_timeout))
    deadline.daemon = True
    deadline.start()
    try:
        jax.distributed.initialize(
            coordinator_address=spec.coordinator_address, num_processes=spec.num_processes,
            process_id=spec.process_id,
            local_device_ids=list(spec.local_device_ids) if spec.local_device_ids is not None else None,
            # Once we have resolved the job ourselves, stop jax from re-detecting SLURM, which would
            # restrict every process to one GPU even when one process drives all GPUs of its node.
            cluster_detection_method=None if spec.coordinator_address is None else 'deactivate',
            initialization_timeout=initialization_timeout + BACKSTOP_S,
            heartbeat_timeout_seconds=peers.jax_heartbeat_timeout(heartbeat_timeout_seconds))
    finally:
        deadline.cancel()


def initialize(coordinator_address: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, initialization_timeout: int = INITIALIZATION_TIMEOUT_SECONDS,
               heartbeat_timeout_seconds: int = HEARTBEAT_TIMEOUT_SECONDS) -> None:
    """Starts jax.distributed for this process, or does nothing for a single-process run.

    Call before any other JAX call. Explicit arguments win and must come as a full set; otherwise the
    job is detected from the environment (see `detect_cluster`). A second call is a no-op.

    Args:
      coordinator_address: 'host:port' of process 0's coordination service.
      num_processes: total number of processes in the job.
      process_id: this process's index, 0 <= process_id < num_processes.
      initialization_timeout: seconds to wait for every process to connect; then this process exits
        with one line naming the missing process and --initialization_timeout_seconds.
      heartbeat_timeout_seconds: seconds without a heartbeat after which a process is declared dead
        and every other process exits with one line naming it (t5x_like.cluster.agreement).
    """
    checks.positive_int("--initialization_timeout_seconds", initialization_timeout)
    checks.positive_int("--heartbeat_timeout_seconds", heartbeat_timeout_seconds)
    if jax.distributed.is_initialized():
        logging.info('distributed: already initialised (process %d of %d); nothing to do.',
                     jax.process_index(), jax.process_count())
        return
    spec = detect_cluster(coordinator_address, num_processes, process_id, os.environ)
    if spec is None:
        logging.info('distributed: no multi-process job detected; running as a single process.')
        return
    logging.info('distributed: %s -> coordinator=%s num_processes=%s process_id=%s local_device_ids=%s',
                 spec.source, spec.coordinator_address, spec.num_processes, spec.process_id,
                 spec.local_device_ids)
    connect(spec, initialization_timeout, heartbeat_timeout_seconds)
    peers.watch(heartbeat_timeout_seconds)
    logging.info('distributed: process %d of %d connected; %d local / %d global devices.',
                 jax.process_index(), jax.process_count(), jax.local_device_count(), jax.device_count())


def _not_connected(spec: ClusterSpec, timeout: int) -> None:
    """The initialisation deadline passed: one line naming who did not connect, then exit 1 (jax's own
    timeout, later, would abort with a C++ stack dump)."""
    print(f"error: {not_connected_message(spec, timeout)}", file=sys.stderr, flush=True)
    logging.flush()
    os._exit(1)


def not_connected_message(spec: ClusterSpec, timeout: int) -> str:
    """Which process(es) did not connect within `timeout` s, as far as this process can tell."""
    count, me = spec.num_processes, spec.process_id
    where = f"the coordinator at {spec.coordinator_address}" if spec.coordinator_address else "the coordinator"
    if me is None:
        missing = "not every process of the TPU slice connected"
    elif me == 0:
        missing = "process 1 did not connect" if count == 2 else f"not all of processes 1-{count - 1} connected"
    else:
        missing = (f"process 0 ({where}) did not answer" if count == 2 else
                   f"process 0 ({where}) or another of the {count} processes did not connect")
    return (f"{'this process' if me is None else f'process {me}'}: {missing} within {timeout} s: a process did not "
            f"start, or cannot reach {where}. Start every process with the same --coordinator_address and "
            "--num_processes and a distinct --process_id, or raise --initialization_timeout_seconds "
            f"(now {timeout}) if some start later.")


def detect_cluster(coordinator_address: str | None, num_processes: int | None,
                   process_id: int | None, environ: Mapping[str, str]) -> ClusterSpec | None:
    """Resolves the job from explicit values, then JAX_* variables, SLURM, a TPU VM; None = one process."""
    explicit = _from_explicit(coordinator_address, num_processes, process_id)
    spec = explicit or _from_jax_env(environ) or _from_slurm(environ) or _from_tpu_vm(environ)
    if spec is None or spec.num_processes == 1:
        return None
    if spec.coordinator_address is None:
        return spec
    return dataclasses.replace(spec, local_device_ids=_slurm_local_device_ids(environ))


def _from_explicit(coordinator_address: str | None, num_processes: int | None,
                   process_id: int | None) -> ClusterSpec | None:
    values = {'--coordinator_address': coordinator_address, '--num_processes': num_processes,
              '--process_id': process_id}
    return _complete_spec('flags', values)


def _from_jax_env(environ: Mapping[str, str]) -> ClusterSpec | None:
    names = ('JAX_COORDINATOR_ADDRESS', 'JAX_NUM_PROCESSES', 'JAX_PROCESS_ID')
    values = {name: environ.get(name) or None for name in names}
    for name in names[1:]:
        values[name] = _parse_int(name, values[name])
    return _complete_spec('JAX_* environment variables', values)


def _complete_spec(source: str, values: dict[str, str | int | None]) -> ClusterSpec | None:
    """A spec from a (coordinator, num_processes, process_id) set; None if empty, error if partial."""
    missing = [name for name, value in values.items() if value is None]
    if len(missing) == len(values):
        return None
    if missing:
        given = ', '.join(f'{name}={value!r}' for name, value in values.items() if value is not None)
        raise ValueError(f'Multi-host setup from {source} is incomplete: got {given} but not '
                         f'{", ".join(missing)}. Set all of {", ".join(values)} (the same coordinator and '
                         'process count on every process, a distinct process id on each), or none of '
                         'them to auto-detect TPU pods and SLURM.')
    coordinator, count, index = values.values()
    _check_spec(source, str(coordinator), int(count), int(index))
    return ClusterSpec(source, str(coordinator), int(count), int(index))


def _check_spec(source: str, coordinator_address: str, num_processes: int, process_id: int) -> None:
    if not re.fullmatch(r'.+:\d+', coordinator_address):
        raise ValueError(f'coordinator address {coordinator_address!r} (from {source}) has no port; '
                         "write it as 'host:port', e.g. '10.0.0.1:8476'.")
    if num_processes < 1:
        raise ValueError(f'num_processes={num_processes} (from {source}) must be >= 1.')
    if not 0 <= process_id < num_processes:
        raise ValueError(f'process_id={process_id} (from {source}) must be in [0, {num_processes}); '
                         'process ids run 0 .. num_processes-1.')


def _parse_int(name: str, value: str | None) -> int | None:
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f'{name}={value!r} is not an integer; set it to a whole number.') from None


def _from_slurm(environ: Mapping[str, str]) -> ClusterSpec | None:
    """The job as SLURM's `srun` describes it to each task (SLURM_LOCALID is set only under srun)."""
    required = ('SLURM_JOB_ID', 'SLURM_NTASKS', 'SLURM_PROCID', 'SLURM_LOCALID')
    nodelist = environ.get('SLURM_STEP_NODELIST') or environ.get('SLURM_JOB_NODELIST')
    if nodelist is None or any(name not in environ for name in required):
        return None
    port = environ.get('JAX_COORDINATOR_PORT') or str(
        _SLURM_PORT_BASE + int(environ['SLURM_JOB_ID']) % 4096)
    return ClusterSpec(
        source='SLURM',
        coordinator_address=f'{first_slurm_host(nodelist)}:{port}',
        num_processes=int(environ['SLURM_NTASKS']),
        process_id=int(environ['SLURM_PROCID']),
    )


def first_slurm_host(nodelist: str) -> str:
    """The first host of a SLURM hostlist, as `scontrol show hostnames` would print it first.

    'gpu-[003-010,012],cpu01' -> 'gpu-003'; 'rack[1-2]-n[01-04]' -> 'rack1-n01'.
    """
    first_item = re.match(r'(?:[^,\[]|\[[^\]]*\])+', nodelist)
    if first_item is None:
        raise ValueError(f'cannot read a host from SLURM nodelist {nodelist!r}; expected e.g. '
                         "'node[01-04]' or 'node01,node02'.")
    return re.sub(r'\[([^\],-]+)[^\]]*\]', r'\1', first_item.group(0))


def _slurm_local_device_ids(environ: Mapping[str, str]) -> tuple[int, ...] | None:
    """One GPU per process when SLURM runs several tasks per node; all local GPUs otherwise.

    Applies whatever gave the coordinator (flags, JAX_* variables or SLURM itself), since the tasks per
    node decide it. Left to CUDA_VISIBLE_DEVICES when SLURM (e.g. --gpus-per-task=1) already shows each
    task a single GPU.
    """
    if 'SLURM_LOCALID' not in environ or 'SLURM_NTASKS' not in environ:
        return None
    nodes = (environ.get('SLURM_STEP_NUM_NODES') or environ.get('SLURM_JOB_NUM_NODES')
             or environ.get('SLURM_NNODES') or '1')
    visible_gpus = environ.get('CUDA_VISIBLE_DEVICES')
    if int(environ['SLURM_NTASKS']) <= int(nodes) or (visible_gpus is not None and ',' not in visible_gpus):
        return None
    return (int(environ['SLURM_LOCALID']),)


def _from_tpu_vm(environ: Mapping[str, str]) -> ClusterSpec | None:
    """A Cloud TPU VM (libtpu installed and TPU chips attached): jax reads the pod from its metadata."""
    platforms = environ.get('JAX_PLATFORMS', '')
    if platforms and 'tpu' not in platforms:
        return None
    has_chips = bool(glob.glob('/dev/accel*') or glob.glob('/dev/vfio/[0-9]*'))
    if not has_chips or importlib.util.find_spec('libtpu') is None:
        return None
    return ClusterSpec(source='Cloud TPU VM (jax cluster detection)')


def is_primary() -> bool:
    """True on process 0, the one process that writes metrics, TensorBoard and the config."""
    return jax.process_index() == 0
