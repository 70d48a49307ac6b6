"""Storage faults during a run (a disk that fills, a folder made read-only or removed): one line naming the
path and the fix, saying whether the last good checkpoint is intact, instead of orbax's and tensorstore's
tracebacks.

    with storage.one_line_errors(model_dir):
        ...   # an OSError of the filesystem, or orbax / tensorstore's error carrying one, becomes a StorageError

orbax saves in background threads: a failed write surfaces in the main thread at the next
`wait_until_finished` (the next save, or the end of the run) as tensorstore's ValueError
("RESOURCE_EXHAUSTED: ... No space left on device [os_error_code='28']") or a Python OSError.
"""
from __future__ import annotations

import contextlib
import errno
import glob
import os
import re
import sys
import threading
from typing import Iterator

from t5x_like.checks import CHECKPOINT_SUBDIR
from t5x_like.errors import UserError

STORAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EACCES, errno.EPERM, errno.EROFS, errno.EIO,
                  errno.ENOENT, errno.ENOTDIR, errno.ESTALE}
FIXES = {errno.ENOSPC: "free space", errno.EDQUOT: "free space (a quota is full)",
         errno.EFBIG: "allow larger files (a file size limit was reached)", errno.EACCES: "make it writable",
         errno.EPERM: "make it writable", errno.EROFS: "use a writable filesystem",
         errno.EIO: "check the disk or network filesystem"}
REMOVED_FIX = "a folder was removed while the run wrote into it: keep MODEL_DIR in place"
_OS_ERROR_CODE = re.compile(r"os_error_code='?(\d+)")
_TENSORSTORE_PATH = re.compile(r'(?:Failed writing: |local file )"([^"]+)"')
_TENSORSTORE_STATUS = {"NOT_FOUND": errno.ENOENT, "PERMISSION_DENIED": errno.EACCES, "RESOURCE_EXHAUSTED": errno.ENOSPC}
_STEP_TMP = re.compile(r"^(.*)/(\d+)\.orbax-checkpoint-tmp[^/]*")


class StorageError(UserError):
    """MODEL_DIR's storage failed (full, not writable, removed); the message names the path and the fix. The
    process ends right after it: orbax's threads of a save that failed early (a read-only checkpoints/) wait
    forever for its signals, and the interpreter would wait for them."""

    ends_the_process = True


@contextlib.contextmanager
def one_line_errors(model_dir: str) -> Iterator[None]:
    """Inside, a storage fault (see `fault`) becomes a StorageError naming the path, the reason, the state of
    the last checkpoint and the fix; any other exception passes unchanged."""
    quiet_closed_loop_noise()
    try:
        yield
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - orbax and tensorstore wrap OS errors in ValueError / RuntimeError
        found = fault(e)
        if found is None:
            raise
        raise StorageError(message(model_dir, *found)) from None


def aftermath(error: BaseException | None) -> bool:
    """Whether `error` is what a failed orbax save leaves behind in its other threads, said by the StorageError's
    one line: the fault itself, tensorstore completing writes into the event loop orbax closed, and orbax's
    threads and coroutines still running when the interpreter exits."""
    text = str(error)
    return error is not None and (
        fault(error) is not None or ".orbax-checkpoint-tmp" in text  # a save's error: raised again in the main thread
        or (isinstance(error, RuntimeError) and (text == "Event loop is closed"
                                                 or text.startswith("cannot schedule new futures after")))
        or (isinstance(error, ImportError) and "Python is likely shutting down" in text))


def quiet_closed_loop_noise() -> None:
    """Drop the unraisable and uncaught thread errors that are a failed save's `aftermath` (installed once, for
    the process); others print as before."""
    if getattr(sys.unraisablehook, "t5x_like_storage", False):
        return
    unraisable_hook, thread_hook = sys.unraisablehook, threading.excepthook

    def unraisable(report) -> None:
        if not aftermath(report.exc_value):
            unraisable_hook(report)

    def uncaught(report) -> None:
        if not aftermath(report.exc_value):
            thread_hook(report)

    unraisable.t5x_like_storage = True
    sys.unraisablehook, threading.excepthook = unraisable, uncaught


def fault(error: BaseException) -> tuple[int, str | None, str] | None:
    """(errno, path or None, reason) when `error`, or an exception it was raised from, is a storage fault."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, OSError) and error.errno in STORAGE_ERRNOS:
            return error.errno, error.filename, error.strerror or os.strerror(error.errno)
        text = str(error)
        paths = _TENSORSTORE_PATH.findall(text)
        code = _OS_ERROR_CODE.search(text)
        status = _TENSORSTORE_STATUS.get(text.split(":", 1)[0]) if paths else None  # tensorstore, on a local file
        if (code and int(code[1]) in STORAGE_ERRNOS) or status:
            number = int(code[1]) if code else status
            return number, (paths[-1] if paths else None), os.strerror(number)
        error = error.__cause__ or error.__context__
    return None


def message(model_dir: str, code: int, path: str | None, reason: str) -> str:
    if path is None:  # a write that named no file (orbax's JSON items): the save in flight, if any
        path = next(iter(glob.glob(os.path.join(glob.escape(os.path.abspath(model_dir)), CHECKPOINT_SUBDIR,
                                                "*.orbax-checkpoint-tmp*"))), None)
    step = _STEP_TMP.match(path or "")
    where = (f"the checkpoint of step {step[2]} could not be written in {step[1]}" if step else
             f"cannot write {path}" if path else f"cannot write in {model_dir}")
    fix = REMOVED_FIX if code in (errno.ENOENT, errno.ENOTDIR) else FIXES.get(code, "fix the storage")
    state, step_dir = last_good_checkpoint(model_dir)
    resume = f"it resumes from {step_dir}" if step_dir else "it starts the run from step 0"
    return f"{where}: {reason}; {state}. To go on, {fix}, then run the same command again: {resume}."


def last_good_checkpoint(model_dir: str) -> tuple[str, str | None]:
    """(what a restart finds, the step directory it resumes from or None), the newest step checked: every file
    present at the size its manifest records (no checksums read: cheap, and no process waits for another)."""
    from t5x_like.checkpoint import store

    directory = os.path.join(os.path.abspath(model_dir), CHECKPOINT_SUBDIR)
    if not os.path.isdir(directory):
        return f"there is no checkpoint ({directory} does not exist)", None
    damaged = []
    for step in sorted((int(n) for n in os.listdir(directory) if n.isdigit()), reverse=True):
        step_dir = os.path.join(directory, str(step))
        try:
            verified = store.verify_manifest(step_dir, sizes_only=True)
        except (store.CorruptCheckpointError, OSError):
            damaged.append(step)
            continue
        checked = "every file present at its recorded size" if verified else "written without checksums, unchecked"
        others = f"; step(s) {damaged} are damaged" if damaged else ""
        return f"the last good checkpoint is {step_dir} ({checked}){others}", step_dir
    return f"{directory} holds no intact checkpoint" + (f" (step(s) {damaged} are damaged)" if damaged else ""), None
