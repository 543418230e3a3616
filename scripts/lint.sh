#!/usr/bin/env bash
# The linters, as CI runs them (.ci/run), configured in pyproject.toml: ruff check,
# ruff format --check, mypy. Needs the venv scripts/setup.sh builds (the `lint` extra).
# Fails on the first finding; `.venv/bin/ruff format` and `.venv/bin/ruff check --fix` fix most.
set -euo pipefail
cd "$(dirname "$0")/.."
.venv/bin/ruff check
.venv/bin/ruff format --check
.venv/bin/mypy
