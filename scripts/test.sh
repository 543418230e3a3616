#!/usr/bin/env bash
# The test command: installs what the tests need (scripts/setup.sh), then runs
# the whole suite, real Slurm daemons and umockdev testbeds included. Needs root.
# Extra arguments go to pytest, e.g. scripts/test.sh tests/detect -x
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python -m pytest -ra "$@"
