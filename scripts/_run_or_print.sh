# Sourced by the launchers: `run_cmd CMD ARGS...` runs the command, or under dry_run=1 prints it
# shell-quoted (copy-pastable) after a '+'.
run_cmd() {
  if ((dry_run)); then
    local arg line='+'
    for arg in "$@"; do
      if [[ "$arg" =~ ^[[:alnum:]_./:=@%+,-]+$ ]]; then line+=" $arg"; else line+=" ${arg@Q}"; fi
    done
    echo "$line"
  else
    "$@"
  fi
}
