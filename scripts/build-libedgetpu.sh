#!/usr/bin/env bash
# Build the REAL Coral Edge TPU runtime (libedgetpu.so.1, Apache-2.0) from its public sources,
# natively or for aarch64 from an x86_64 host:
#   scripts/build-libedgetpu.sh [--target x86_64|aarch64] [--sysroot DIR] [--output FILE]
#   --target   the machine it runs on (default: this one; env SLURM_TPU_LIBEDGETPU_TARGET).
#   --sysroot  for a cross build (target other than this machine): a Debian bookworm root of the
#              target architecture with libabsl-dev, libflatbuffers-dev and libusb-1.0-0-dev
#              (env SLURM_TPU_LIBEDGETPU_SYSROOT); compiled with Debian's cross compiler.
#   --output   where to link the result (default build/libedgetpu/libedgetpu.so.1 for this machine,
#              build/libedgetpu-<target>/libedgetpu.so.1 for another).
# Sources: google-coral/libedgetpu and the 11 TensorFlow Lite files it compiles against, pinned in
# scripts/sources.lock, taken from the offline bundle ../shared/libedgetpu/libedgetpu-src-bundle.tar.xz
# ($SLURM_TPU_LIBEDGETPU_SRC/) when it is there, else downloaded (or from $SLURM_TPU_SOURCES_MIRROR);
# every file is checked against the pins either way (scripts/sources.sh). Our patches, in this order:
# libedgetpu-debian-build.patch (Debian bookworm's abseil/flatc, make -j, extra flags),
# libedgetpu-visible-devices.patch (EDGETPU_VISIBLE_DEVICES: a job's code sees only the job's Edge
# TPUs), libedgetpu-broker.patch (a "broker:<endpoint>" entry there: the delegate forwards each Edge
# TPU op to the node's TPU broker, a job's TPU shard). Then flatc generates TFLite's schema header
# and libedgetpu's own makefile_build builds the library.
#
# The result is cached under /var/cache/slurm-tpu/libedgetpu/<key>/ ($SLURM_TPU_LIBEDGETPU_CACHE),
# key = the pinned sources, this script, our patches, the target (and, for a cross build, the
# sysroot's package versions): a re-run costs one hash. The tests about what libedgetpu itself does
# find it through build/libedgetpu/libedgetpu.so.1 and skip without it. Called by scripts/setup.sh;
# needs root on a fresh machine to apt-install the build packages (not with SKIP_APT=1).
#
# Exit status 0, with one line saying so, when there is neither the bundle nor a way to download
# the sources (a checkout without ../shared on a machine without network): the tests skip.
set -euo pipefail
SELF=$(realpath "$0")
cd "$(dirname "$SELF")/.."
REPO=$PWD
# shellcheck source=scripts/sources.sh
. scripts/sources.sh

fail() { echo "build-libedgetpu: $*" >&2; exit 1; }
host=$(uname -m)
target=${SLURM_TPU_LIBEDGETPU_TARGET:-$host}
sysroot=${SLURM_TPU_LIBEDGETPU_SYSROOT:-}
output=
while [ $# -gt 0 ]; do
    case $1 in
        --target | --sysroot | --output)
            [ $# -ge 2 ] || { echo "build-libedgetpu: $1 needs a value" >&2; exit 2; }
            case $1 in --target) target=$2 ;; --sysroot) sysroot=$2 ;; --output) output=$2 ;; esac
            shift 2 ;;
        *) echo "build-libedgetpu: unknown argument $1 (--target ARCH, --sysroot DIR, --output FILE)" >&2; exit 2 ;;
    esac
done
case $target in
    x86_64 | aarch64) ;;
    arm64) target=aarch64 ;;
    *) echo "build-libedgetpu: unknown target $target (x86_64 or aarch64)" >&2; exit 2 ;;
esac

CACHE_ROOT=${SLURM_TPU_LIBEDGETPU_CACHE:-/var/cache/slurm-tpu/libedgetpu}
PATCHES=("$REPO/scripts/libedgetpu-debian-build.patch" "$REPO/scripts/libedgetpu-visible-devices.patch"
         "$REPO/scripts/libedgetpu-broker.patch")
# flatc and xxd run on the build machine; the libraries are the target's.
BUILD_PACKAGES=(build-essential binutils patch xz-utils file xxd flatbuffers-compiler libflatbuffers-dev
                libabsl-dev libusb-1.0-0-dev)
# The libraries the cross build links against, from the sysroot (their versions are in the key).
SYSROOT_PACKAGES=(libabsl-dev libflatbuffers-dev libusb-1.0-0-dev)
bundle=$(sources_offline "${SLURM_TPU_LIBEDGETPU_SRC:-}" libedgetpu libedgetpu-src-bundle.tar.xz)

compilers=() include_flags='' ldflags='' key_extra=''
if [ "$target" = "$host" ]; then
    [ -z "$sysroot" ] || fail "--sysroot is for a cross build; $target is this machine"
    link=${output:-build/libedgetpu/libedgetpu.so.1}
    tools=
else
    [ "$host/$target" = x86_64/aarch64 ] || fail "cross builds go from x86_64 to aarch64, not $host to $target"
    [ -n "$sysroot" ] || fail "building for $target on $host needs --sysroot DIR (a Debian bookworm $target root)"
    [ -d "$sysroot/var/lib/dpkg" ] || fail "--sysroot $sysroot is not a Debian root (no var/lib/dpkg)"
    sysroot=$(realpath "$sysroot")
    versions=$(dpkg-query --admindir="$sysroot/var/lib/dpkg" -W -f='${Package}:${Architecture} ${Version}\n' \
        "${SYSROOT_PACKAGES[@]}" 2>/dev/null) || true
    for package in "${SYSROOT_PACKAGES[@]}"; do
        grep -q "^$package:arm64 " <<<"$versions" \
            || fail "the sysroot $sysroot has no arm64 $package (install ${SYSROOT_PACKAGES[*]} there)"
    done
    BUILD_PACKAGES+=(crossbuild-essential-arm64)
    tools=aarch64-linux-gnu-
    libdir=$sysroot/usr/lib/aarch64-linux-gnu
    # The cross compiler's own C/C++ libraries (Debian's *-arm64-cross packages, bookworm's glibc
    # and libstdc++) come first; the sysroot adds the three libraries' headers and .so files. Not
    # --sysroot: a root made for running (no libc6-dev, no libstdc++-dev) would lack the C library's.
    # Nor -L on the sysroot's library folder: where it has libc6-dev, its libc.so script names
    # /lib/aarch64-linux-gnu/libc.so.6, a path of this machine. The link sees only the three
    # packages' .so files, through links in the build folder (below).
    compilers=(CC=aarch64-linux-gnu-gcc CXX=aarch64-linux-gnu-g++)
    include_flags="-idirafter $sysroot/usr/include"
    key_extra=$versions
    link=${output:-build/libedgetpu-$target/libedgetpu.so.1}
fi

# The key covers the sources (their pins), the recipe (this script, our patches) and the target.
key=$( { sources_key libedgetpu-src; echo "$target"; echo "$key_extra"; cat "$SELF" "${PATCHES[@]}"; } \
    | sha256sum | cut -c1-16)
cached=$CACHE_ROOT/$key/libedgetpu.so.1
# Readable by every user (the tests load the library as other users): folders this creates are
# 0755 whatever root's umask; existing parents are left as they are (never chmod /tmp).
(umask 022 && mkdir -p "$CACHE_ROOT")
chmod 0755 "$CACHE_ROOT"
# One build at a time per machine (several checkouts may run setup at once); the
# second waits, then finds the cached result.
exec 9>"$CACHE_ROOT/.lock"
flock 9
if [ ! -f "$cached" ]; then
    work=$(mktemp -d "$CACHE_ROOT/.build.XXXXXX")
    trap 'rm -rf "$work"' EXIT  # whatever fails below: no scratch tree left in the cache
    log=$work/build.log
    tree=$work/tree
    # The sources: the bundle's copy when there is one (CI, offline), else the public downloads.
    rc=0
    if [ -n "$bundle" ]; then
        from="the bundle $bundle"
        local_root=$(sources_unpack "$bundle" "$work/bundle") || exit 1
        sources_assemble libedgetpu-src "$tree" "$local_root" || rc=$?
    else
        from="the public sources (scripts/sources.lock${SLURM_TPU_SOURCES_MIRROR:+, mirror $SLURM_TPU_SOURCES_MIRROR})"
        sources_assemble libedgetpu-src "$tree" || rc=$?
    fi
    if [ "$rc" = 3 ]; then
        rm -rf "$work"
        rm -f "$link"
        echo "setup: no libedgetpu source bundle (../shared/libedgetpu) and its public sources could not be downloaded:" \
             "skipping the real libedgetpu (its tests will skip; set SLURM_TPU_LIBEDGETPU_SRC to the bundle's" \
             "folder or SLURM_TPU_SOURCES_MIRROR to a copy of the sources)"
        exit 0
    fi
    [ "$rc" = 0 ] || { rm -rf "$work"; exit 1; }
    if [ "${SKIP_APT:-0}" != 1 ]; then
        sources_apt build-libedgetpu "${BUILD_PACKAGES[@]}" || exit 1
    fi
    if [ -n "$tools" ]; then
        # The generated headers check that flatc and the library's headers are the same release.
        flatc_version=$(flatc --version | awk '{print $NF}')
        sysroot_flatbuffers=$(sed -n 's/^libflatbuffers-dev:arm64 \([^+-]*\).*/\1/p' <<<"$versions")
        [ "$flatc_version" = "$sysroot_flatbuffers" ] \
            || fail "flatc here is $flatc_version but the sysroot's libflatbuffers-dev is $sysroot_flatbuffers: use the same Debian release"
    fi
    echo "setup: building the real libedgetpu for $target from $from (about 1-2 minutes on 2 cores)"
    started=$(date +%s)
    for patch in "${PATCHES[@]}"; do
        patch -d "$tree" -p1 --fuzz=0 --no-backup-if-mismatch -s <"$patch" >>"$log" 2>&1 \
            || { tail -n 20 "$log" >&2; fail "$(basename "$patch") does not apply (log $log)"; }
    done
    # __DATE__/__TIME__ (edgetpu_version()) from libedgetpu's commit time, and no build folder in
    # the library (__FILE__ in log lines): the same sources and packages give the same bytes, from
    # the bundle or the downloads, in any folder.
    export SOURCE_DATE_EPOCH=1710431936
    flags="-ffile-prefix-map=$tree/= $include_flags"
    if [ -n "$tools" ]; then
        mkdir "$work/libs"
        for so in "$libdir"/libabsl_*.so "$libdir"/libflatbuffers.so "$libdir"/libusb-1.0.so; do
            [ -e "$so" ] || fail "the sysroot has no $so"
            # The -dev packages' links are relative; an absolute one means a path in the sysroot.
            to=$(readlink "$so" || true)
            case $to in
                "") to=$so ;;
                /*) to=$sysroot$to ;;
                *) to=$(dirname "$so")/$to ;;
            esac
            ln -s "$to" "$work/libs/$(basename "$so")"
        done
        ldflags="-L$work/libs -Wl,-rpath-link,$libdir:$sysroot/lib/aarch64-linux-gnu"
    fi
    schema=$tree/tensorflow/tensorflow/lite/schema
    if ! {
        flatc --cpp --gen-object-api --no-union-value-namespacing -o "$schema/" "$schema/schema.fbs" \
        && make -C "$tree/libedgetpu" -f makefile_build/Makefile TFROOT="$tree/tensorflow" -j"${JOBS:-$(nproc)}" \
            "${compilers[@]}" "EXTRA_CFLAGS=$flags" "EXTRA_CXXFLAGS=$flags" "EXTRA_LDFLAGS=$ldflags" libedgetpu
    } >>"$log" 2>&1; then
        tail -n 30 "$log" >&2
        fail "building libedgetpu failed (last lines above; full log $log)"
    fi
    # makefile_build names its output folder k8 whatever the target.
    built=$tree/libedgetpu/out/direct/k8/libedgetpu.so.1.0

    # Checks: the right machine, every symbol resolved, the API exported.
    description=$(file -b "$built")
    case $target in
        x86_64) machine="x86-64" ;;
        aarch64) machine="ARM aarch64" ;;
    esac
    grep -q "$machine" <<<"$description" || fail "$built is not for $target: $description"
    if [ -z "$tools" ]; then
        if ldd -r "$built" 2>&1 | grep -E 'undefined symbol|not found'; then
            fail "unresolved symbols or libraries in $built (above)"
        fi
    else
        # What ldd -r does on the target: each undefined symbol must be defined by a library the
        # result needs, as the sysroot has them.
        defined=$work/defined
        : >"$defined"
        for needed in $("${tools}readelf" -d "$built" | sed -n 's/.*(NEEDED).*\[\(.*\)\]$/\1/p'); do
            found=
            for dir in "$libdir" "$sysroot/lib/aarch64-linux-gnu"; do
                [ -e "$dir/$needed" ] && found=$dir/$needed && break
            done
            [ -n "$found" ] || fail "$built needs $needed, which the sysroot $sysroot does not have"
            "${tools}nm" -D --defined-only "$found" | awk '{print $3}' | sed 's/@.*//' >>"$defined"
        done
        unresolved=$("${tools}nm" -D --undefined-only "$built" | awk '$1 == "U" {print $2}' | sed 's/@.*//' \
            | sort -u | comm -23 - <(sort -u "$defined"))
        [ -z "$unresolved" ] || fail "symbols of $built that no library of the sysroot defines: ${unresolved//$'\n'/ }"
    fi
    for symbol in edgetpu_list_devices edgetpu_free_devices edgetpu_create_delegate edgetpu_free_delegate \
                  edgetpu_verbosity edgetpu_version tflite_plugin_create_delegate tflite_plugin_destroy_delegate; do
        "${tools}nm" -D --defined-only "$built" | grep -q " T $symbol@@VER_1.0" \
            || fail "$built does not export $symbol"
    done

    mkdir -p "$CACHE_ROOT/$key"
    install -m 0755 "$built" "$cached.tmp"
    mv -f "$cached.tmp" "$cached"
    chmod 0755 "$CACHE_ROOT/$key"
    echo "setup: built libedgetpu for $target in $(( $(date +%s) - started )) s -> $cached"
    rm -rf "$work"
fi
exec 9>&-
mkdir -p "$(dirname "$link")"
ln -sfn "$cached" "$link"
echo "setup: real libedgetpu for $target ready ($link -> $cached)"
