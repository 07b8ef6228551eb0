#!/usr/bin/env bash
# Create (idempotently) the isolated virtual environment for the peer tool,
# Holistic Trace Analysis (HTA), used by the side-by-side benchmarks.
#
#   bash bench/hta_env.sh          # creates <repo>/.venv-hta if missing or stale
#   HTA_PYTHON=python3.11 bash bench/hta_env.sh
#
# HTA 0.5.0 declares jupyterlab, pytest and pydot as install requirements, but none of
# them is imported by the trace parser or by the analyzers we time (trace_analysis,
# critical_path_analysis). Installing them would pull ~100 packages (jupyter stack) for
# nothing, so HTA is installed with --no-deps and its *runtime* imports are pinned here:
#   numpy, pandas (<3: HTA 0.5.0 predates pandas 3), networkx (critical path graph),
#   plotly (imported at module level by the analyzers), pyyaml (event-args config),
#   psutil (hta.utils.utils); plus their own dependencies, pinned too.
# HTA does not depend on torch, so no torch is installed (and none can be pulled).
# ijson is deliberately not installed: HTA 0.5.0's default parser backend is the plain
# `json` one (get_default_trace_parsing_backend() hard-codes ParserBackend.JSON), which is
# what TraceAnalysis uses out of the box.
#
# Prints exactly one line on success; on failure prints the pip log tail to stderr.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv-hta"
PY="${HTA_PYTHON:-python3}"

REQS=(
  "holistictraceanalysis==0.5.0"
  "pandas==2.3.3"
  "numpy==2.3.5"
  "networkx==3.5"
  "plotly==5.24.1"
  "pyyaml==6.0.3"
  "psutil==7.2.2"
  # transitive, pinned so the environment is the same on every machine
  "python-dateutil==2.9.0.post0"
  "six==1.17.0"
  "pytz==2025.2"
  "tzdata==2025.2"
  "tenacity==9.1.2"
  "packaging==25.0"
)
SPEC="hta-env v1: ${REQS[*]}"
STAMP="$VENV/.hta-env-stamp"

check_import() {
  "$VENV/bin/python" - <<'EOF'
import importlib.metadata as md
import sys

import hta.common.trace  # noqa: F401  (the parser)
import hta.trace_analysis  # noqa: F401  (TraceAnalysis + critical path)
import pandas

assert md.version("holistictraceanalysis") == "0.5.0", md.version("holistictraceanalysis")
assert int(pandas.__version__.split(".")[0]) < 3, pandas.__version__
try:
    import torch  # noqa: F401
except ImportError:
    pass
else:
    sys.exit("torch must not be installed in .venv-hta")
EOF
}

if [[ -x "$VENV/bin/python" && -f "$STAMP" && "$(cat "$STAMP")" == "$SPEC" ]] \
    && check_import >/dev/null 2>&1; then
  echo "hta-env: $VENV up to date (holistictraceanalysis 0.5.0)"
  exit 0
fi

LOG="$(mktemp "${TMPDIR:-/tmp}/hta-env.XXXXXX.log")"
trap 'rm -f "$LOG"' EXIT
fail() {
  echo "hta-env: FAILED: $1 (log follows)" >&2
  tail -n 40 "$LOG" >&2 || true
  exit 1
}

start=$(date +%s)
rm -rf "$VENV"
"$PY" -m venv "$VENV" >>"$LOG" 2>&1 || fail "python -m venv"
export PIP_DISABLE_PIP_VERSION_CHECK=1
# Runtime dependencies first (binary wheels only), then HTA itself without its
# notebook/test dependencies.
"$VENV/bin/python" -m pip install --only-binary=:all: "${REQS[@]:1}" >>"$LOG" 2>&1 \
  || fail "pip install runtime deps"
"$VENV/bin/python" -m pip install --no-deps "${REQS[0]}" >>"$LOG" 2>&1 \
  || fail "pip install ${REQS[0]}"
check_import >>"$LOG" 2>&1 || fail "import check"
echo "$SPEC" >"$STAMP"
echo "hta-env: created $VENV in $(( $(date +%s) - start ))s (holistictraceanalysis 0.5.0, pandas 2.3.3, no torch)"
