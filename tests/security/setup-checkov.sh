#!/usr/bin/env bash
# The checkov linter (PyPI) in its own virtualenv, .venv-checkov: its pins (packaging<24, networkx 2)
# clash with the dev venv's. Keyed by the pinned requirements: a second run only checks (~1 min the
# first time). Used by tests/security/test_linters.py.
set -euo pipefail
cd "$(dirname "$0")/../.."
req=tests/security/checkov-requirements.txt
stamp=.venv-checkov/.installed-$(sha256sum "$req" | cut -c1-16)
if [ -f "$stamp" ] && [ -x .venv-checkov/bin/checkov ]; then
  exit 0
fi
printf '\n==> installing checkov into .venv-checkov\n' >&2
PY=${PYTHON:-python3}
rm -rf .venv-checkov
"$PY" -m venv .venv-checkov
.venv-checkov/bin/pip install -q --upgrade pip
.venv-checkov/bin/pip install -q --no-deps -r "$req"
.venv-checkov/bin/checkov --version >/dev/null
touch "$stamp"
