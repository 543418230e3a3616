#!/usr/bin/env bash
# The gres/tpu Slurm plugin (slurm_plugin/) for the Slurm releases of this machine, as root:
#   scripts/build-gres-plugin.sh [--debian] [--slurm25]     (no argument: --debian)
#   --debian   Debian's Slurm (slurmd's package): its source package, fetched once with
#              `apt-get source --download-only` through a private deb-src list (the system's
#              sources are left alone), patched (dpkg-source -x) and configured as Debian builds it.
#   --slurm25  the Slurm 25.11 of scripts/build-slurm.sh: its pinned public source (scripts/sources.lock,
#              SchedMD's tag slurm-25-11-7-1), taken from the archive in ../shared/slurm (or $SLURM_SOURCE)
#              when it is there, else downloaded; configured as build-slurm.sh configures it.
# Source trees are cached in /var/cache/slurm-tpu/slurm-src (reruns: a few seconds); each plugin
# goes to /opt/slurm-tpu-plugins/<release>/gres_tpu.so ($SLURM_TPU_GRES_PLUGINS), where
# harness/localcluster finds it. One line and a non-zero exit when a build fails.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
# shellcheck source=scripts/sources.sh
. scripts/sources.sh
CACHE=${SLURM_TPU_SLURM_SRC_CACHE:-/var/cache/slurm-tpu/slurm-src}
OUT=${SLURM_TPU_GRES_PLUGINS:-/opt/slurm-tpu-plugins}
fail() { echo "build-gres-plugin: $*; without the plugin the hooks ask Slurm for each job's devices" >&2; exit 1; }
sources_releases build-gres-plugin "$@" || exit 2
mkdir -p "$CACHE"

# Build the plugin from tree $1 (configured with the other arguments if it is not yet) into $OUT/<release>.
build_into_out() {
    local tree=$1
    shift
    SLURM_CONFIGURE_FLAGS="$*" "$REPO/slurm_plugin/build.sh" "$tree" "$OUT/{version}" \
        || fail "the gres/tpu plugin did not build from $tree"
}

if [ "$debian" = 1 ]; then
    package=$(dpkg-query -W -f='${source:Package}' slurmd 2>/dev/null) || fail "Debian's slurmd is not installed"
    deb_version=$(dpkg-query -W -f='${source:Version}' slurmd)
    tree="$CACHE/${package}_${deb_version}"
    if [ ! -f "$tree/config.h" ] && [ ! -d "$tree/src" ]; then
        command -v dpkg-source >/dev/null || fail "dpkg-source not found (apt-get install dpkg-dev)"
        fetch="$CACHE/deb"
        mkdir -p "$fetch/parts" "$fetch/lists/partial"
        # deb-src twins of the system's deb sources (deb822 .sources and one-line .list files).
        {
            for file in /etc/apt/sources.list.d/*.sources; do
                [ -f "$file" ] && sed 's/^Types:.*/Types: deb-src/' "$file" && echo
            done
        } >"$fetch/parts/src.sources"
        {
            for file in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
                [ -f "$file" ] && sed -n 's/^deb /deb-src /p' "$file"
            done
        } >"$fetch/parts/src.list"
        apt_opts=(-o Dir::Etc::SourceList=/dev/null -o "Dir::Etc::SourceParts=$fetch/parts"
                  -o "Dir::State::Lists=$fetch/lists" -qq)
        log="$fetch/apt.log"
        { apt-get "${apt_opts[@]}" update && (cd "$fetch" && apt-get "${apt_opts[@]}" source --download-only \
              "$package=$deb_version"); } >"$log" 2>&1 \
            || fail "could not download Debian's $package $deb_version source (see $log)"
        dsc=$(ls "$fetch/${package}_${deb_version#*:}.dsc") || fail "no .dsc for $package $deb_version in $fetch"
        # Extracted beside the .dsc (dpkg-source links the orig tarball into the target's parent).
        rm -rf "$fetch/tree"
        dpkg-source -x "$dsc" "$fetch/tree" >"$fetch/dpkg-source.log" 2>&1 \
            || fail "dpkg-source -x $dsc failed (see $fetch/dpkg-source.log)"
        mv "$fetch/tree" "$tree"
    fi
    # debian/rules' main build (not its front-end emulator): the options that shape Slurm's structures.
    build_into_out "$tree" --sysconfdir=/etc/slurm --enable-multiple-slurmd --disable-debug
fi

if [ "$slurm25" = 1 ]; then
    # One tree per pin (its digest in the name), configured in place by slurm_plugin/build.sh.
    tree="$CACHE/slurm-25.11-$(sources_key slurm-25.11 | awk '{print substr($2, 1, 16)}')"
    sources_tree slurm-25.11 "$tree" "$(sources_offline "${SLURM_SOURCE:-}" slurm "slurm-25.11.*.tar.xz")" \
        || fail "no Slurm 25.11 source (the line above says why)"
    prefix=${SLURM_TPU_SLURM_PREFIX:-/opt/slurm-25.11}
    build_into_out "$tree" --prefix="$prefix" --sysconfdir="$prefix/etc" --enable-multiple-slurmd
fi
