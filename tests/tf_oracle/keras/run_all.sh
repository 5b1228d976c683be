#!/bin/bash
# Re-run every scenario: one process per R (logical devices are set once per process), then merge.
set -e
cd "$(dirname "$0")"
PY=${PY:-/work/tfvenv/bin/python}
for R in 1 2 4 8; do
  "$PY" keras_cases.py "$R" "parts/r$R.json" 2>&1 | grep -v "^WARNING: All log\|^I0000\|oneDNN\|cpu_feature\|^To enable the following" || true
done
"$PY" merge.py
