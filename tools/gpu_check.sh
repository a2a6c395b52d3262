#!/usr/bin/env bash
# The whole GPU check in one command, on the GPU machine's own Python and torch:
#   tools/gpu_check.sh OUT [--dry-run] [--budget SECONDS] [--only probe,hf_dp,...]
# equishard's pure-Python dependencies missing there travel as wheels in .whl/ (installed into
# a scratch folder, never over the machine's torch; tools/gpu_prepare.sh makes them). The
# InternVL length statistics are in the tree (bench/data/internvl_lengths). OUT gets
# summary.json and the logs. See tools/gpu_check.py for the steps.
set -uo pipefail
OUT=${1:?usage: tools/gpu_check.sh OUT [--dry-run] [--budget SECONDS] [--only STEPS]}
shift
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import webdataset, datasets" 2>/dev/null && compgen -G ".whl/*.whl" >/dev/null; then
    SITE=${TMPDIR:-/tmp}/equishard-gpu-site
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target "$SITE" .whl/*.whl || exit 1
    export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
mkdir -p "$OUT"
"$PY" tools/gpu_check.py --out "$OUT" "$@"
