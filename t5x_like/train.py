"""`python -m t5x_like.train --gin_file=quickstart.gin --gin.MODEL_DIR="'runs/quickstart'"`.

Parses absl flags and gin (the run files in gin/, then --gin.NAME=VALUE), then trains (t5x_like/run/loop.py):
assembles the run, opens the data, resumes from MODEL_DIR's newest checkpoint, loops over the steps, logs,
evaluates and checkpoints. `--print_config` prints every effective setting (defaults included), the model and the
learning-rate schedule, then exits (MODEL_DIR may be left unset).
"""
from __future__ import annotations

import sys

from absl import flags

from t5x_like.cluster import peers, processes
from t5x_like.config import cli, frontend
from t5x_like.config.describe import describe_run
from t5x_like.errors import exit_on_user_error, run_absl_app
from t5x_like.run.loop import train

FLAGS = flags.FLAGS
flags.DEFINE_bool("print_config", False, "Print every effective setting (defaults included), the model "
                  "(shape, parameter count) and the learning-rate schedule, checked as training would, then exit "
                  "without touching MODEL_DIR (which it does not need).")
flags.adopt_module_key_flags(cli)


@exit_on_user_error
@peers.stop_together
@frontend.plain_user_errors
def main(argv: list[str]) -> None:
    del argv
    cli.quiet_library_logs()
    processes.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id,
                         initialization_timeout=FLAGS.initialization_timeout_seconds,
                         heartbeat_timeout_seconds=FLAGS.heartbeat_timeout_seconds)
    printing = FLAGS.print_config  # printing writes nothing and opens no data: MODEL_DIR and the data may stay unset
    settings = frontend.parse_gin(FLAGS.gin_file, FLAGS.gin_bindings, FLAGS.gin_search_paths, printing=printing)
    if printing:
        print(describe_run(settings), end="")
        return
    result = train(settings)
    if result.stopped_by_signal:
        sys.exit(128 + result.stopped_by_signal)


if __name__ == "__main__":
    __doc__ = frontend.usage_with_macros(__doc__)  # noqa: A001 (absl prints the main module's doc for --help)
    run_absl_app(main, flags_parser=cli.parse_flags)
