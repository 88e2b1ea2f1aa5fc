#!/usr/bin/env bash
# The GPU check in one go, for the lent device machine (see bench/gpu_check.py for what it checks).
#
# Prepare once, here (the wheels the device image lacks, git-ignored through .git/info/exclude):
#   echo /.whl/ >> .git/info/exclude; mkdir -p .whl && cd .whl && for spec in transformers==5.24.0 \
#     pydantic==2.14.4 pydantic-core==2.50.5 pydantic-settings==2.16.3 python-dotenv==1.2.4 \
#     typing-inspection==0.4.5 annotated-types==0.8.0; do python3 -m pip download --no-deps \
#     --only-binary=:all: --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
#     --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d . "$spec"; done
# Then run it there with `carry: [".whl"]`:  bash bench/gpu_check.sh
# It writes $OUT/gpu_check.json (or bench/out/gpu_check.json without $OUT) and the log beside it.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${OUT:-bench/out}"
mkdir -p "$out"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee "$out/gpu_check.log" || true
timeout 540 python3 bench/gpu_check.py --out "$out/gpu_check.json" "$@" 2>&1 | tee -a "$out/gpu_check.log"
# The scale step (Llama-3-8B's shape, random bf16 weights built on the device): its own budget, so a
# slow card still leaves the check above whole.
timeout 360 python3 bench/gpu_scale.py --out "$out/gpu_scale.json" 2>&1 | tee -a "$out/gpu_check.log" || true
