#!/usr/bin/env bash
# One command to a working NeuroFlow development environment:
#   scripts/dev-setup.sh
# creates .venv (make venv: every distribution editable, test and doc tools, MNIST), runs the core's
# unit tests, and says where to make a first change. Re-running it is cheap: make venv is skipped when
# nothing it depends on changed.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python3}"
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "NeuroFlow needs Python 3.11 or newer; $PYTHON is $("$PYTHON" --version 2>&1 || echo missing)." >&2
    echo "Run again with PYTHON=/path/to/python3.11 scripts/dev-setup.sh" >&2
    exit 1
fi

echo "==> make venv (creates .venv and installs everything editable; a minute or two the first time)"
make venv PYTHON="$PYTHON"

echo "==> the installed plugins"
.venv/bin/neuroflow plugins | head -n 4

echo "==> unit tests of the core ops (the whole suite is: make test)"
.venv/bin/python -m pytest -q tests/core/test_ops.py

cat <<'NEXT'

Ready. A first change, end to end:
  edit  neuroflow-core/src/neuroflow/ops/activations.py   (e.g. give LeakyReLU's repr its slope, or add an activation)
  test  .venv/bin/pytest tests/core/test_ops.py -q          (ops: forward, backward, float64 gradcheck)
  docs  .venv/bin/pytest tests/docs -k write-an-op-plugin   (every code block of a docs page runs)
Before a pull request: make lint && make test.  CONTRIBUTING.md has the rest.
NEXT
