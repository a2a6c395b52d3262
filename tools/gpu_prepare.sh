#!/usr/bin/env bash
# Here, before a GPU run: the wheels of equishard's pure-Python dependencies that the GPU
# machine's image lacks (for its Python 3.12), in a folder git ignores (.whl/), to be carried
# with the tree.
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo /.whl/ >>.git/info/exclude
grep -qx '/.gpu_data/' .git/info/exclude 2>/dev/null || echo /.gpu_data/ >>.git/info/exclude
PY=${PYTHON:-.venv/bin/python}
for pkg in webdataset braceexpand datasets dill multiprocess; do
    ver=$("$PY" -m pip show "$pkg" | awk '/^Version:/{print $2}')
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d .whl "$pkg==$ver"
done
du -sh .whl  # the InternVL statistics travel with the tree (bench/data/internvl_lengths)
