#!/usr/bin/env bash
# Submits scripts/slurm_gpu.sbatch for a cluster shape: N nodes, G GPUs each, one process per node
# (default) or per GPU. Everything after `--` goes to `python -m t5x_like.train`.
set -euo pipefail

readonly REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

usage() {
  cat <<'EOF'
Usage: scripts/slurm_launch.sh --nodes=N [--gpus_per_node=8] [--per_gpu] [--partition=P] [--account=A]
                               [--time=HH:MM:SS] [--dry_run] -- TRAIN_ARGS

  --per_gpu   one process per GPU (--ntasks-per-node=G) instead of one per node driving all its GPUs
  --dry_run   print the sbatch command instead of submitting it

Example:
  scripts/slurm_launch.sh --nodes=4 --partition=h100 -- --gin_file=gpt2.gin --gin.MODEL_DIR="'/shared/runs/gpt2'"
EOF
}

die() {
  echo "slurm_launch.sh: $*" >&2
  echo "Run scripts/slurm_launch.sh --help for usage." >&2
  exit 2
}

# shellcheck source=scripts/_run_or_print.sh
source "$REPO_ROOT/scripts/_run_or_print.sh"

dry_run=0
nodes=''
gpus_per_node=8
per_gpu=0
sbatch_options=()
train_args=()

while (($#)); do
  case "$1" in
    --nodes=*) nodes="${1#*=}" ;;
    --gpus_per_node=*) gpus_per_node="${1#*=}" ;;
    --per_gpu) per_gpu=1 ;;
    --partition=* | --account=* | --time=*) sbatch_options+=("$1") ;;
    --dry_run) dry_run=1 ;;
    -h | --help) usage; exit 0 ;;
    --) shift; train_args=("$@"); break ;;
    *) die "unknown argument '$1'; train arguments go after '--'." ;;
  esac
  shift
done
[[ "$nodes" =~ ^[1-9][0-9]*$ ]] || die "--nodes=N is required, a positive integer (got '$nodes')."
[[ "$gpus_per_node" =~ ^[1-9][0-9]*$ ]] || die "--gpus_per_node must be a positive integer (got '$gpus_per_node')."
((${#train_args[@]})) || die "no train arguments after '--', e.g. -- --gin_file=gpt2.gin --gin.MODEL_DIR=\"'/shared/runs/gpt2'\"."

tasks_per_node=1
((!per_gpu)) || tasks_per_node="$gpus_per_node"

# Submitted from the repository root: the job starts there (SLURM_SUBMIT_DIR).
cd "$REPO_ROOT"
run_cmd sbatch "--nodes=$nodes" "--gpus-per-node=$gpus_per_node" "--ntasks-per-node=$tasks_per_node" \
  "${sbatch_options[@]}" "$REPO_ROOT/scripts/slurm_gpu.sbatch" "${train_args[@]}"
