#!/usr/bin/env bash
# NVIDIA enroot and its Slurm SPANK plugin Pyxis, built offline from ../shared/containers (or
# $SLURM_TPU_CONTAINERS_SRC: enroot-<v>-src.tar.xz, pyxis-<v>-src.tar.xz, SHA256SUMS), as root:
#   scripts/build-containers.sh [--debian] [--slurm25]        (no argument: --debian)
# enroot (static utilities against its bundled musl, about 40 s on 2 cores) goes to
# /opt/enroot-<v> ($SLURM_TPU_ENROOT_PREFIX): bin/enroot, its library, and its system config under
# etc/enroot (hooks.d, mounts.d, environ.d). Pyxis is built once per Slurm release against that
# release's own slurm/spank.h, as the gres/tpu plugin is (scripts/build-gres-plugin.sh, whose cached
# source trees it reads: Debian's 22.05 and the 25.11 of scripts/build-slurm.sh), into
# /opt/slurm-tpu-plugins/<release>/spank_pyxis.so, where harness/localcluster finds it.
# Cached: each build writes a stamp of its sources' checksum beside what it built, and a re-run
# with the same sources does nothing. Also installs what enroot needs at run time (its
# doc/requirements.md): squashfs-tools, parallel, jq, zstd, curl, fuse-overlayfs. One line and a
# non-zero exit when something is missing or a build fails.
set -euo pipefail
cd "$(dirname "$0")/.."
CACHE=${SLURM_TPU_SLURM_SRC_CACHE:-/var/cache/slurm-tpu/slurm-src}
PLUGINS=${SLURM_TPU_GRES_PLUGINS:-/opt/slurm-tpu-plugins}
fail() { echo "build-containers: $*" >&2; exit 1; }
debian=0 slurm25=0
for arg in "$@"; do
    case $arg in
        --debian) debian=1 ;;
        --slurm25) slurm25=1 ;;
        *) echo "build-containers: unknown argument $arg (--debian, --slurm25)" >&2; exit 2 ;;
    esac
done
[ $# -gt 0 ] || debian=1

source_dir=${SLURM_TPU_CONTAINERS_SRC:-}
for candidate in ../shared/containers shared/containers; do
    [ -z "$source_dir" ] && [ -f "$candidate/SHA256SUMS" ] && source_dir=$candidate
done
if [ -z "$source_dir" ]; then
    echo "build-containers: no enroot/Pyxis sources in ../shared/containers: skipping (the Pyxis tests skip)"
    exit 0
fi
enroot_archive=$(ls "$source_dir"/enroot-*-src.tar.xz 2>/dev/null | tail -1) || true
pyxis_archive=$(ls "$source_dir"/pyxis-*-src.tar.xz 2>/dev/null | tail -1) || true
[ -n "$enroot_archive" ] && [ -n "$pyxis_archive" ] || fail "no enroot-*-src.tar.xz and pyxis-*-src.tar.xz in $source_dir"
(cd "$source_dir" && sha256sum --quiet -c SHA256SUMS) || fail "$source_dir: checksums do not match SHA256SUMS"

# What enroot runs (doc/requirements.md), what builds it (make, a C compiler; musl is bundled),
# and libcap2-bin for `make setcap` on sites that import Docker images (not needed for .sqsh files).
APT_PACKAGES=(squashfs-tools parallel jq zstd curl fuse-overlayfs pigz bash make gcc libcap2-bin)
missing=()
for package in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "build-containers: installing ${missing[*]}"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
        "${missing[@]}"; } >/dev/null || fail "could not install ${missing[*]}"
fi

# stamp FILE KEY: whether FILE says KEY (the build it sits beside is current).
stamp_is() { [ -f "$1" ] && [ "$(cat "$1")" = "$2" ]; }

# ---- enroot -----------------------------------------------------------------------------------
enroot_name=$(basename "$enroot_archive" -src.tar.xz)          # enroot-4.1.2
prefix=${SLURM_TPU_ENROOT_PREFIX:-/opt/$enroot_name}
key=$(sha256sum "$enroot_archive" | cut -c1-64)
if ! stamp_is "$prefix/.built-from" "$key" || [ ! -x "$prefix/bin/enroot" ]; then
    echo "build-containers: building $enroot_name into $prefix (about a minute)"
    work=$(mktemp -d /tmp/build-enroot.XXXX)
    log=$work/build.log
    if ! {
        tar -xJf "$enroot_archive" -C "$work" && cd "$work/$enroot_name" \
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
pyxis_name=$(basename "$pyxis_archive" -src.tar.xz)            # pyxis-0.24.0
pyxis_key=$(sha256sum "$pyxis_archive" | cut -c1-64)

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
    if ! { tar -xJf "$pyxis_archive" -C "$work" \
           && CPPFLAGS="-I$include" make -C "$work/$pyxis_name" >"$work/build.log" 2>&1; }; then
        tail -20 "$work/build.log" >&2
        fail "the Pyxis build for Slurm $version failed (output above)"
    fi
    mkdir -p "$out"
    install -m 0644 "$work/$pyxis_name/spank_pyxis.so" "$out/spank_pyxis.so.new"
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
