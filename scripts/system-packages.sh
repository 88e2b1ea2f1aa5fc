#!/usr/bin/env bash
# Debian packages the test suite and benches use: Chromium (report screenshot test) and wrk
# (bench/predictions_load.py). Installed only when missing; needs root (as on these machines).
set -euo pipefail
missing=()
command -v chromium >/dev/null || missing+=(chromium fonts-dejavu-core)
command -v wrk >/dev/null || missing+=(wrk)
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" -ne 0 ]; then
        echo "system-packages: not root; install ${missing[*]} yourself (the tests that need them skip)" >&2
        exit 0
    fi
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
