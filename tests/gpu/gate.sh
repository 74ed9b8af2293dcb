# Sourced by the GPU-host checks. `gate NAME CMD...` runs one scored check (a command that exits
# non-zero when its figure misses the target) and remembers the outcome; `gates_done` prints one
# line per check and exits 1 when any missed, so a script that sources this cannot pass on a
# miss. tests/gpu/all.sh collects these lines from every script it runs.
GATES=""
MISSED=""
gate() {
  local name=$1; shift
  if "$@"; then
    GATES="$GATES\nCHECK $name: met"
  else
    GATES="$GATES\nCHECK $name: MISSED"
    MISSED="$MISSED $name"
  fi
}
gates_done() {
  printf "== checks%b\n" "$GATES"
  if [ -n "$MISSED" ]; then
    echo "MISSED:$MISSED"
    exit 1
  fi
  echo "every scored check met its target"
}
