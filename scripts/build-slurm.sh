#!/usr/bin/env bash
# Slurm 25.11 beside Debian's 22.05, for the test suite, CI and the demo (as root):
# builds Slurm 25.11.7 from its source archive into /opt/slurm-25.11 (about 5 min on
# 2 cores; nothing to do when it is already there with its MariaDB accounting plugin), and with --pyslurm installs
# pyslurm 25.11.2 (PyPI, about 3 min to build) into .venv against it.
#   scripts/build-slurm.sh [--pyslurm | --packages]
#   --packages: only apt-install what the build needs (CI does, before building in the background)
#   env: SLURM_TPU_SLURM_PREFIX=/opt/slurm-25.11
#        SLURM_SOURCE=<folder with slurm-25.11.*.tar.xz> (default: ../shared/slurm, then ./shared/slurm)
# The source is the pinned public one (scripts/sources.lock: SchedMD's tag slurm-25-11-7-1), from that
# offline archive when it is there, else downloaded ($SLURM_TPU_SOURCES_MIRROR), checked against the
# pin either way (scripts/sources.sh).
# The build configures --enable-multiple-slurmd: the local test and demo clusters run
# several `slurmd -N` on one host, which a build without it refuses.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/sources.sh
. scripts/sources.sh
PREFIX=${SLURM_TPU_SLURM_PREFIX:-/opt/slurm-25.11}
PYSLURM_VERSION=25.11.2
with_pyslurm=0 packages_only=0
for arg in "$@"; do
    case $arg in
        --pyslurm) with_pyslurm=1 ;;
        --packages) packages_only=1 ;;
        *) echo "build-slurm: unknown argument $arg (--pyslurm or --packages)" >&2; exit 2 ;;
    esac
done
# What configure needs for the features the suite uses (munge, JSON, YAML, TLS), curl for the
# download, and libmariadb-dev: Slurm's configure builds accounting_storage_mysql only when it finds
# mysql_config or mariadb_config (auxdir/x_ac_databases.m4), which libmariadb-dev brings.
BUILD_PACKAGES=(build-essential pkg-config libmunge-dev munge libjson-c-dev libyaml-dev libssl-dev xz-utils curl
                libmariadb-dev)
if [ "$packages_only" = 1 ]; then
    sources_apt build-slurm "${BUILD_PACKAGES[@]}"
    exit
fi

# Built means: this release, and its MySQL/MariaDB accounting plugin (slurmdbd's storage; a
# build configured before libmariadb-dev was installed lacks it and is rebuilt).
built() {
    [ -x "$PREFIX/sbin/slurmd" ] && "$PREFIX/sbin/slurmd" -V 2>/dev/null | grep -q '^slurm 25\.11\.' \
        && [ -f "$PREFIX/lib/slurm/accounting_storage_mysql.so" ]
}
if ! built; then
    sources_apt build-slurm "${BUILD_PACKAGES[@]}" || exit 1
    # The build installs into a staging root (the same --prefix, so its compiled-in plugin and
    # library paths are right) and replaces $PREFIX by a rename at the end: clusters running
    # from an older build in $PREFIX keep working while this one builds.
    echo "build-slurm: building Slurm 25.11 for $PREFIX (about 5 min)"
    stage=$(mktemp -d /tmp/build-slurm-stage.XXXX)
    trap 'rm -rf "$stage"' EXIT  # a failed build leaves no staging tree behind
    log=$stage/build.log
    sources_tree slurm-25.11 "$stage/src" "$(sources_offline "${SLURM_SOURCE:-}" slurm "slurm-25.11.*.tar.xz")" || exit 1
    if ! {
        cd "$stage/src" \
        && ./configure --prefix="$PREFIX" --sysconfdir="$PREFIX/etc" --enable-multiple-slurmd \
        && make -j"${JOBS:-2}" && make install DESTDIR="$stage/root"
    } >"$log" 2>&1; then
        tail -30 "$log" >&2
        echo "build-slurm: the Slurm build failed (output above)" >&2
        exit 1
    fi
    cd - >/dev/null
    find "$stage/root" \( -name '*.a' -o -name '*.la' \) -delete
    [ -f "$stage/root$PREFIX/lib/slurm/accounting_storage_mysql.so" ] \
        || { echo "build-slurm: configure found no mariadb_config: no accounting_storage_mysql.so" >&2; exit 1; }
    if [ -d "$PREFIX" ]; then
        mv "$PREFIX" "$PREFIX.old.$$"
    fi
    mkdir -p "$(dirname "$PREFIX")"
    mv "$stage/root$PREFIX" "$PREFIX"
    rm -rf "$stage" "$PREFIX.old.$$"
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
