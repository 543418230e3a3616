#!/usr/bin/env bash
# NVIDIA enroot and its Slurm SPANK plugin Pyxis, built from their pinned public sources
# (scripts/sources.lock: enroot v4.1.2 with its three submodules, Pyxis v0.24.0), taken from the
# offline archives in ../shared/containers ($SLURM_TPU_CONTAINERS_SRC: enroot-<v>-src.tar.xz,
# pyxis-<v>-src.tar.xz) when they are there, else downloaded ($SLURM_TPU_SOURCES_MIRROR), checked
# against the pins either way (scripts/sources.sh), as root:
#   scripts/build-containers.sh [--debian] [--slurm25]        (no argument: --debian)
# enroot (static utilities against its bundled musl, about 40 s on 2 cores) goes to
# /opt/enroot-<v> ($SLURM_TPU_ENROOT_PREFIX): bin/enroot, its library, and its system config under
# etc/enroot (hooks.d, mounts.d, environ.d). Pyxis is built once per Slurm release against that
# release's own slurm/spank.h, as the gres/tpu plugin is (scripts/build-gres-plugin.sh, whose cached
# source trees it reads: Debian's 22.05 and the 25.11 of scripts/build-slurm.sh), into
# /opt/slurm-tpu-plugins/<release>/spank_pyxis.so, where harness/localcluster finds it.
# Cached: each build writes a stamp of its sources' pins beside what it built, and a re-run
# with the same pins does nothing (nor downloads anything). Also installs what enroot needs at run time (its
# doc/requirements.md): squashfs-tools, parallel, jq, zstd, curl, fuse-overlayfs. One line and a
# non-zero exit when something is missing or a build fails; exit 0 with one line when the sources
# can be neither found offline nor downloaded (the Pyxis tests skip).
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/sources.sh
. scripts/sources.sh
CACHE=${SLURM_TPU_SLURM_SRC_CACHE:-/var/cache/slurm-tpu/slurm-src}
PLUGINS=${SLURM_TPU_GRES_PLUGINS:-/opt/slurm-tpu-plugins}
fail() { echo "build-containers: $*" >&2; exit 1; }
sources_releases build-containers "$@" || exit 2
enroot_archive=$(sources_offline "${SLURM_TPU_CONTAINERS_SRC:-}" containers "enroot-*-src.tar.xz")
pyxis_archive=$(sources_offline "${SLURM_TPU_CONTAINERS_SRC:-}" containers "pyxis-*-src.tar.xz")

# What enroot runs (doc/requirements.md), what builds it (make, a C compiler; musl is bundled),
# and libcap2-bin for `make setcap` on sites that import Docker images (not needed for .sqsh files).
sources_apt build-containers squashfs-tools parallel jq zstd curl fuse-overlayfs pigz bash make gcc libcap2-bin \
    || exit 1

# source_tree NAME DEST ARCHIVE: sources_tree into DEST in a scratch folder (removed when this
# fails), but exit 0 with one line when NAME can be neither found offline nor downloaded (a
# machine without network or ../shared/containers).
source_tree() {
    local rc=0
    sources_tree "$1" "$2" "$3" || rc=$?
    [ "$rc" = 0 ] || rm -rf "$(dirname "$2")"
    if [ "$rc" = 3 ]; then
        echo "build-containers: no $1 source in ../shared/containers and no download: skipping (the Pyxis tests skip)"
        exit 0
    fi
    [ "$rc" = 0 ] || exit 1
}

# stamp FILE KEY: whether FILE says KEY (the build it sits beside is current).
stamp_is() { [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]; }

# ---- enroot -----------------------------------------------------------------------------------
# The releases scripts/sources.lock pins (enroot's tree is checked to say so before it builds).
enroot_name=enroot-4.1.2
pyxis_name=pyxis-0.24.0
prefix=${SLURM_TPU_ENROOT_PREFIX:-/opt/$enroot_name}
key=$(sources_key enroot | sha256sum | cut -c1-64)
if ! stamp_is "$prefix/.built-from" "$key" || [ ! -x "$prefix/bin/enroot" ]; then
    work=$(mktemp -d /tmp/build-enroot.XXXX)
    source_tree enroot "$work/src" "$enroot_archive"
    grep -qx "VERSION *:= *${enroot_name#enroot-}" "$work/src/Makefile" \
        || fail "the pinned enroot is not $enroot_name (scripts/sources.lock and this script disagree)"
    echo "build-containers: building $enroot_name into $prefix (about a minute)"
    log=$work/build.log
    if ! {
        cd "$work/src" \
        && make -j"${JOBS:-2}" prefix="$prefix" sysconfdir="$prefix/etc" \
        && make install prefix="$prefix" sysconfdir="$prefix/etc" DESTDIR="$work/root"
    } >"$log" 2>&1; then
        tail -20 "$log" >&2
        fail "the enroot build failed (output above, whole log in $log)"
    fi
    cd - >/dev/null
    rm -rf "$prefix.new" && mkdir -p "$(dirname "$prefix")"
    mv "$work/root$prefix" "$prefix.new"
    echo "$key" >"$prefix.new/.built-from"
    rm -rf "$prefix.old" && { [ ! -d "$prefix" ] || mv "$prefix" "$prefix.old"; }
    mv "$prefix.new" "$prefix" && rm -rf "$prefix.old" "$work"
fi
"$prefix/bin/enroot" version >/dev/null || fail "$prefix/bin/enroot does not run"

# ---- Pyxis, once per Slurm release ---------------------------------------------------------------
pyxis_key=$(sources_key pyxis | sha256sum | cut -c1-64)

# build_pyxis INCLUDE_DIR VERSION: spank_pyxis.so against INCLUDE_DIR/slurm/spank.h into $PLUGINS/VERSION.
build_pyxis() {
    local include=$1 version=$2
    local out="$PLUGINS/$version"
    [ -f "$include/slurm/spank.h" ] || fail "no slurm/spank.h under $include for Slurm $version"
    stamp_is "$out/spank_pyxis.so.built-from" "$pyxis_key" && [ -f "$out/spank_pyxis.so" ] && return 0
    echo "build-containers: building $pyxis_name for Slurm $version"
    local work
    # CPPFLAGS from the environment: the Makefile appends it to its own (-D_GNU_SOURCE...), which a
    # make command-line variable would replace.
    work=$(mktemp -d /tmp/build-pyxis.XXXX)
    source_tree pyxis "$work/src" "$pyxis_archive"
    if ! CPPFLAGS="-I$include" make -C "$work/src" >"$work/build.log" 2>&1; then
        tail -20 "$work/build.log" >&2
        fail "the Pyxis build for Slurm $version failed (output above)"
    fi
    mkdir -p "$out"
    install -m 0644 "$work/src/spank_pyxis.so" "$out/spank_pyxis.so.new"
    mv "$out/spank_pyxis.so.new" "$out/spank_pyxis.so"
    echo "$pyxis_key" >"$out/spank_pyxis.so.built-from"
    rm -rf "$work"
}

# release_of INCLUDE_DIR: the release (25.11.7) its slurm/slurm_version.h says (SLURM_VERSION_NUMBER 0x190b07).
release_of() {
    local number
    number=$(sed -n 's/^#define SLURM_VERSION_NUMBER \(0x[0-9a-fA-F]*\)$/\1/p' "$1/slurm/slurm_version.h")
    [ -n "$number" ] || fail "no SLURM_VERSION_NUMBER in $1/slurm/slurm_version.h"
    printf "%d.%02d.%d\n" "$((number >> 16))" "$(((number >> 8) & 255))" "$((number & 255))"
}

if [ "$debian" = 1 ]; then
    deb_version=$(dpkg-query -W -f='${source:Version}' slurmd 2>/dev/null) || fail "Debian's slurmd is not installed"
    package=$(dpkg-query -W -f='${source:Package}' slurmd)
    tree="$CACHE/${package}_${deb_version}"
    [ -f "$tree/slurm/slurm_version.h" ] || fail "no configured Slurm source tree at $tree (run scripts/build-gres-plugin.sh --debian)"
    build_pyxis "$tree" "$(release_of "$tree")"
fi
if [ "$slurm25" = 1 ]; then
    slurm_prefix=${SLURM_TPU_SLURM_PREFIX:-/opt/slurm-25.11}
    [ -f "$slurm_prefix/include/slurm/slurm_version.h" ] || fail "no Slurm 25.11 headers in $slurm_prefix/include (run scripts/build-slurm.sh)"
    build_pyxis "$slurm_prefix/include" "$(release_of "$slurm_prefix/include")"
fi
echo "build-containers: $("$prefix/bin/enroot" version | head -1 | sed 's/^/enroot /') in $prefix, $pyxis_name in $PLUGINS"
