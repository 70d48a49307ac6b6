"""t5x_like.cluster.processes: job detection (in-process) and real two-process runs (subprocesses).

Run as a script, this file is the worker of the two-process tests:
`python test_processes.py MODE PORT PROCESS_ID`.
"""
import functools
import inspect
import os
import pathlib
import signal
import subprocess
import sys
import threading
import time

import jax
import pytest
from jax.experimental import multihost_utils

from t5x_like.cluster import peers, processes

_LAUNCH_VARS = ('JAX_COORDINATOR_ADDRESS', 'JAX_NUM_PROCESSES', 'JAX_PROCESS_ID', 'JAX_COORDINATOR_PORT')


# --- detection from flags and environments -------------------------------------------------------

def _slurm_env(**overrides: str) -> dict[str, str]:
    env = {'SLURM_JOB_ID': '1234', 'SLURM_STEP_NODELIST': 'gpu-[003-004]', 'SLURM_NTASKS': '2',
           'SLURM_PROCID': '1', 'SLURM_LOCALID': '0', 'SLURM_STEP_NUM_NODES': '2'}
    env.update(overrides)
    return env


def test_explicit_flags_give_the_spec():
    spec = processes.detect_cluster('10.0.0.1:8476', 4, 3, {})
    assert spec == processes.ClusterSpec('flags', '10.0.0.1:8476', 4, 3)


@pytest.mark.parametrize('given, missing', [
    (('10.0.0.1:8476', None, None), '--num_processes, --process_id'),
    ((None, 2, None), '--coordinator_address, --process_id'),
    (('10.0.0.1:8476', 2, None), '--process_id'),
])
def test_partial_flags_name_what_is_missing(given, missing):
    with pytest.raises(ValueError, match=f'but not {missing}. Set all of'):
        processes.detect_cluster(*given, {})


@pytest.mark.parametrize('given, message', [
    (('10.0.0.1', 2, 0), "has no port; write it as 'host:port'"),
    (('10.0.0.1:8476', 2, 2), r'process_id=2 \(from flags\) must be in \[0, 2\)'),
    (('10.0.0.1:8476', 0, 0), 'num_processes=0'),
])
def test_bad_flags_are_rejected(given, message):
    with pytest.raises(ValueError, match=message):
        processes.detect_cluster(*given, {})


def test_one_process_needs_no_initialisation():
    assert processes.detect_cluster('10.0.0.1:8476', 1, 0, {}) is None
    assert processes.detect_cluster(None, None, None, _slurm_env(SLURM_NTASKS='1', SLURM_PROCID='0')) is None


def test_nothing_detected_means_single_process():
    assert processes.detect_cluster(None, None, None, {'HOME': '/root'}) is None


def test_jax_environment_variables():
    env = {'JAX_COORDINATOR_ADDRESS': 'host0:1234', 'JAX_NUM_PROCESSES': '8', 'JAX_PROCESS_ID': '5'}
    spec = processes.detect_cluster(None, None, None, env)
    assert (spec.coordinator_address, spec.num_processes, spec.process_id) == ('host0:1234', 8, 5)
    assert spec.source == 'JAX_* environment variables'


def test_partial_jax_environment_is_an_error():
    with pytest.raises(ValueError, match='not JAX_NUM_PROCESSES, JAX_PROCESS_ID'):
        processes.detect_cluster(None, None, None, {'JAX_COORDINATOR_ADDRESS': 'host0:1234'})
    with pytest.raises(ValueError, match="JAX_NUM_PROCESSES='two' is not an integer"):
        processes.detect_cluster(None, None, None, {'JAX_COORDINATOR_ADDRESS': 'h:1',
                                                      'JAX_NUM_PROCESSES': 'two', 'JAX_PROCESS_ID': '0'})


def test_slurm_step_gives_coordinator_count_and_rank():
    spec = processes.detect_cluster(None, None, None, _slurm_env())
    # jax's convention: port 61440 + job id % 4096 -> 61440 + 1234.
    assert spec == processes.ClusterSpec('SLURM', 'gpu-003:62674', 2, 1)


def test_slurm_port_can_be_overridden():
    spec = processes.detect_cluster(None, None, None, _slurm_env(JAX_COORDINATOR_PORT='29500'))
    assert spec.coordinator_address == 'gpu-003:29500'


def test_slurm_without_srun_is_not_detected():
    env = _slurm_env()
    del env['SLURM_LOCALID']  # the batch script itself, not a task of an srun step
    assert processes.detect_cluster(None, None, None, env) is None


def test_precedence_flags_then_jax_env_then_slurm():
    env = _slurm_env(JAX_COORDINATOR_ADDRESS='envhost:1', JAX_NUM_PROCESSES='3', JAX_PROCESS_ID='2')
    assert processes.detect_cluster('flaghost:2', 5, 4, env).coordinator_address == 'flaghost:2'
    assert processes.detect_cluster(None, None, None, env).coordinator_address == 'envhost:1'


@pytest.mark.parametrize('nodelist, first', [
    ('node01', 'node01'),
    ('node01,node02', 'node01'),
    ('gpu-[003-010,012],cpu01', 'gpu-003'),
    ('gpu-[7,9]', 'gpu-7'),
    ('rack[1-2]-n[01-04]', 'rack1-n01'),
    ('a[08-10]-ib,b1', 'a08-ib'),
])
def test_first_slurm_host(nodelist, first):
    assert processes.first_slurm_host(nodelist) == first


@pytest.mark.parametrize('tasks, visible, local_ids', [
    ('2', None, None),          # one process per node: it drives all local GPUs
    ('16', None, (3,)),         # eight per node: process with SLURM_LOCALID=3 takes GPU 3
    ('16', '5', None),          # SLURM already gave this task a single GPU
])
def test_slurm_one_gpu_per_process_only_with_several_tasks_per_node(tasks, visible, local_ids):
    env = _slurm_env(SLURM_NTASKS=tasks, SLURM_LOCALID='3')
    if visible is not None:
        env['CUDA_VISIBLE_DEVICES'] = visible
    assert processes.detect_cluster(None, None, None, env).local_device_ids == local_ids
    # The same holds when the coordinator comes from flags (the sbatch script passes them).
    assert processes.detect_cluster('gpu-003:1', 16, 1, env).local_device_ids == local_ids


@pytest.fixture
def cloud_tpu_vm(monkeypatch):
    """Pretends this machine has TPU chips attached and libtpu installed."""
    monkeypatch.setattr(processes.glob, 'glob', lambda pattern: ['/dev/accel0'] if 'accel' in pattern else [])
    monkeypatch.setattr(processes.importlib.util, 'find_spec', lambda name: object())


def test_cloud_tpu_vm_is_left_to_jax_cluster_detection(cloud_tpu_vm):
    spec = processes.detect_cluster(None, None, None, {})
    assert spec == processes.ClusterSpec('Cloud TPU VM (jax cluster detection)')
    assert processes.detect_cluster(None, None, None, {'JAX_PLATFORMS': 'cpu'}) is None


def test_no_tpu_without_chips():
    assert processes.detect_cluster(None, None, None, {'JAX_PLATFORMS': 'tpu'}) is None


@pytest.fixture
def jax_initialize_calls(monkeypatch):
    """Records jax.distributed.initialize's arguments instead of starting a service."""
    calls = []
    monkeypatch.setattr(jax.distributed, 'initialize', lambda **kwargs: calls.append(kwargs))
    monkeypatch.setattr(jax.distributed, 'is_initialized', lambda: bool(calls))
    for name in _LAUNCH_VARS + ('SLURM_JOB_ID', 'SLURM_LOCALID'):
        monkeypatch.delenv(name, raising=False)
    return calls


def test_initialize_on_a_tpu_vm_lets_jax_detect_everything(cloud_tpu_vm, jax_initialize_calls,
                                                           monkeypatch):
    monkeypatch.delenv('JAX_PLATFORMS')  # conftest's 'cpu' would rule the TPU out
    processes.initialize(initialization_timeout=60)
    [call] = jax_initialize_calls
    assert call['coordinator_address'] is None and call['cluster_detection_method'] is None
    # jax's own timeouts abort with a C++ stack dump: they come after ours, which name the process
    assert call['initialization_timeout'] == 60 + processes.BACKSTOP_S
    assert call['heartbeat_timeout_seconds'] == peers.jax_heartbeat_timeout(100) > 100


def test_initialize_under_slurm_keeps_all_local_gpus_with_one_task_per_node(jax_initialize_calls,
                                                                             monkeypatch):
    for name, value in _slurm_env(SLURM_LOCALID='0').items():
        monkeypatch.setenv(name, value)
    processes.initialize()
    processes.initialize()  # a second call sees jax initialised and returns
    [call] = jax_initialize_calls
    assert call['coordinator_address'] == 'gpu-003:62674' and call['process_id'] == 1
    # jax's own SLURM detection would pin this process to GPU SLURM_LOCALID; we switch it off.
    assert call['cluster_detection_method'] == 'deactivate' and call['local_device_ids'] is None


def test_the_arguments_we_pass_exist_in_this_jax():
    accepted = inspect.signature(jax.distributed.initialize).parameters
    for name in ('coordinator_address', 'num_processes', 'process_id', 'local_device_ids',
                 'cluster_detection_method', 'initialization_timeout', 'heartbeat_timeout_seconds'):
        assert name in accepted


def test_single_process_initialize_and_primary(monkeypatch):
    for name in _LAUNCH_VARS + ('SLURM_JOB_ID',):
        monkeypatch.delenv(name, raising=False)
    processes.initialize()
    processes.initialize()  # idempotent
    assert not jax.distributed.is_initialized()
    assert processes.is_primary()


def test_a_peer_failure_python_swallows_is_raised_again_without_a_traceback(monkeypatch, capsys):
    """The watching thread raises PeerFailed in the main thread; landing in a __del__ (or a gc callback, as it
    did under jax's _xla_gc_callback in CI), Python would print "Exception ignored ... Traceback" and go on. It
    is raised again, at the main thread's next instruction outside it, and nothing is printed."""
    watching = peers.Cluster(None, process_id=1, num_processes=2, heartbeat_timeout=10, coordinator='x:1')
    monkeypatch.setattr(peers, '_cluster', watching)
    monkeypatch.setattr(sys, 'unraisablehook', functools.partial(peers._drop_lost_interrupt,
                                                                 previous=sys.unraisablehook))
    in_del = threading.Event()

    class Collected:
        def __del__(self):
            in_del.set()
            time.sleep(0.3)  # the interrupt arrives here: Python can only print it

    thread = threading.Thread(target=lambda: (in_del.wait(5), watching._interrupt_main_thread()), daemon=True)
    thread.start()
    deadline = time.monotonic() + 5
    with pytest.raises(peers.PeerFailed):
        Collected()  # collected at once
        while time.monotonic() < deadline:
            time.sleep(0.01)
    thread.join(5)
    assert watching.main_stopping.is_set() and not watching.interrupt_lost.is_set()
    assert 'Exception ignored' not in capsys.readouterr().err


# --- two real processes -------------------------------------------------------------------------

def _start_workers(mode: str, tmp_path: pathlib.Path) -> list[tuple[subprocess.Popen, pathlib.Path]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith('SLURM_') and k not in _LAUNCH_VARS}
    from tests.support.cli import free_port  # here: the workers run this file as a script, without tests/
    from tests.support.environment import cpu_env
    env.update(JAX_PLATFORMS='cpu', XLA_FLAGS=cpu_env(4)['XLA_FLAGS'], PYTHONUNBUFFERED='1')
    port = free_port()
    workers = []
    for process_id in range(2):
        log = tmp_path / f'process{process_id}.log'
        with log.open('w') as out:
            proc = subprocess.Popen([sys.executable, __file__, mode, str(port), str(process_id)],
                                    stdout=out, stderr=subprocess.STDOUT, env=env)
        workers.append((proc, log))
    return workers


def _wait_all(workers, timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    try:
        return [proc.wait(timeout=max(deadline - time.monotonic(), 0.1)) for proc, _ in workers]
    finally:
        for proc, _ in workers:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def _wait_for_text(log: pathlib.Path, text: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while text not in log.read_text():
        assert time.monotonic() < deadline, f'{text!r} not in {log} after {timeout_s}s:\n{log.read_text()}'
        time.sleep(0.2)


@pytest.mark.system
def test_two_processes_sum_a_global_array(tmp_path):
    workers = _start_workers('sum', tmp_path)
    codes = _wait_all(workers, timeout_s=90)
    logs = [log.read_text() for _, log in workers]
    assert codes == [0, 0], logs
    # Process p holds [4p, 4p+1, 4p+2, 4p+3]; the global sum over 8 devices is 0 + 1 + ... + 7 = 28.
    assert 'RESULT process=0 processes=2 devices=8 local=4 primary=True sum=28.0' in logs[0], logs[0]
    assert 'RESULT process=1 processes=2 devices=8 local=4 primary=False sum=28.0' in logs[1], logs[1]


@pytest.mark.parametrize('victim, signum, named, within_s', [
    (1, signal.SIGKILL, 'process 1 died: its connection to process 0 closed', 5),
    (0, signal.SIGKILL, 'process 0 (the coordinator, 127.0.0.1:', 5),
    (1, signal.SIGSTOP, 'process 1 stopped responding: no heartbeat for 5 s', 5 + 1 + peers.INTERRUPT_S + 3),
], ids=['worker_dies', 'coordinator_dies', 'worker_hangs'])
@pytest.mark.system
def test_a_dead_process_makes_the_other_exit_naming_it(tmp_path, victim, signum, named, within_s):
    """Killed mid-collective (the kernel closes its connections: noticed at once) or hung (SIGSTOP: only its
    heartbeat stops, noticed after the 5 s heartbeat timeout): the survivor's last line names it, and no C++
    abort follows."""
    workers = _start_workers('loop', tmp_path)
    try:
        for _, log in workers:
            _wait_for_text(log, 'READY', timeout_s=60)
    except AssertionError:
        _wait_all(workers, timeout_s=0)
        raise
    workers[victim][0].send_signal(signum)
    survivor, survivor_log = workers[1 - victim]
    start = time.monotonic()
    try:
        code = survivor.wait(timeout=30)
    finally:
        elapsed = time.monotonic() - start
        for proc, _ in workers:
            proc.kill()
            proc.wait()
    output = survivor_log.read_text()
    assert code == 1, output
    assert elapsed < within_s, f'survivor took {elapsed:.0f}s to exit:\n{output}'
    assert output.strip().splitlines()[-1].startswith(f'error: {named}'), output
    assert 'Check failure stack trace' not in output and 'Fatal Python error' not in output, output


# --- worker -------------------------------------------------------------------------------------

def _global_sum(process_id: int) -> float:
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    mesh = Mesh(np.array(jax.devices()), ('data',))
    local = np.arange(4, dtype=np.float32) + 4 * process_id
    array = jax.make_array_from_process_local_data(NamedSharding(mesh, PartitionSpec('data')), local, (8,))
    return float(jax.jit(jax.numpy.sum)(array))


@peers.stop_together  # as the CLIs' mains are
def _worker(mode: str, port: str, process_id: int) -> None:
    processes.initialize(f'127.0.0.1:{port}', 2, process_id, initialization_timeout=30,
                           heartbeat_timeout_seconds=5)
    total = _global_sum(process_id)
    print(f'RESULT process={jax.process_index()} processes={jax.process_count()} '
          f'devices={jax.device_count()} local={jax.local_device_count()} '
          f'primary={processes.is_primary()} sum={total}')
    if mode == 'sum':
        multihost_utils.sync_global_devices('end')
        return
    multihost_utils.sync_global_devices('ready')
    print('READY')
    while True:
        _global_sum(process_id)
        multihost_utils.sync_global_devices('step')
        time.sleep(0.05)


if __name__ == '__main__':
    _worker(sys.argv[1], sys.argv[2], int(sys.argv[3]))
