#!/usr/bin/env bash
# The Debian package `./dev release` builds, as a user installs it (root, repository root, after
# the release): dpkg -i, the installed unit's own command started (CI has no systemd) until
# /metrics answers, then dpkg --purge, which must leave neither the binary nor the config.
set -euo pipefail
deb=$(ls target/dist/gpuwatch_*.deb)
dpkg -i "$deb"
test -f /usr/share/man/man1/gpuwatch.1.gz && test -f /usr/share/bash-completion/completions/gpuwatch
cmd=$(sed -n 's/^ExecStart=//p' /lib/systemd/system/gpuwatch.service)
echo "starting the unit's command (no systemd here): $cmd"
$cmd > /tmp/gpuwatch-deb.log 2>&1 &
agent=$!
for _ in $(seq 60); do
  if curl -fsS http://127.0.0.1:9879/metrics 2>/dev/null | grep -q '^gpuwatch_up{source="nvml"}'; then break; fi
  sleep 0.5
done
curl -fsS http://127.0.0.1:9879/metrics | grep '^gpuwatch_up'
kill -TERM $agent; wait $agent
dpkg --purge gpuwatch
test ! -e /usr/bin/gpuwatch && test ! -e /etc/gpuwatch/gpuwatch.yaml
echo "the package installed, served /metrics as its unit starts it, and purged cleanly"
