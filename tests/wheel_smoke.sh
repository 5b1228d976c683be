#!/usr/bin/env bash
# `make wheel-smoke`: build the sdist and the wheel, install the wheel into a fresh venv, run
# tests/wheel_smoke.py there, from outside the source tree (so the import is the wheel's).
# $1: the dev venv's python. jax, jaxlib, numpy and their own dependencies are constrained to the
# versions the dev venv has, so pip reuses what it downloaded for the dev venv (its cache) rather
# than fetching another jax.
set -euo pipefail
DEV_PY=${1:-.venv/bin/python}
ROOT=$(pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

rm -rf dist
"$DEV_PY" -m build --outdir dist . >"$TMP/build.log" 2>&1 || { tail -40 "$TMP/build.log"; exit 1; }
WHEEL=$(ls dist/jaxdist-*.whl)
SDIST=$(ls dist/jaxdist-*.tar.gz)
echo "built $SDIST and $WHEEL"
# The sdist carries what a rebuild needs (LICENSE included).
# (listings go to files first: `grep -q` closing a pipe early fails the pipeline under pipefail)
tar -tzf "$SDIST" >"$TMP/sdist.txt"
grep -q '/LICENSE$' "$TMP/sdist.txt" || { echo "LICENSE missing from $SDIST"; exit 1; }
"$DEV_PY" -m zipfile -l "$WHEEL" >"$TMP/wheel.txt"
grep -q 'jaxdist/py.typed' "$TMP/wheel.txt" || { echo "py.typed missing from $WHEEL"; exit 1; }
grep -q 'licenses/LICENSE' "$TMP/wheel.txt" || { echo "LICENSE missing from $WHEEL"; exit 1; }

"$DEV_PY" -m pip freeze --exclude-editable \
    | grep -iE '^(jax|jaxlib|numpy|ml[-_]dtypes|opt[-_]einsum|scipy)==' >"$TMP/constraints.txt" || true
"$DEV_PY" -m venv "$TMP/venv"
"$TMP/venv/bin/python" -m pip install -q --disable-pip-version-check \
    -c "$TMP/constraints.txt" "$ROOT/$WHEEL"
cd "$TMP"
env -u PYTHONPATH XLA_FLAGS=--xla_force_host_platform_device_count=2 \
    "$TMP/venv/bin/python" "$ROOT/tests/wheel_smoke.py"
