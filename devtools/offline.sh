#!/usr/bin/env bash
# Runs a command inside a network namespace that has only loopback, when this machine allows it
# (root, unshare, ip), so that the test suite proves the pack needs no network. WAN22_OFFLINE=1 tells
# the tests they are inside it.
set -euo pipefail
if [ "${WAN22_ALLOW_NETWORK:-0}" != 1 ] && command -v unshare >/dev/null && command -v ip >/dev/null \
   && unshare -n true 2>/dev/null; then
  exec unshare -n bash -c 'ip link set lo up && WAN22_OFFLINE=1 exec "$@"' offline "$@"
fi
echo "[offline] no network namespace here: running with the machine's network" >&2
exec "$@"
