#!/usr/bin/env bash
# Everything `make cluster` runs that pip does not install (`make services` runs this):
#   redis-server (the Celery broker)  from Debian, when it is not on PATH: apt-get update, then
#                                     apt-get install redis-server, as root (or password-less sudo),
#                                     without starting Debian's own redis service (the cluster starts
#                                     its own on 127.0.0.1 and a free port)
#   Azurite, fake-gcs-server, MinIO   scripts/install-emulators.sh (.cache/, pinned, skipped when there)
# Exits non-zero naming what is missing and why; the Makefile warns, or under CI=true fails.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
missing=()

install_redis() {
    local sudo=()
    if ! command -v apt-get >/dev/null 2>&1; then
        missing+=("redis-server (not on PATH and no apt-get here: install Redis >= 7 and put redis-server on PATH)")
        return
    fi
    if [ "$(id -u)" -ne 0 ]; then
        if ! sudo -n true 2>/dev/null; then
            missing+=("redis-server (not on PATH, and installing it needs root: sudo apt-get install redis-server)")
            return
        fi
        sudo=(sudo -n)
    fi
    # Debian's postinst starts a redis service on port 6379 unless policy-rc.d forbids it (exit 101):
    # forbid it for this install only, when no policy is in place already.
    local policy=/usr/sbin/policy-rc.d own_policy=0
    if [ ! -e "$policy" ]; then
        printf '#!/bin/sh\nexit 101\n' | "${sudo[@]}" tee "$policy" >/dev/null
        "${sudo[@]}" chmod 755 "$policy"
        own_policy=1
    fi
    echo "installing redis-server from Debian (apt-get update, apt-get install redis-server)"
    local status=0
    {
        DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get update -q </dev/null &&
            DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -q --no-install-recommends \
                redis-server </dev/null
    } || status=$?
    if [ "$own_policy" -eq 1 ]; then "${sudo[@]}" rm -f "$policy"; fi
    if [ "$status" -ne 0 ]; then
        missing+=("redis-server (apt-get exited $status)")
    elif ! command -v redis-server >/dev/null 2>&1; then
        missing+=("redis-server (installed, but still not on PATH)")
    fi
}

if command -v redis-server >/dev/null 2>&1; then
    echo "redis-server: $(redis-server --version | head -1)"
else
    install_redis
fi

bash scripts/install-emulators.sh || missing+=("storage servers (scripts/install-emulators.sh, reasons above)")

if [ "${#missing[@]}" -gt 0 ]; then
    printf 'install-services: not installed: %s\n' "${missing[@]}" >&2
    exit 1
fi
