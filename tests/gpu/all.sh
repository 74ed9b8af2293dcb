#!/usr/bin/env bash
# The GPU-host checks that score a figure against its target, in one go (root, repository root,
# `cargo xtask gpu-bundle`'s files in .device/). Each runs with its evidence under $OUT/<name>;
# then one table: each script's exit status and every scored check's outcome. Exits 1 when any
# check missed or any script failed.
#
#   bash tests/gpu/all.sh                       # the set below, ~8 minutes
#   RUN="docker:lone,share energy" bash tests/gpu/all.sh
#
# RUN lists SCRIPT[:STAGES] (stages comma-separated, for the scripts that take STAGES).
# accuracy.sh (12 labelled jobs, ~7 min) and the other stages run on their own.
set -uo pipefail
OUT=${OUT:-/tmp/gpuwatch-all}
RUN=${RUN:-"docker:lone,share,spin shared:two energy privileges ddp loader"}
mkdir -p "$OUT"
declare -a ROWS=()
status=0
for item in $RUN; do
  name=${item%%:*}
  stages=""
  [ "$item" != "$name" ] && stages=${item#*:}
  script=tests/gpu/${name}_check.sh
  [ "$name" = accuracy ] && script=tests/gpu/accuracy.sh
  log="$OUT/$name.log"
  echo "== $name ${stages:+(stages $stages)}"
  started=$(date +%s)
  OUT="$OUT/$name" STAGES="${stages//,/ }" timeout "${EACH_S:-300}" bash "$script" > "$log" 2>&1
  rc=$?
  took=$(( $(date +%s) - started ))
  [ $rc -ne 0 ] && status=1
  ROWS+=("$(printf '%-12s exit %-3s %4ss' "$name" "$rc" "$took")")
  while IFS= read -r line; do ROWS+=("    ${line#CHECK }"); done < <(grep '^CHECK ' "$log")
  tail -3 "$log"
done
echo
echo "== every check (SCRIPT exit status, then its scored checks)"
printf '%s\n' "${ROWS[@]}"
exit $status
