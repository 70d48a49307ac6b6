"""Launchers: the TPU pod and SLURM scripts' dry runs print the commands a given shape needs.

The SLURM batch script also runs for real against a fake `srun`, `scontrol` and `python`.
"""
import json
import os
import pathlib
import shlex
import stat
import subprocess
import sys

import pytest

from t5x_like.cluster import processes

pytestmark = pytest.mark.system

SCRIPTS = pathlib.Path(__file__).resolve().parents[2] / 'scripts'
TRAIN_ARGS = ['--gin_file=gpt2.gin', "--gin.MODEL_DIR='gs://bucket/run 1'", '--gin.TRAIN_STEPS=10']
TPU = ['--name=pod', '--zone=us-east5-a', '--project=proj']


def _run(script: str, *args: str, env: dict[str, str] | None = None,
         cwd: pathlib.Path | None = None) -> subprocess.CompletedProcess:
  return subprocess.run(['bash', str(SCRIPTS / script), *args], capture_output=True, text=True,
                        timeout=30, env={**os.environ, **(env or {})}, cwd=cwd)


def _commands(result: subprocess.CompletedProcess) -> list[list[str]]:
  """The printed commands ('+ ...' lines), each split back into its arguments."""
  assert result.returncode == 0, result.stderr
  return [shlex.split(line[2:]) for line in result.stdout.splitlines() if line.startswith('+ ')]


def _option(command: list[str], name: str) -> str:
  values = [arg.split('=', 1)[1] for arg in command if arg.startswith(f'{name}=')]
  assert len(values) == 1, (name, command)
  return values[0]


def _executable(path: pathlib.Path, text: str) -> pathlib.Path:
  path.write_text(text)
  path.chmod(path.stat().st_mode | stat.S_IEXEC)
  return path


# --- TPU pod slice ------------------------------------------------------------------------------

def test_tpu_create_asks_for_the_slice_shape():
  [create] = _commands(_run('tpu_pod.sh', '--dry_run', 'create', *TPU, '--accelerator_type=v5p-32',
                            '--version=v2-alpha-tpuv5', '--spot'))
  assert create[:6] == ['gcloud', 'compute', 'tpus', 'tpu-vm', 'create', 'pod']
  assert _option(create, '--accelerator-type') == 'v5p-32'
  assert _option(create, '--version') == 'v2-alpha-tpuv5'
  assert _option(create, '--zone') == 'us-east5-a' and _option(create, '--project') == 'proj'
  assert '--spot' in create


def test_tpu_install_copies_the_tree_to_every_worker_and_installs_tpu_extras(tmp_path):
  pack, scp, ssh = _commands(_run('tpu_pod.sh', 'install', *TPU, '--dry_run', env={'TMPDIR': str(tmp_path)}))
  assert scp[4] == 'scp' and '--worker=all' in scp and scp[6] == 'pod:t5x_like.tar.gz'
  assert ssh[4:6] == ['ssh', 'pod'] and '--worker=all' in ssh
  assert "pip install --python .venv/bin/python -e '.[tpu]'" in _option(ssh, '--command')
  # The packing command really packs the working tree (and not the ignored venv).
  subprocess.run(pack, check=True, timeout=60)
  listing = subprocess.run(['tar', '-tzf', scp[5]], capture_output=True, text=True, check=True).stdout
  assert 't5x_like/cluster/processes.py' in listing.split() and 'scripts/tpu_pod.sh' in listing.split()
  assert '.venv/' not in listing


def test_tpu_run_starts_the_same_train_command_on_all_workers_then_streams_logs():
  start, logs = _commands(_run('tpu_pod.sh', '--dry_run', 'run', *TPU, '--', *TRAIN_ARGS))
  assert start[4:6] == ['ssh', 'pod'] and '--worker=all' in start
  remote = shlex.split(_option(start, '--command'))
  at = remote.index('t5x_like.train')
  assert remote[at - 2:at] == ['.venv/bin/python', '-m']
  assert remote[at + 1:at + 1 + len(TRAIN_ARGS)] == TRAIN_ARGS  # quoting survives the remote shell
  assert '--worker=all' in logs and 'tail' in _option(logs, '--command')


def test_tpu_stop_and_delete():
  [stop] = _commands(_run('tpu_pod.sh', '--dry_run', 'stop', *TPU))
  assert '--worker=all' in stop and 'kill $(cat train.pid)' in _option(stop, '--command')
  [delete] = _commands(_run('tpu_pod.sh', '--dry_run', 'delete', *TPU))
  assert delete[4:6] == ['delete', 'pod'] and '--quiet' in delete


@pytest.mark.parametrize('args, message', [
    (['run', '--name=pod'], '--zone=ZONE is required'),
    (['run', *TPU], 'run needs the train arguments'),
    (['create', *TPU, '--version=v2-alpha-tpuv5'], 'create needs --accelerator_type'),
    (['launch', *TPU], "unknown argument 'launch'"),
])
def test_tpu_errors_say_what_to_do(args, message):
  result = _run('tpu_pod.sh', '--dry_run', *args)
  assert result.returncode == 2 and message in result.stderr, result.stderr


def test_tpu_help_shows_a_mounted_model_dir_not_a_gs_url():
  result = _run('tpu_pod.sh', '--help')
  assert result.returncode == 0 and "MODEL_DIR=\"'/mnt/shared/runs/gpt2'\"" in result.stdout
  assert "MODEL_DIR=\"'gs://" not in result.stdout


# --- SLURM GPU cluster --------------------------------------------------------------------------

@pytest.mark.parametrize('flags, tasks_per_node', [([], '1'), (['--per_gpu'], '8')])
def test_slurm_launch_submits_the_cluster_shape(flags, tasks_per_node):
  [sbatch] = _commands(_run('slurm_launch.sh', '--nodes=4', '--partition=h100', *flags, '--dry_run',
                            '--', *TRAIN_ARGS))
  assert sbatch[0] == 'sbatch'
  assert _option(sbatch, '--nodes') == '4' and _option(sbatch, '--gpus-per-node') == '8'
  assert _option(sbatch, '--ntasks-per-node') == tasks_per_node
  assert _option(sbatch, '--partition') == 'h100'
  at = sbatch.index(str(SCRIPTS / 'slurm_gpu.sbatch'))  # absolute: the printed command runs from anywhere
  assert sbatch[at + 1:] == TRAIN_ARGS


def test_slurm_launch_needs_nodes():
  result = _run('slurm_launch.sh', '--dry_run', '--', *TRAIN_ARGS)
  assert result.returncode == 2 and '--nodes=N is required' in result.stderr


def _fake_slurm(tmp_path: pathlib.Path, tasks: int) -> dict[str, str]:
  """A job on gpu-[003-30000]: fake scontrol; fake srun running `tasks` tasks; fake python echoing argv.

  The many hosts make scontrol's output larger than a pipe buffer, as on a big cluster.
  """
  bin_dir = tmp_path / 'bin'
  bin_dir.mkdir()
  _executable(bin_dir / 'scontrol', '#!/bin/sh\n[ "$1 $2 $3" = "show hostnames gpu-[003-30000]" ] || exit 1\n'
              "seq -f 'gpu-%03g' 3 30000\n")
  _executable(bin_dir / 'srun', '#!/usr/bin/env bash\nwhile [[ "$1" == --* ]]; do shift; done\n'
              f'for ((i = 0; i < {tasks}; i++)); do SLURM_PROCID=$i "$@"; done\n')
  fake_python = _executable(tmp_path / 'python', f'#!{sys.executable}\nimport json, os, sys\n'
                            "print(json.dumps({'argv': sys.argv[1:], 'xla_flags': os.environ['XLA_FLAGS']}))\n")
  return {'PATH': f'{bin_dir}:{os.environ["PATH"]}', 'PYTHON': str(fake_python), 'SLURM_JOB_ID': '1234',
          'SLURM_JOB_NODELIST': 'gpu-[003-30000]', 'SLURM_NTASKS': str(tasks), 'SLURM_JOB_NUM_NODES': '2',
          'XLA_FLAGS': '--xla_dump_to=/tmp/dump'}


def test_slurm_sbatch_dry_run_derives_the_coordinator(tmp_path):
  result = _run('slurm_gpu.sbatch', '--dry_run', *TRAIN_ARGS, env=_fake_slurm(tmp_path, tasks=16))
  [srun] = _commands(result)
  assert srun[:2] == ['srun', '--kill-on-bad-exit=1']
  # The same coordinator t5x_like.cluster.processes derives from this job inside an srun step.
  expected = processes.detect_cluster(None, None, None, {
      'SLURM_JOB_ID': '1234', 'SLURM_STEP_NODELIST': 'gpu-[003-30000]', 'SLURM_NTASKS': '16',
      'SLURM_PROCID': '0', 'SLURM_LOCALID': '0'}).coordinator_address
  assert _option(srun, '--coordinator_address') == expected == 'gpu-003:62674'
  assert _option(srun, '--num_processes') == '16'
  assert "export XLA_PYTHON_CLIENT_MEM_FRACTION='0.9'" in result.stdout
  assert "export CUDA_DEVICE_MAX_CONNECTIONS='1'" in result.stdout


def test_slurm_sbatch_gives_each_task_its_process_id(tmp_path):
  result = _run('slurm_gpu.sbatch', *TRAIN_ARGS, env=_fake_slurm(tmp_path, tasks=2))
  assert result.returncode == 0, result.stderr
  tasks = [json.loads(line) for line in result.stdout.splitlines()]
  assert [task['argv'] for task in tasks] == [
      ['-m', 't5x_like.train', *TRAIN_ARGS, '--coordinator_address=gpu-003:62674', '--num_processes=2',
       f'--process_id={process_id}'] for process_id in (0, 1)]
  # Ours first, the user's XLA_FLAGS after (so they win).
  assert tasks[0]['xla_flags'] == '--xla_gpu_enable_latency_hiding_scheduler=true --xla_dump_to=/tmp/dump'


def test_slurm_sbatch_outside_a_job_says_how_to_submit():
  env = {name: '' for name in ('SLURM_JOB_ID', 'SLURM_JOB_NODELIST')}
  result = _run('slurm_gpu.sbatch', '--dry_run', *TRAIN_ARGS, env=env)
  assert result.returncode == 2 and 'submit it with sbatch' in result.stderr


def test_slurm_sbatch_xla_flags_are_known_to_this_jaxlib(tmp_path):
  """XLA aborts on an unknown flag in XLA_FLAGS; a renamed flag would crash every job at start."""
  env = _fake_slurm(tmp_path, tasks=2)
  del env['XLA_FLAGS']
  result = _run('slurm_gpu.sbatch', '--dry_run', *TRAIN_ARGS, env=env)
  [xla_flags] = [shlex.split(line)[1].split('=', 1)[1] for line in result.stdout.splitlines()
                 if line.startswith('export XLA_FLAGS=')]
  check = subprocess.run([sys.executable, '-c', 'import jax; jax.numpy.ones(2).sum().block_until_ready()'],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, 'JAX_PLATFORMS': 'cpu', 'XLA_FLAGS': xla_flags})
  assert check.returncode == 0, check.stderr[-2000:]
