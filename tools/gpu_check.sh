#!/usr/bin/env bash
# towerdist's GPU check (see tools/gpu_check.py): on a machine with one GPU and no network,
# from the root of a checkout that carries its wheels in .whl/ (optree and friends):
#     bash tools/gpu_check.sh [--out DIR] [--budget SECONDS] [--quick] [--simulate N]
# When the Python running this cannot import optree, the wheels are unpacked into a scratch
# directory put on PYTHONPATH (nothing is installed system-wide).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PY=${PY:-python3}
if ! "$PY" -c "import optree" > /dev/null 2>&1 && compgen -G ".whl/*.whl" > /dev/null; then
  site="${GPU_CHECK_SITE:-/tmp/towerdist_gpu_check_site}"
  rm -rf "$site"
  if ! "$PY" -m pip install -q --no-index --no-deps --target "$site" .whl/*.whl > /dev/null 2>&1; then
    for wheel in .whl/*.whl; do "$PY" -m zipfile -e "$wheel" "$site"; done  # a wheel is a zip of site-packages
  fi
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export CUPY_CACHE_DIR="${CUPY_CACHE_DIR:-/tmp/cupy_kernel_cache}"
exec "$PY" tools/gpu_check.py "$@"
