#!/usr/bin/env bash
# The project's test command: sets up what is missing (e2e/setup.sh), then lint, types and
# every test, including those against the real sandbox control plane and the real sglang code.
set -euo pipefail
cd "$(dirname "$0")/.."
bash e2e/setup.sh
if [ -f runtime/scripts/setup-test-env.sh ]; then
  bash runtime/scripts/setup-test-env.sh
fi

printf '\n==> ruff\n' >&2
.venv/bin/ruff check .
.venv/bin/ruff format --check .
printf '\n==> mypy\n' >&2
.venv/bin/mypy
printf '\n==> import contracts (which way dependencies point)\n' >&2
.venv/bin/lint-imports
printf '\n==> crds are generated from the API models\n' >&2
.venv/bin/moe-operator crds check

printf '\n==> pytest (operator, sandbox, planners)\n' >&2
.venv/bin/python -m pytest -m "not runtime" "$@"
if [ -x .venv-runtime/bin/python ]; then
  printf '\n==> pytest (runtime against the real sglang package)\n' >&2
  .venv-runtime/bin/python -m pytest tests/runtime "$@"
fi
