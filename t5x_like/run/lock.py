"""One trainer per MODEL_DIR: `MODEL_DIR/run.lock` names the holder (host, pid, start time).

Process 0 of a job creates the lock with O_CREAT | O_EXCL (atomic on local and NFS-style shared
filesystems) and refreshes its modification time every `HEARTBEAT_S` seconds from a daemon thread;
the job's other processes trust it. A lock is stale, and is replaced, when its holder ran on this
host and that pid is gone, or when its heartbeat is older than `stale_after_s` (a holder on another
host that died without releasing it). Anything else refuses the second trainer with a message
naming the holder and how to clear a stale lock.
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import threading
import time

from absl import logging

from t5x_like.cluster.host import pid_running
from t5x_like.errors import UserError

LOCK_FILE = "run.lock"
HEARTBEAT_S = 30.0
STALE_AFTER_S = 600.0


class RunLockedError(UserError):
    """MODEL_DIR is held by another live trainer."""


class RunLock:
    """`with RunLock(model_dir):` holds MODEL_DIR for this process (call only on process 0)."""

    def __init__(self, model_dir: str, *, stale_after_s: float = STALE_AFTER_S, heartbeat_s: float = HEARTBEAT_S):
        self.path = os.path.join(model_dir, LOCK_FILE)
        self.stale_after_s = stale_after_s
        self.heartbeat_s = heartbeat_s
        self._holder = {"host": socket.gethostname(), "pid": os.getpid(),
                        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def acquire(self) -> None:
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        if not self._create():
            holder, age = self._read()
            reason = self._stale_reason(holder, age)
            if reason is None:
                raise RunLockedError(self._locked_message(holder, age))
            logging.warning("%s: replacing a stale lock (%s): %s", self.path, reason, holder)
            os.unlink(self.path)
            if not self._create():
                holder, age = self._read()
                raise RunLockedError(self._locked_message(holder, age))
        self._thread = threading.Thread(target=self._beat, name="run-lock-heartbeat", daemon=True)
        self._thread.start()

    def release(self) -> None:
        """Stop the heartbeat and remove the lock if it is still ours."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is not None:
            thread.join()
        holder, _ = self._read()
        if holder == self._holder:
            with contextlib.suppress(FileNotFoundError):  # released by two threads at once (cluster/peers.py)
                os.unlink(self.path)

    def _create(self) -> bool:
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        try:
            with os.fdopen(fd, "w") as f:
                json.dump(self._holder, f)
        except OSError as e:  # a full disk: no empty lock left behind, and the error names the file
            os.unlink(self.path)
            raise OSError(e.errno, e.strerror, self.path) from None
        return True

    def _read(self) -> tuple[dict | None, float]:
        """(holder or None when the file is gone or unreadable, seconds since its last heartbeat)."""
        try:
            age = time.time() - os.path.getmtime(self.path)
            with open(self.path) as f:
                return json.load(f), age
        except (FileNotFoundError, ValueError):
            return None, 0.0

    def _stale_reason(self, holder: dict | None, age: float) -> str | None:
        if holder is None:
            return "unreadable"
        if holder.get("host") == socket.gethostname() and not pid_running(holder.get("pid", -1)):
            return f"pid {holder.get('pid')} is not running on this host"
        if age > self.stale_after_s:
            return f"no heartbeat for {age:.0f}s"
        return None

    def _locked_message(self, holder: dict | None, age: float) -> str:
        return (f"MODEL_DIR {os.path.dirname(self.path)} is in use by another trainer: {holder} (lock file "
                f"{self.path}, heartbeat {age:.0f}s ago). Two trainers on one MODEL_DIR corrupt each other's "
                "checkpoints and metrics: use another MODEL_DIR, or stop that trainer first. If it is gone "
                f"(e.g. a crashed job on another host), delete {self.path}; a lock whose heartbeat is older than "
                f"{self.stale_after_s:.0f}s, or whose pid has died on this host, is replaced automatically.")

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_s):
            try:
                os.utime(self.path)
            except FileNotFoundError:
                logging.error("%s disappeared while this trainer holds MODEL_DIR", self.path)
                return
