"""How a process of a job notices that another one died or hangs (t5x_like/cluster/peers.py's Cluster acts on it):
every process beats, a counter under `t5x_like/alive/<i>` in the coordination service's store, and one whose
counter stands still for the heartbeat timeout is dead; and every process holds a TCP connection to process 0,
which the kernel closes at once when a process is killed, so a dead process is known within a second."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import selectors
import socket
import time

from absl import logging

PREFIX = "t5x_like/"
FAILURE_KEY = PREFIX + "failure"
ALIVE_DIR = PREFIX + "alive/"      # ALIVE_DIR<i>: a beat counter, or 'stopped' / 'done' when process i exits
LINK_KEY = PREFIX + "link"          # the port of process 0's link server
STOPPED, DONE = "stopped", "done"


@dataclasses.dataclass(frozen=True)
class Failure:
    """Why the job stops: `process` is the one that failed or died; `summary` is the line every other
    process prints."""
    process: int
    summary: str


class Liveness:
    """The heartbeat and the links of a Cluster (which gives the store's `client`, this process's number `me`, the
    process `count`, the timings, `links`, the `stopping` event, `dead`, and what a failure does: `_on_failure`,
    `publish`, `dead_process`, `coordinator_lost`, `_exit`)."""

    # ------------------------------------------------------------------------------- heartbeat

    def _watch(self) -> None:
        """Long-poll the failure key; every beat_s, beat and look for a process whose beats stopped."""
        beats, next_beat = 0, 0.0
        last_seen: dict[int, tuple[str, float]] = {}
        while not self.stopping.is_set():
            try:
                value = self.client.blocking_key_value_get(FAILURE_KEY, int(self.poll_s * 1000))
                return self._on_failure(Failure(**json.loads(value)))
            except Exception as e:  # noqa: BLE001
                if self.stopping.is_set():
                    return
                if "DEADLINE_EXCEEDED" not in str(e):
                    return self._on_failure(self.coordinator_lost())
            if time.monotonic() < next_beat:
                continue
            beats += 1
            try:
                self.client.key_value_set(ALIVE_DIR + str(self.me), str(beats), allow_overwrite=True)
                dead = self._find_dead(last_seen)
            except Exception:  # noqa: BLE001
                if self.stopping.is_set():
                    return
                return self._on_failure(self.coordinator_lost())
            if dead is not None:
                return self._on_failure(self.publish(self.dead_process(dead, closed=False)))
            next_beat = time.monotonic() + self.beat_s

    def _find_dead(self, last_seen: dict[int, tuple[str, float]]) -> int | None:
        """A process whose beat counter has not moved for heartbeat_timeout s (process 0 watches all,
        the others watch process 0); None while all are alive."""
        now = time.monotonic()
        if self.me == 0:
            values = {int(key.rsplit("/", 1)[1]): value for key, value in self.client.key_value_dir_get(ALIVE_DIR)}
        else:
            try:
                values = {0: self.client.key_value_try_get(ALIVE_DIR + "0")}
            except Exception as e:  # noqa: BLE001
                if "NOT_FOUND" not in str(e):
                    raise
                values = {}
        for process in (range(1, self.count) if self.me == 0 else (0,)):
            value = values.get(process, "")
            if value in (STOPPED, DONE):
                continue
            if last_seen.get(process, (None,))[0] != value:
                last_seen[process] = (value, now)
            elif now - last_seen[process][1] > self.heartbeat_timeout:
                self.dead.add(process)
                return process
        return None

    # ------------------------------------------------------------------------------- links

    def _serve_links(self) -> None:
        """Process 0: one TCP connection from every other process. A connection that closes without the
        process saying it finished or stops means that process died: the kernel closes a killed process's
        sockets at once, long before a heartbeat is missed."""
        try:
            server = socket.create_server(("", 0), family=socket.AF_INET6, dualstack_ipv6=True) \
                if socket.has_dualstack_ipv6() else socket.create_server(("", 0))
            self.client.key_value_set(LINK_KEY, str(server.getsockname()[1]))
        except Exception as e:  # noqa: BLE001
            return logging.warning("no direct links between processes (%s): a dead process is noticed by its "
                                   "missing heartbeat only", e)
        with server, selectors.DefaultSelector() as selector:
            selector.register(server, selectors.EVENT_READ)
            said: dict[socket.socket, bytes] = {}
            while not self.stopping.is_set():
                for key, _ in selector.select(timeout=self.poll_s):
                    if key.fileobj is server:
                        connection, _ = server.accept()
                        self.links.append(connection)
                        said[connection] = b""
                        selector.register(connection, selectors.EVENT_READ)
                        continue
                    connection = key.fileobj
                    chunk = _receive(connection)
                    said[connection] += chunk
                    if chunk:
                        continue
                    selector.unregister(connection)
                    process, _, last = said.pop(connection).decode().partition("\n")
                    if not last and process.isdigit() and not self.stopping.is_set():
                        self.dead.add(int(process))
                        return self._on_failure(self.publish(self.dead_process(int(process), closed=True)))

    def _hold_link(self) -> None:
        """The other processes: hold a connection to process 0; when it closes without process 0 saying it
        finished or stops, process 0 died: say so and exit at once (jax aborts the process on the same news,
        with a C++ stack dump, a moment later)."""
        try:
            port = int(self.client.blocking_key_value_get(LINK_KEY, 120_000))
            connection = socket.create_connection((self.coordinator.rpartition(":")[0].strip("[]"), port), timeout=30)
            connection.settimeout(None)
            connection.sendall(f"{self.me}\n".encode())
        except Exception as e:  # noqa: BLE001
            return logging.warning("no direct link to process 0 (%s): its death is noticed by its missing "
                                   "heartbeat only", e)
        self.links.append(connection)
        said = b""
        while chunk := _receive(connection):
            said += chunk
        if said or self.stopping.is_set() or not self.exit_lock.acquire(blocking=False):
            return  # process 0 finished or stops after a failure (the store says why); or this process stops
        self.failure = self.coordinator_lost()
        self._exit(self.failure.summary)

    def _say(self, word: bytes) -> None:
        for connection in self.links:
            with contextlib.suppress(OSError):
                connection.sendall(word)


def _receive(connection: socket.socket) -> bytes:
    """What the other end sent; b'' once it has closed (or reset) the connection."""
    try:
        return connection.recv(256)
    except OSError:
        return b""
