"""`python -m t5x_like.train --gin_file=quickstart.gin --gin.MODEL_DIR="'runs/quickstart'"`.

Parses absl flags and gin (the run files in gin/, then --gin.NAME=VALUE), then trains (t5x_like/training.py):
assembles the run, opens the data, resumes from MODEL_DIR's newest checkpoint, loops over the steps, logs,
evaluates and checkpoints. `--print_config` prints every effective setting (defaults included), the model and the
learning-rate schedule, then exits (MODEL_DIR may be left unset).
"""
from __future__ import annotations

import sys

from absl import flags

from t5x_like import cli, cluster, distributed, gin_cli, run_config  # noqa: F401 (run_config: gin's configurables)
from t5x_like.describe import describe_run
from t5x_like.errors import exit_on_user_error, run_absl_app
from t5x_like.training import train

FLAGS = flags.FLAGS
flags.DEFINE_bool("print_config", False, "Print every effective setting (defaults included), the model "
                  "(shape, parameter count) and the learning-rate schedule, checked as training would, then exit "
                  "without touching MODEL_DIR (which it does not need).")
flags.adopt_module_key_flags(cli)


@exit_on_user_error
@cluster.stop_together
@gin_cli.plain_user_errors
def main(argv: list[str]) -> None:
    del argv
    cli.quiet_library_logs()
    distributed.initialize(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id,
                           initialization_timeout=FLAGS.initialization_timeout_seconds,
                           heartbeat_timeout_seconds=FLAGS.heartbeat_timeout_seconds)
    gin_cli.parse_gin(FLAGS.gin_file, FLAGS.gin_bindings, FLAGS.gin_search_paths,
                      may_stay_unset=("MODEL_DIR",) if FLAGS.print_config else ())  # printing writes nothing
    if FLAGS.print_config:
        print(describe_run(), end="")
        return
    result = train()
    if result.stopped_by_signal:
        sys.exit(128 + result.stopped_by_signal)


if __name__ == "__main__":
    __doc__ = gin_cli.usage_with_macros(__doc__)  # noqa: A001 (absl prints the main module's doc for --help)
    run_absl_app(main, flags_parser=cli.parse_flags)
