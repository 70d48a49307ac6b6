"""What the gin-driven CLIs (train, compile) share: their absl flags, `--gin.NAME=VALUE`, and a console without
the libraries' chatter."""
from __future__ import annotations

import logging as std_logging
import re

from absl import flags, logging

from t5x_like.checkpoint import storage
from t5x_like.cluster import processes

FLAGS = flags.FLAGS
flags.DEFINE_multi_string("gin_file", [], "Gin file(s); bare names resolve in gin/.")
flags.DEFINE_multi_string("gin_bindings", [], "Gin bindings; also written as --gin.NAME=VALUE.")
flags.DEFINE_multi_string("gin_search_paths", [], "Extra directories to resolve gin files and includes in.")
flags.DEFINE_string("coordinator_address", None, "Multi-host: host:port of process 0.")
flags.DEFINE_integer("num_processes", None, "Multi-host: number of processes.")
flags.DEFINE_integer("process_id", None, "Multi-host: this process's index.")
flags.DEFINE_integer("heartbeat_timeout_seconds", processes.HEARTBEAT_TIMEOUT_SECONDS,
                     "Multi-host: a process silent this long is declared dead and the others exit with an error.")
flags.DEFINE_integer("initialization_timeout_seconds", processes.INITIALIZATION_TIMEOUT_SECONDS,
                     "Multi-host: how long processes wait for all of them to connect before exiting with an error.")


def parse_flags(argv: list[str]) -> list[str]:
    """absl parsing, with --gin.NAME=VALUE rewritten to --gin_bindings=NAME=VALUE."""
    rewritten = [re.sub(r"^--gin\.([^=]+)=(.*)$", r"--gin_bindings=\1=\2", a, flags=re.S) for a in argv]
    return FLAGS(rewritten)


def quiet_library_logs() -> None:
    """Keep orbax's per-save INFO chatter and gin's file-probing messages ('Path not found' for
    each search path it tries) out of the console; orbax warnings still show."""

    def keep(record: std_logging.LogRecord) -> bool:
        if "gin" in record.pathname and record.pathname.endswith("resource_reader.py"):
            return False
        if record.exc_info and storage.aftermath(record.exc_info[1]):  # a failed save: train's StorageError says it
            return False
        return record.levelno >= std_logging.WARNING or "orbax" not in record.pathname

    logging.get_absl_handler().addFilter(keep)
