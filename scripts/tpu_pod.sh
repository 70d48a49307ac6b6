#!/usr/bin/env bash
# Run t5x_like on a Cloud TPU VM pod slice: every step reaches all workers (--worker=all), so no host
# is missed, and every process of the job runs the same train command.
set -euo pipefail

readonly REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
readonly REMOTE_DIR='t5x_like'   # on each worker, relative to the login user's home
readonly ARCHIVE='t5x_like.tar.gz'

usage() {
  cat <<'EOF'
Usage: scripts/tpu_pod.sh [--dry_run] COMMAND --name=TPU --zone=ZONE [--project=PROJECT] [options] [-- TRAIN_ARGS]

Commands:
  create   reuse TPU if it exists, else create it
             --accelerator_type=TYPE   e.g. v5p-32, v6e-16, v4-32 (required)
             --version=RUNTIME         TPU VM runtime, e.g. v2-alpha-tpuv5, v2-alpha-tpuv6e (required)
             --spot | --preemptible    cheaper capacity that can be reclaimed
  install  copy this working tree (tracked and non-ignored files) to ~/t5x_like on every worker and
           install it there with uv into a Python 3.11 venv, ~/t5x_like/.venv: pip install -e '.[tpu]'
           (TPU VM images ship an older Python; uv fetches 3.11)
  run      start `python -m t5x_like.train TRAIN_ARGS` on every worker in the background, then stream
           the logs (Ctrl-C stops the streaming, not the run)
  logs     stream ~/t5x_like/train.log from every worker
  stop     stop the run on every worker
  delete   delete the TPU

--dry_run prints every command instead of running it.

Example:
  scripts/tpu_pod.sh create  --name=pod --zone=us-east5-a --accelerator_type=v5p-32 --version=v2-alpha-tpuv5 --spot
  scripts/tpu_pod.sh install --name=pod --zone=us-east5-a
  scripts/tpu_pod.sh run     --name=pod --zone=us-east5-a -- --gin_file=gpt2.gin --gin.MODEL_DIR="'/mnt/shared/runs/gpt2'"

MODEL_DIR must be a path every worker can write (a gcsfuse-mounted bucket, a Filestore share);
gs:// URLs are not accepted.
EOF
}

die() {
  echo "tpu_pod.sh: $*" >&2
  echo "Run scripts/tpu_pod.sh --help for usage." >&2
  exit 2
}

dry_run=0
command=''
name=''
zone=''
project=''
accelerator_type=''
version=''
capacity_flag=''
location=()   # --zone / --project, for every gcloud call
train_args=()

parse_args() {
  while (($#)); do
    case "$1" in
      --dry_run) dry_run=1 ;;
      --name=*) name="${1#*=}" ;;
      --zone=*) zone="${1#*=}" ;;
      --project=*) project="${1#*=}" ;;
      --accelerator_type=*) accelerator_type="${1#*=}" ;;
      --version=*) version="${1#*=}" ;;
      --spot | --preemptible) capacity_flag="$1" ;;
      -h | --help) usage; exit 0 ;;
      --) shift; train_args=("$@"); break ;;
      create | install | run | logs | stop | delete)
        [[ -z "$command" ]] || die "two commands given: '$command' and '$1'; give one."
        command="$1" ;;
      *) die "unknown argument '$1'." ;;
    esac
    shift
  done
  [[ -n "$command" ]] || die "no command; give one of create, install, run, logs, stop, delete."
  [[ -n "$name" ]] || die "--name=TPU is required (the TPU VM's name)."
  [[ -n "$zone" ]] || die "--zone=ZONE is required (e.g. --zone=us-east5-a)."
  location=("--zone=$zone")
  [[ -z "$project" ]] || location+=("--project=$project")
}

# shellcheck source=scripts/_run_or_print.sh
source "$REPO_ROOT/scripts/_run_or_print.sh"

tpu_vm() {
  run_cmd gcloud compute tpus tpu-vm "$1" "$name" "${location[@]}" "${@:2}"
}

on_all_workers() {
  tpu_vm ssh --worker=all "--command=$1"
}

create() {
  [[ -n "$accelerator_type" ]] || die "create needs --accelerator_type=TYPE (e.g. v5p-32)."
  [[ -n "$version" ]] || die "create needs --version=RUNTIME (e.g. v2-alpha-tpuv5 for v5p)."
  local state
  if ((!dry_run)) && state="$(tpu_vm describe --format='value(state)' 2>/dev/null)"; then
    echo "tpu_pod.sh: TPU '$name' exists (state: $state); reusing it."
    return
  fi
  local -a capacity=()
  [[ -z "$capacity_flag" ]] || capacity=("$capacity_flag")
  ((!dry_run)) || echo "# create only if 'gcloud compute tpus tpu-vm describe $name' finds no TPU:"
  tpu_vm create "--accelerator-type=$accelerator_type" "--version=$version" "${capacity[@]}"
}

install() {
  local archive="${TMPDIR:-/tmp}/$name-$ARCHIVE"
  run_cmd bash -c 'git -C "$1" ls-files --cached --others --exclude-standard -z | tar -C "$1" --null -T - -czf "$2"' \
    _ "$REPO_ROOT" "$archive"
  run_cmd gcloud compute tpus tpu-vm scp "$archive" "$name:$ARCHIVE" "${location[@]}" --worker=all
  on_all_workers "set -e; mkdir -p ~/$REMOTE_DIR; tar -xzf ~/$ARCHIVE -C ~/$REMOTE_DIR; cd ~/$REMOTE_DIR; \
[ -x ~/.local/bin/uv ] || curl -LsSf https://astral.sh/uv/install.sh | sh; \
~/.local/bin/uv venv --allow-existing --python 3.11 .venv; \
~/.local/bin/uv pip install --python .venv/bin/python -e '.[tpu]'"
}

run() {
  ((${#train_args[@]})) || die "run needs the train arguments after '--', e.g. -- --gin_file=gpt2.gin --gin.MODEL_DIR=\"'/mnt/shared/runs/gpt2'\"."
  local quoted_args
  quoted_args="$(printf ' %q' "${train_args[@]}")"
  on_all_workers "cd ~/$REMOTE_DIR && if [ -f train.pid ] && kill -0 \$(cat train.pid) 2>/dev/null; then \
echo \"\$(hostname): a run is still going (pid \$(cat train.pid)); scripts/tpu_pod.sh stop first\" >&2; exit 1; fi; \
nohup .venv/bin/python -m t5x_like.train$quoted_args > train.log 2>&1 < /dev/null & echo \$! > train.pid"
  logs
}

logs() {
  on_all_workers "tail -n 100 -F ~/$REMOTE_DIR/train.log"
}

stop() {
  on_all_workers "cd ~/$REMOTE_DIR && if [ -f train.pid ]; then kill \$(cat train.pid) 2>/dev/null || true; rm -f train.pid; fi"
}

delete() {
  tpu_vm delete --quiet
}

main() {
  parse_args "$@"
  "$command"
}

main "$@"
