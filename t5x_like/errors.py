"""User errors: one clear message and exit 1, no traceback. Bugs keep their traceback.

Code that detects a mistake the user can fix (a bad flag or macro value, a missing or damaged
file, a config that does not fit) raises `UserError` with a message naming the file or value and
the fix. Every CLI's entry point runs through `exit_on_user_error`, which prints that message
alone and exits 1; anything else propagates with its traceback, as a bug should.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import os
import sys
from typing import Any, Callable, Iterator, TypeVar

from configs.errors import PresetError
from partitioning.errors import PartitioningError

F = TypeVar("F", bound=Callable[..., Any])


class UserError(ValueError):
    """A mistake the user can fix; the message says what and how. A ValueError, so callers that
    validate with `except ValueError` keep working. `ends_the_process`: once said, the process ends at once,
    whatever threads are still running (a failed orbax save leaves threads that wait forever)."""

    ends_the_process = False


USER_ERRORS = (UserError, PartitioningError, PresetError)
"""What the CLIs print as one line: ours, and the errors partitioning/ and configs/ (which import nothing of
t5x_like) raise for settings the user gives."""


def note(message: str) -> None:
    """Tell the user something a command did that they may not expect (a part left out, a file not recorded): one
    `note: ...` line on stderr, beside the command's output."""
    print(f"note: {message}", file=sys.stderr, flush=True)


INTERRUPTED_STATUS = 130
"""A shell's status for a command ended by Ctrl-C (128 + SIGINT)."""


def exit_on_user_error(main: F) -> F:
    """Wrap a CLI main: a UserError becomes `error: <message>` on stderr and exit status 1; Ctrl-C (a
    KeyboardInterrupt: the CLIs write their outputs whole, so what they leave is what was there before; a
    training run past its start stops at a step with a checkpoint instead, t5x_like/run/stopping.py) one line and
    status 130."""

    @functools.wraps(main)
    def wrapped(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except KeyboardInterrupt:  # every `with` and `finally` on the way out has run
            pass
        except USER_ERRORS as e:
            print(f"error: {e}", file=sys.stderr, flush=True)
            if getattr(e, "ends_the_process", False):
                sys.stdout.flush()
                os._exit(1)
            sys.exit(1)
        end_interrupted()

    return wrapped  # type: ignore[return-value]


def end_interrupted() -> None:
    """After Ctrl-C: the interrupted frames released (their objects' finalizers run: a worker pool's semaphores
    are unregistered, so multiprocessing's tracker has nothing to warn of), one line, and the end, without
    finalising the interpreter (under XLA's threads that can crash)."""
    gc.collect()
    print("\ninterrupted (Ctrl-C): stopped before finishing; nothing half-written is left", file=sys.stderr,
          flush=True)
    sys.stdout.flush()
    os._exit(INTERRUPTED_STATUS)


@contextlib.contextmanager
def as_user_error(what: str = "") -> Iterator[None]:
    """Inside, a plain ValueError (a model config checking the values a user gave it) becomes a UserError
    with the same message (prefixed by `what`): models/ raise ValueError and know no CLI."""
    try:
        yield
    except UserError:
        raise
    except ValueError as e:
        raise UserError(f"{what}{e}") from None


SHORT_HELP = ("--help", "-help", "-h", "-?", "--helpshort")
FULL_HELP = ("--helpfull", "-helpfull")


def run_absl_app(main: Callable[[list[str]], Any], **run_kwargs: Any) -> None:
    """absl's `app.run(main, **run_kwargs)`, except that asking for help (absl's own help flags)
    prints the usage and exits 0: absl exits 1 after printing it, so help read as a failure."""
    from absl import app

    asked = set(sys.argv[1:])
    if asked & set(SHORT_HELP + FULL_HELP):
        app.usage(shorthelp=not asked & set(FULL_HELP), writeto_stdout=True)
        sys.exit(0)
    app.run(main, **run_kwargs)
