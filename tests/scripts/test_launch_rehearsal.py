"""The launchers rehearsed for real: each starts a 2-process training job on this machine, through its code.

Stand-ins replace only the cluster tools (`sbatch`, `srun`, `scontrol`; `gcloud compute tpus tpu-vm
scp/ssh --worker=all`, and `uv`, which would download packages); each is a small file written here, first
on PATH, that starts local processes with the environment the real tool gives them. The quickstart model
trains 3 steps on CPU (gloo): both processes exit 0, process 0 alone writes metrics.jsonl, and both write
the checkpoint.
"""
import ctypes
import json
import os
import pathlib
import signal
import stat
import subprocess
import sys
import time

import pytest

from t5x_like.data import builtin
from tests.support.cli import free_port
from tests.support.environment import XLA_CPU_FLAGS

pytestmark = pytest.mark.system

REPO = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = REPO / 'scripts'
# Each process has one CPU device and the suite's XLA flags (single-threaded Eigen, the cheapest code generation).
XLA_FLAGS = f'--xla_force_host_platform_device_count=1 {XLA_CPU_FLAGS}'
TRAIN_ARGS = ['--gin_file=quickstart.gin', '--gin.TRAIN_STEPS=3', '--gin.WARMUP_STEPS=1',
              '--gin.BATCH_SIZE=8', '--gin.SEQ_LEN=32', '--gin.EVAL_EVERY=0', '--gin.train.log_every=1',
              '--gin.DATA_PARALLEL=-1', "--gin.model_config.overrides={'num_layers': 2}"]
TIMEOUT = 240  # seconds; a run takes ~70 s on 2 busy cores, under pytest's own 300 s limit
# The cluster a CI machine might itself run under must not leak into the rehearsal.
CLUSTER_VARIABLES = ('JAX_COORDINATOR_ADDRESS', 'JAX_NUM_PROCESSES', 'JAX_PROCESS_ID', 'JAX_COORDINATOR_PORT')


def _executable(path: pathlib.Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC)


def _kill_group(process: subprocess.Popen) -> None:
    """Ends what a launcher left running (a log stream, or everything after a failure)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:  # all of it has exited
        pass
    process.wait()


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith('SLURM_') and k not in CLUSTER_VARIABLES}
    return {**env, **extra}


def _assert_trained_once(model_dir: pathlib.Path, output: str) -> None:
    """Steps 1-3 logged once (process 0 alone writes metrics), and the checkpoint of step 3 written."""
    with open(model_dir / 'metrics.jsonl') as f:
        steps = [row['step'] for row in map(json.loads, f) if 'loss' in row]
    assert steps == [1, 2, 3], output[-4000:]
    assert os.listdir(model_dir / 'checkpoints') == ['3'], output[-4000:]
    assert os.listdir(model_dir / 'checkpoints' / '3'), output[-4000:]


# --- SLURM: scripts/slurm_launch.sh -> sbatch scripts/slurm_gpu.sbatch -> srun ------------------------------

SBATCH = r'''#!/usr/bin/env bash
# Stand-in for sbatch: a one-node allocation on this machine (nodelist 'localhost'). Like sbatch it reads
# the script's #SBATCH lines (the command line wins), runs a spooled copy of the script from the submit
# directory with the variables a batch job gets, and writes its output to --output (%x, %j expanded; a
# relative name lands in the spool, not the repository). Unlike sbatch it waits for the job (`--wait`).
set -euo pipefail
options=()
while [[ "$1" == --* ]]; do options+=("$1"); shift; done
script="$1"; shift
nodes=1 tasks_per_node=1 job_name=sbatch output='slurm-%j.out'
for option in $(sed -n 's/^#SBATCH //p' "$script") "${options[@]}"; do
  case "$option" in
    --nodes=*) nodes="${option#*=}" ;;
    --ntasks-per-node=*) tasks_per_node="${option#*=}" ;;
    --job-name=*) job_name="${option#*=}" ;;
    --output=*) output="${option#*=}" ;;
  esac
done
[[ "$nodes" == 1 ]] || { echo "sbatch stand-in: this machine is one node (got --nodes=$nodes)" >&2; exit 1; }
job_id=$$
spool="@SPOOL@/job$job_id"
mkdir -p "$spool"
cp "$script" "$spool/slurm_script"
chmod +x "$spool/slurm_script"
output="${output//%x/$job_name}"
output="$spool/${output//%j/$job_id}"
echo "Submitted batch job $job_id"
export SLURM_JOB_ID=$job_id SLURM_JOBID=$job_id SLURM_JOB_NAME=$job_name SLURM_SUBMIT_DIR="$PWD" \
  SLURM_SUBMIT_HOST="$(hostname)" SLURM_JOB_NODELIST=localhost SLURM_NODELIST=localhost \
  SLURM_JOB_NUM_NODES=1 SLURM_NNODES=1 SLURM_NTASKS=$tasks_per_node SLURM_NPROCS=$tasks_per_node \
  SLURM_NTASKS_PER_NODE=$tasks_per_node SLURM_TASKS_PER_NODE=$tasks_per_node \
  SLURM_NODEID=0 SLURM_PROCID=0 SLURM_LOCALID=0
"$spool/slurm_script" "$@" > "$output" 2>&1
'''

SRUN = r'''#!/usr/bin/env bash
# Stand-in for srun in a job step: starts the job's SLURM_NTASKS tasks at once on this machine, each
# with the variables srun gives a task; reports a failed task and, under --kill-on-bad-exit=1, ends
# the others, as srun does; exits with the first failure's status.
set -uo pipefail
kill_on_bad_exit=0
while [[ "$1" == -* ]]; do [[ "$1" != --kill-on-bad-exit=1 ]] || kill_on_bad_exit=1; shift; done
declare -A task_of
for ((task = 0; task < SLURM_NTASKS; task++)); do
  SLURM_STEP_ID=0 SLURM_STEPID=0 SLURM_PROCID=$task SLURM_LOCALID=$((task % SLURM_NTASKS_PER_NODE)) \
    SLURM_NODEID=$((task / SLURM_NTASKS_PER_NODE)) SLURM_STEP_NODELIST=$SLURM_JOB_NODELIST \
    SLURM_STEP_NUM_NODES=$SLURM_JOB_NUM_NODES SLURM_STEP_NUM_TASKS=$SLURM_NTASKS \
    SLURM_STEP_TASKS_PER_NODE=$SLURM_NTASKS_PER_NODE SLURMD_NODENAME=localhost "$@" &
  task_of[$!]=$task
done
status=0
for _ in "${!task_of[@]}"; do
  wait -n -p pid; code=$?
  if ((code)); then
    echo "srun: error: localhost: task ${task_of[$pid]}: Exited with exit code $code" >&2
    if ((!status)); then
      status=$code
      ((!kill_on_bad_exit)) || kill "${!task_of[@]}" 2>/dev/null
    fi
  fi
done
exit $status
'''

SCONTROL = r'''#!/bin/sh
# Stand-in for `scontrol show hostnames LIST`: one host per line (plain comma lists; no [a-b] ranges).
[ "$1 $2" = "show hostnames" ] || { echo "scontrol stand-in: only 'show hostnames LIST'" >&2; exit 1; }
echo "$3" | tr ',' '\n'
'''


def test_slurm_launch_trains_two_processes_on_one_node(tmp_path):
    """slurm_launch.sh --per_gpu on a 2-GPU node: two srun tasks, process 0 hosting the coordinator."""
    bin_dir = tmp_path / 'bin'
    _executable(bin_dir / 'sbatch', SBATCH.replace('@SPOOL@', str(tmp_path / 'spool')))
    _executable(bin_dir / 'srun', SRUN)
    _executable(bin_dir / 'scontrol', SCONTROL)
    model_dir, port = tmp_path / 'run', free_port()
    # `python` (the sbatch script's default interpreter) is this venv's, as on a cluster with it active.
    env = _clean_env(PATH=f'{bin_dir}:{pathlib.Path(sys.executable).parent}:{os.environ["PATH"]}',
                     JAX_PLATFORMS='cpu', XLA_FLAGS=XLA_FLAGS, JAX_COORDINATOR_PORT=str(port))
    env.pop('PYTHON', None)
    launch = subprocess.Popen(
        ['bash', str(SCRIPTS / 'slurm_launch.sh'), '--nodes=1', '--gpus_per_node=2', '--per_gpu', '--',
         *TRAIN_ARGS, f"--gin.MODEL_DIR='{model_dir}'"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True)
    try:
        launched, _ = launch.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        launched = f'slurm_launch.sh still running after {TIMEOUT} s'
    finally:
        _kill_group(launch)
    [job_output] = (tmp_path / 'spool').glob('job*/t5x_like-*.out')
    output = f'{launched}\n{job_output.read_text()}'
    assert launch.returncode == 0, output[-4000:]
    assert 'Submitted batch job' in launched
    for process_id in (0, 1):
        assert (f'coordinator=localhost:{port} num_processes=2 process_id={process_id}' in output
                and f'process {process_id} of 2 connected' in output), output[-4000:]
    _assert_trained_once(model_dir, output)


# --- TPU pod slice: scripts/tpu_pod.sh install, then run (gcloud ... scp/ssh --worker=all) ----------------

GCLOUD = r'''#!/usr/bin/env bash
# Stand-in for `gcloud compute tpus tpu-vm scp|ssh NAME ... --worker=all` on a pod slice of @WORKERS@
# workers, each a home directory on this machine. scp copies into every worker's home; ssh runs the
# command on every worker at once, as the user's shell there, with none of the local environment.
# On a real pod, jax reads the coordinator, process count and process id from the TPU VM metadata,
# which a CPU machine lacks: each worker gets the JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES /
# JAX_PROCESS_ID variables that t5x_like.cluster.processes reads instead, and CPU devices (JAX_PLATFORMS,
# XLA_FLAGS). T5X_LIKE_CACHE shares this machine's builtin corpus so that no worker rebuilds it.
set -euo pipefail
die() { echo "gcloud stand-in: $*" >&2; exit 1; }
[[ "$1 $2 $3" == 'compute tpus tpu-vm' ]] || die "only 'compute tpus tpu-vm'"
verb="$4"; shift 4
[[ " $* " == *' --worker=all '* ]] || die 'no --worker=all: some workers would be missed'
command='' positional=()
for arg; do
  case "$arg" in --command=*) command="${arg#*=}" ;; --*) ;; *) positional+=("$arg") ;; esac
done
pids=()
for ((worker = 0; worker < @WORKERS@; worker++)); do
  home="@ROOT@/worker$worker"
  case "$verb" in
    scp) cp "${positional[0]}" "$home/${positional[1]#*:}" & ;;
    ssh) (cd "$home" && exec env -i HOME="$home" PATH=/usr/local/bin:/usr/bin:/bin T5X_LIKE_CACHE='@CACHE@' \
            JAX_PLATFORMS=cpu XLA_FLAGS='@XLA_FLAGS@' JAX_COORDINATOR_ADDRESS=localhost:@PORT@ \
            JAX_NUM_PROCESSES=@WORKERS@ JAX_PROCESS_ID=$worker bash -c "$command") & ;;
    *) die "no '$verb'" ;;
  esac
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
'''

# uv would download Python and the packages: this one makes ~/t5x_like/.venv/bin/python this machine's
# project interpreter. `python -m` puts the worker's copy of the tree first on sys.path, so the code that
# trains is the copy that install shipped.
UV = r'''#!/bin/sh
set -e
case "$1 $2" in
  'venv --allow-existing')
    mkdir -p "$5/bin"
    printf '#!/bin/sh\nexec %s "$@"\n' '@PYTHON@' > "$5/bin/python" && chmod +x "$5/bin/python" ;;
  'pip install') [ -x "$4" ] && [ -f setup.cfg ] ;;
  *) echo "uv stand-in: unexpected 'uv $*'" >&2; exit 1 ;;
esac
'''

PR_SET_CHILD_SUBREAPER = 36
LAST_STEP = 'step 3/3 (100.0%)'


def _adopt_orphans(adopt: bool) -> None:
    """Makes this process (or stops making it) the parent of its descendants' orphans (Linux)."""
    libc = ctypes.CDLL(None, use_errno=True)
    result = libc.prctl(ctypes.c_int(PR_SET_CHILD_SUBREAPER), *map(ctypes.c_ulong, (int(adopt), 0, 0, 0)))
    assert result == 0, os.strerror(ctypes.get_errno())


def _reap(pid: int, deadline: float) -> int:
    """The exit status of `pid`, an orphan (its parent shell has exited) adopted by this process."""
    while time.monotonic() < deadline:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:  # its parent, the worker's shell, has not exited yet
            done = 0
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.2)
    raise TimeoutError(f'process {pid} still running')


def _run_until_workers_exit(command: list[str], env: dict[str, str], log_path: pathlib.Path,
                            pid_files: list[pathlib.Path]) -> tuple[list[int], str]:
    """Runs `tpu_pod.sh run`, which starts train in the background on every worker and then streams
    their logs until stopped; returns the exit status of each worker's train process (read from its
    train.pid) and what was streamed, once every worker's last step has been streamed."""
    _adopt_orphans(True)
    run = None
    try:
        with open(log_path, 'w') as log:
            run = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        deadline = time.monotonic() + TIMEOUT
        while not all(f.exists() and f.read_text().strip() for f in pid_files):
            assert run.poll() is None and time.monotonic() < deadline, log_path.read_text()[-4000:]
            time.sleep(0.2)
        codes = [_reap(int(f.read_text()), deadline) for f in pid_files]
        streamed_by = time.monotonic() + 10
        while time.monotonic() < streamed_by and log_path.read_text().count(LAST_STEP) < len(pid_files):
            time.sleep(0.2)
    finally:
        _adopt_orphans(False)  # first: what the kill orphans goes to init
        if run is not None:
            _kill_group(run)
    return codes, log_path.read_text()


@pytest.mark.skipif(not sys.platform.startswith('linux'), reason='reaps the workers with Linux prctl')
def test_tpu_pod_install_and_run_train_two_workers(tmp_path):
    """install ships the tree to both workers; run starts train on both in the background and streams
    their logs; both exit 0 (this process adopts them, as a worker's init would, to read their status)."""
    workers, port = 2, free_port()
    replacements = {'@WORKERS@': str(workers), '@ROOT@': str(tmp_path), '@PORT@': str(port),
                    '@CACHE@': str(builtin.cache_dir().parent), '@XLA_FLAGS@': XLA_FLAGS}
    gcloud = GCLOUD
    for name, value in replacements.items():
        gcloud = gcloud.replace(name, value)
    bin_dir = tmp_path / 'bin'
    _executable(bin_dir / 'gcloud', gcloud)
    homes = [tmp_path / f'worker{worker}' for worker in range(workers)]
    for home in homes:
        _executable(home / '.local' / 'bin' / 'uv', UV.replace('@PYTHON@', sys.executable))
    env = _clean_env(PATH=f'{bin_dir}:{os.environ["PATH"]}', TMPDIR=str(tmp_path))
    pod = ['--name=pod', '--zone=us-east5-a', '--project=proj']

    install = subprocess.run(['bash', str(SCRIPTS / 'tpu_pod.sh'), 'install', *pod], env=env, cwd=tmp_path,
                             capture_output=True, text=True, timeout=120)
    assert install.returncode == 0, install.stdout + install.stderr
    for home in homes:
        assert (home / 't5x_like' / 't5x_like' / 'train.py').exists()
        assert (home / 't5x_like' / 'gin' / 'quickstart.gin').exists()

    model_dir = tmp_path / 'run'  # "shared": every worker writes it
    pid_files = [home / 't5x_like' / 'train.pid' for home in homes]
    command = ['bash', str(SCRIPTS / 'tpu_pod.sh'), 'run', *pod, '--', *TRAIN_ARGS,
               f"--gin.MODEL_DIR='{model_dir}'"]
    codes, streamed = _run_until_workers_exit(command, env, tmp_path / 'run.out', pid_files)
    worker_logs = '\n'.join((home / 't5x_like' / 'train.log').read_text() for home in homes)
    output = f'{streamed}\n{worker_logs}'
    assert codes == [0, 0], output[-4000:]
    for process_id in (0, 1):
        assert (f'JAX_* environment variables -> coordinator=localhost:{port} num_processes=2 '
                f'process_id={process_id}' in worker_logs), output[-4000:]
    assert streamed.count(LAST_STEP) == workers and 'done: step 3/3' in streamed, streamed[-4000:]
    _assert_trained_once(model_dir, output)

    stop = subprocess.run(['bash', str(SCRIPTS / 'tpu_pod.sh'), 'stop', *pod], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=60)
    assert stop.returncode == 0 and not any(f.exists() for f in pid_files), stop.stderr
