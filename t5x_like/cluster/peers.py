"""The processes of a job stop together: a dead, hung or failing process stops all of them, each naming it.

One process's fault must not leave the others waiting in a collective. Everything here runs over the
key-value store of jax's coordination service (the one `jax.distributed.initialize` starts):

- `watch()` (called by distributed.initialize) notices a dead process. Every other process holds a TCP
  connection to process 0, which a killed process's kernel closes at once: a dead process is known within a
  second. Heartbeats cover what closes nothing (a hung process, a failed host): every process beats (a
  counter under `t5x_like/alive/<i>`) and one whose counter stands still for `--heartbeat_timeout_seconds` is
  dead. jax's own heartbeat, a backstop with a longer timeout, aborts with a C++ stack dump (its
  `missed_heartbeat_callback` dies with std::bad_cast in jaxlib); when process 0 dies, jax's client aborts the
  others at once, so its "Terminating process" line may come before ours.
- A process that fails (any exception out of a CLI's main, see `stop_together`) publishes its message
  under `t5x_like/failure` (the first failure stands); every other process, wherever it waits, prints
  `error: process <i> failed: <message>` and exits 1. Process 0, which hosts the service, waits a few
  seconds for the others to read it before it goes.
- t5x_like/cluster/agreement.py compares every process's resolved settings with process 0's before step 1.

Every exit on these paths is `os._exit(1)` after flushing (a normal exit waits 300 s in jax's shutdown barrier),
with the clean-ups registered by `clean_up_on_stop` (the run lock) run first when the main thread could not.
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import dataclasses
import functools
import json
import os
import re
import socket
import sys
import threading
import time
import traceback
from typing import Any, Callable, NoReturn, TypeVar

from absl import logging

from t5x_like.cluster.liveness import ALIVE_DIR, DONE, FAILURE_KEY, STOPPED, Failure, Liveness
from t5x_like.errors import UserError

F = TypeVar("F", bound=Callable[..., Any])

INTERRUPT_S = 1.0   # a failure another thread saw: how long it waits to see the main thread interrupted
MAX_INTERRUPTS = 20  # ... and how often it raises PeerFailed there again when Python swallowed it
GRACE_S = 10.0      # ... and then, for the main thread's clean-up
ACK_WAIT_S = 10.0   # process 0 failing: how long it keeps the service up for the others to read why
COMMUNICATION_ERRORS = re.compile(r"gloo|nccl|connection reset|socket closed|unavailable|deadline_exceeded|"
                                  r"coordination service|heartbeat|barrier", re.I)


def jax_heartbeat_timeout(heartbeat_timeout: int) -> int:
    """jax's own heartbeat timeout: later than ours, so that ours names the dead process first."""
    return 2 * heartbeat_timeout + 30


class PeerFailed(UserError):
    """Another process failed or died: this one stops too. Made in the main thread (raised there by a
    watching thread, or by `agree`), it tells the watching threads that the main thread is stopping."""

    def __init__(self, *args):
        super().__init__(*args)
        if _cluster is not None:
            _cluster.main_stopping.set()


class Cluster(Liveness):
    """This process's view of the others (one per process, made by `watch`); how it notices a dead or hung one is
    Liveness's."""

    def __init__(self, client: Any, process_id: int, num_processes: int, heartbeat_timeout: int, coordinator: str):
        self.client, self.me, self.count = client, process_id, num_processes
        self.heartbeat_timeout = heartbeat_timeout
        self.coordinator = coordinator
        self.beat_s = max(0.2, min(heartbeat_timeout / 5, 10.0))
        self.poll_s = min(1.0, self.beat_s)
        self.failure: Failure | None = None
        self.dead: set[int] = set()
        self.store_lost = False
        self.links: list[socket.socket] = []
        self.exit_lock = threading.Lock()
        self.stopping = threading.Event()
        self.main_stopping = threading.Event()
        self.interrupt_lost = threading.Event()  # PeerFailed was raised where Python only prints exceptions
        self.threads = [threading.Thread(target=self._watch, name="t5x_like-heartbeat", daemon=True),
                        threading.Thread(target=self._serve_links if process_id == 0 else self._hold_link,
                                         name="t5x_like-links", daemon=True)]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    # ------------------------------------------------------------------------------- the store

    def coordinator_lost(self) -> Failure:
        self.store_lost = True
        return Failure(0, f"process 0 (the coordinator, {self.coordinator}) died or cannot be reached: it was "
                          "killed, ran out of memory, or its host or network failed; see its log. Every process "
                          "stops.")

    def dead_process(self, process: int, closed: bool) -> Failure:
        if closed:
            return Failure(process, f"process {process} died: its connection to process 0 closed (killed, crashed or "
                                    "out of memory; see its log). Every process stops.")
        return Failure(process, f"process {process} stopped responding: no heartbeat for {self.heartbeat_timeout} s "
                                "(it hangs, or its host or network failed; see its log). Every process stops; if it "
                                f"was only busy, raise --heartbeat_timeout_seconds (now {self.heartbeat_timeout}).")

    def read_failure(self) -> Failure | None:
        """The failure this process knows of, else the one the store holds; the coordinator's loss when
        the store cannot be reached."""
        if self.failure is not None:
            return self.failure
        try:
            value = self.client.key_value_try_get(FAILURE_KEY)
        except Exception as e:  # noqa: BLE001 (jaxlib's error types differ between versions)
            return None if "NOT_FOUND" in str(e) else self.coordinator_lost()
        self.failure = Failure(**json.loads(value))
        return self.failure

    def publish(self, failure: Failure) -> Failure:
        """Store `failure` unless another stands already; returns the one that stands."""
        try:
            self.client.key_value_set(FAILURE_KEY, json.dumps(dataclasses.asdict(failure)))
        except Exception as e:  # noqa: BLE001
            if "ALREADY_EXISTS" not in str(e):
                return self.coordinator_lost()
            return self.read_failure() or failure
        self.failure = failure
        return failure

    def wait_for(self, key: str) -> str:
        """The value of `key` once some process sets it; PeerFailed as soon as any process fails."""
        while True:
            try:
                return self.client.blocking_key_value_get(key, int(self.poll_s * 1000))
            except Exception as e:  # noqa: BLE001
                if "DEADLINE_EXCEEDED" not in str(e):
                    self.failure = self.coordinator_lost()
            failure = self.read_failure()
            if failure is not None:
                raise PeerFailed(failure.summary)  # which sets main_stopping

    # ------------------------------------------------------------------------------- stopping

    def _on_failure(self, failure: Failure) -> None:
        """A thread learned of a failure: PeerFailed is raised in the main thread, which then gets GRACE_S to
        stop and run its clean-up (the run lock, empty folders) as for any error; if it waits in native code
        (a collective, a compilation), the exception cannot reach it, and this thread stops the process."""
        self.failure = failure
        if failure.process == self.me and failure.summary.startswith(f"process {self.me} failed"):
            return  # this process's own failure: its main thread is already stopping
        if not self.main_stopping.is_set():
            self._interrupt_main_thread()
        if self.exit_lock.acquire(blocking=False):
            self._exit(failure.summary)

    def _interrupt_main_thread(self) -> None:
        """PeerFailed in the main thread, then GRACE_S for its clean-up; raised again when Python swallowed it
        (raised in a __del__ or a gc callback, it is only printed, and `_drop_lost_interrupt` hides that)."""
        for _ in range(MAX_INTERRUPTS):
            self.interrupt_lost.clear()
            _raise_in_main_thread()
            if not self.main_stopping.wait(INTERRUPT_S):
                return  # it waits in native code (a collective, a compilation): this thread stops the process
            deadline = time.monotonic() + GRACE_S
            while not (self.interrupt_lost.is_set() or self.stopping.wait(0.05) or time.monotonic() > deadline):
                pass
            if not self.interrupt_lost.is_set():
                return

    def stop_on(self, error: Exception) -> NoReturn:
        """The main thread's exception, in a job of several processes: every process stops, each naming why.
        Another process's failure comes first (a PeerFailed, or this process's error was its consequence)."""
        self.main_stopping.set()
        known = self.read_failure()
        if known is not None and known.process != self.me:
            self._stop(known, None)
        if isinstance(error, UserError):
            message = str(error)
            self._stop(self.publish(Failure(self.me, f"process {self.me} failed: {message}")), message)
        if COMMUNICATION_ERRORS.search(str(error)):
            verdict = self._await_verdict()  # a collective broke: wait for the name of the process that went
            if verdict is not None:
                self._stop(verdict, None)
        traceback.print_exc()  # a bug here: its traceback, and one line for the others
        first_line = (str(error).strip().splitlines() or [""])[0][:300]
        self._stop(self.publish(Failure(self.me, f"process {self.me} failed: {type(error).__name__}: {first_line} "
                                                 "(the traceback is in its log)")), None)

    def _await_verdict(self) -> Failure | None:
        deadline = time.monotonic() + self.heartbeat_timeout + 2 * self.beat_s + 1
        while time.monotonic() < deadline:
            failure = self.read_failure()
            if failure is not None:
                return failure
            time.sleep(0.2)
        return None

    def _stop(self, failure: Failure, own_message: str | None) -> NoReturn:
        self.failure = failure
        if not self.exit_lock.acquire(blocking=False):  # another thread is stopping the process
            while True:
                time.sleep(60)
        self._exit(failure.summary if own_message is None else own_message)

    def _exit(self, line: str) -> NoReturn:
        """Print `error: <line>`, tell the others this process has read the failure, and exit 1 without
        jax's shutdown barrier; process 0 first waits (up to ACK_WAIT_S) until the others have read it."""
        self.stopping.set()
        run_clean_ups()
        logging.flush()
        sys.stderr.flush()
        log = os.dup(2)  # the dying jax client writes to fd 2 at any moment: silence it, then write ours last
        os.dup2(os.open(os.devnull, os.O_WRONLY), 2)
        os.write(log, f"error: {line}\n".encode())
        if not self.store_lost:
            self._say(STOPPED.encode())
            try:
                self.client.key_value_set(ALIVE_DIR + str(self.me), STOPPED, allow_overwrite=True)
                if self.me == 0:
                    self._wait_until_others_stop()
            except Exception:  # noqa: BLE001 (the store is gone: nothing left to wait for)
                pass
        sys.stdout.flush()
        os._exit(1)

    def _wait_until_others_stop(self) -> None:
        deadline = time.monotonic() + ACK_WAIT_S
        while time.monotonic() < deadline:
            values = dict(self.client.key_value_dir_get(ALIVE_DIR))
            running = [p for p in range(1, self.count)
                       if p not in self.dead and values.get(ALIVE_DIR + str(p)) not in (STOPPED, DONE)]
            if not running:
                return
            time.sleep(0.1)

    def finish(self) -> None:
        """At a normal exit (before jax's shutdown barrier): stop watching and say so, so that no process
        takes one that has finished for a dead one."""
        if self.stopping.is_set():
            return
        self.stopping.set()
        self._say(DONE.encode())
        for connection in self.links:  # wakes the link thread
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(Exception):
            self.client.key_value_set(ALIVE_DIR + str(self.me), DONE, allow_overwrite=True)
        for thread in self.threads:
            thread.join(timeout=self.poll_s + 2)


_clean_ups: list[Callable[[], None]] = []


@contextlib.contextmanager
def clean_up_on_stop(callback: Callable[[], None]):
    """Within: a stop of this process runs `callback` before it exits. The main thread's own clean-up (its
    `with` blocks) runs when it stops on an exception; a watching thread that stops the process while the main
    thread waits in native code (a compilation, a collective) cannot reach those, and runs these instead."""
    _clean_ups.append(callback)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            _clean_ups.remove(callback)


def run_clean_ups() -> None:
    """The clean-ups still registered (the innermost first); one that fails does not keep the others from running."""
    while _clean_ups:
        callback = _clean_ups.pop()
        try:
            callback()
        except Exception:  # noqa: BLE001 (the process is stopping: what is left is best effort)
            logging.exception("clean-up before stopping failed")


def _raise_in_main_thread() -> None:
    """PeerFailed in the main thread at its next Python instruction (at once unless it waits in native code)."""
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(threading.main_thread().ident),
                                               ctypes.py_object(PeerFailed))


def _drop_lost_interrupt(unraisable: Any, *, previous: Callable[[Any], None]) -> None:
    """sys.unraisablehook while watching: a PeerFailed that Python swallowed (see Cluster._interrupt_main_thread)
    prints nothing and is raised again; anything else goes to the hook before."""
    if _cluster is not None and issubclass(unraisable.exc_type, PeerFailed):
        _cluster.main_stopping.clear()  # PeerFailed() set it, but the main thread goes on
        _cluster.interrupt_lost.set()
        return
    previous(unraisable)


_cluster: Cluster | None = None


def watch(heartbeat_timeout: int) -> None:
    """Start watching the other processes (after jax.distributed.initialize; nothing for one process)."""
    global _cluster
    from jax._src import distributed as jax_distributed

    state = jax_distributed.global_state  # the same in jax 0.10 and 0.11
    if state.client is None or state.num_processes < 2 or _cluster is not None:
        return
    _cluster = Cluster(state.client, state.process_id, state.num_processes, heartbeat_timeout,
                       state.coordinator_address)
    sys.unraisablehook = functools.partial(_drop_lost_interrupt, previous=sys.unraisablehook)
    _cluster.start()
    atexit.register(_cluster.finish)  # registered after jax's clean-up, so it runs before it


def active() -> bool:
    """Whether this process is one of several that watch each other."""
    return _cluster is not None


def stop_together(main: F) -> F:
    """Wrap a CLI main: in a job of several processes, an exception on this process (or news of another's
    failure) stops every process with one line each instead of leaving them waiting. One process: as is."""

    @functools.wraps(main)
    def wrapped(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except Exception as e:
            if _cluster is None:
                raise
            while True:
                try:
                    _cluster.stop_on(e)  # never returns
                except PeerFailed as interrupted:  # raised by a watching thread while this one was stopping
                    e = interrupted

    return wrapped  # type: ignore[return-value]


def current() -> Cluster | None:
    """This process's view of the job (None: one process, or not yet watching)."""
    return _cluster

