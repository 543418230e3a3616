#!/usr/bin/env bash
# Slurm 25.11 beside Debian's 22.05, for the test suite, CI and the demo (as root):
# builds Slurm 25.11.7 from its source archive into /opt/slurm-25.11 (about 5 min on
# 2 cores; nothing to do when it is already there), and with --pyslurm installs
# pyslurm 25.11.2 (PyPI, about 3 min to build) into .venv against it.
#   scripts/build-slurm.sh [--pyslurm]
#   env: SLURM_TPU_SLURM_PREFIX=/opt/slurm-25.11
#        SLURM_SOURCE=<folder with build.sh and the archive> (default: ../shared/slurm, then ./shared/slurm)
# The build configures --enable-multiple-slurmd: the local test and demo clusters run
# several `slurmd -N` on one host, which a build without it refuses.
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=${SLURM_TPU_SLURM_PREFIX:-/opt/slurm-25.11}
PYSLURM_VERSION=25.11.2
with_pyslurm=0
for arg in "$@"; do
    case $arg in
        --pyslurm) with_pyslurm=1 ;;
        *) echo "build-slurm: unknown argument $arg (only --pyslurm)" >&2; exit 2 ;;
    esac
done

if ! { [ -x "$PREFIX/sbin/slurmd" ] && "$PREFIX/sbin/slurmd" -V 2>/dev/null | grep -q '^slurm 25\.11\.'; }; then
    source_dir=${SLURM_SOURCE:-}
    for candidate in ../shared/slurm shared/slurm; do
        [ -z "$source_dir" ] && [ -f "$candidate/build.sh" ] && source_dir=$candidate
    done
    if [ -z "$source_dir" ] || [ ! -f "$source_dir/build.sh" ]; then
        echo "build-slurm: no Slurm 25.11 source (build.sh + archive) found in ../shared/slurm or ./shared/slurm;" \
             "set SLURM_SOURCE" >&2
        exit 2
    fi
    echo "build-slurm: building Slurm 25.11 into $PREFIX (about 5 min)"
    log=$(mktemp)
    if ! PREFIX="$PREFIX" bash "$source_dir/build.sh" >"$log" 2>&1; then
        tail -30 "$log" >&2
        echo "build-slurm: the Slurm build failed (output above)" >&2
        exit 1
    fi
    rm -f "$log"
fi
echo "build-slurm: $("$PREFIX/sbin/slurmd" -V) in $PREFIX"

if [ "$with_pyslurm" = 1 ]; then
    installed=$(.venv/bin/python -m pip show pyslurm 2>/dev/null | sed -n "s/^Version: //p" || true)
    if [ "$installed" != "$PYSLURM_VERSION" ]; then
        echo "build-slurm: building pyslurm $PYSLURM_VERSION against $PREFIX (about 3 min)"
        log=$(mktemp)
        if ! SLURM_INCLUDE_DIR="$PREFIX/include" SLURM_LIB_DIR="$PREFIX/lib" \
                .venv/bin/python -m pip install -q "pyslurm==$PYSLURM_VERSION" >"$log" 2>&1; then
            tail -30 "$log" >&2
            echo "build-slurm: pip install pyslurm failed (output above)" >&2
            exit 1
        fi
        rm -f "$log"
    fi
    echo "build-slurm: pyslurm $PYSLURM_VERSION in .venv"
fi
