"""This host's processes: whether the writer of a lock or a temporary file still runs here (run/lock.py's
MODEL_DIR lock, data/token_file.py's temporaries). No jax: the preprocessing command and its workers use it."""
from __future__ import annotations

import os


def pid_running(pid: int) -> bool:
    """Whether a process with this pid runs on this host."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
