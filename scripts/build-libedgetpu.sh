#!/usr/bin/env bash
# Build the REAL Coral Edge TPU runtime (libedgetpu.so.1) from the source bundle in
# ../shared/libedgetpu (or $SLURM_TPU_LIBEDGETPU_SRC), once per bundle: the result is cached
# under /var/cache/slurm-tpu/libedgetpu/<hash of the bundle, its build.sh, this script and our
# patches>/, so a re-run costs one hash. Our two source patches, one concern each, are added to
# the bundle's own patches before build.sh runs, so build.sh applies them with the others, in
# this order: libedgetpu-visible-devices.patch (EDGETPU_VISIBLE_DEVICES: a job's code sees only
# the job's Edge TPUs), then libedgetpu-broker.patch (a "broker:<endpoint>" entry there: the
# delegate forwards each Edge TPU op to the node's TPU broker, a job's TPU shard). The tests that are about what libedgetpu itself does (enumeration, error
# paths, version) find it through the link build/libedgetpu/libedgetpu.so.1; without it
# they skip with that reason. Called by scripts/setup.sh, which installs the library's
# runtime packages; needs root on a fresh machine (build.sh apt-installs its build
# packages unless SKIP_APT=1).
#
# Exit status 0 also when the bundle is absent (a checkout without ../shared): it says so
# and the real-library tests skip.
set -euo pipefail
SELF=$(realpath "$0")
cd "$(dirname "$SELF")/.."

SRC_DIR=${SLURM_TPU_LIBEDGETPU_SRC:-../shared/libedgetpu}
CACHE_ROOT=${SLURM_TPU_LIBEDGETPU_CACHE:-/var/cache/slurm-tpu/libedgetpu}
LINK=build/libedgetpu/libedgetpu.so.1
PATCHES=("$PWD/scripts/libedgetpu-visible-devices.patch" "$PWD/scripts/libedgetpu-broker.patch")

bundle=$SRC_DIR/libedgetpu-src-bundle.tar.xz
if [ ! -f "$bundle" ] || [ ! -f "$SRC_DIR/build.sh" ]; then
    echo "setup: no libedgetpu source bundle at $bundle: skipping the real libedgetpu" \
         "(tests of the real library will skip; set SLURM_TPU_LIBEDGETPU_SRC to its folder)"
    rm -f "$LINK"
    exit 0
fi

# The key covers the sources and the recipe: a new bundle, build.sh, this script or one of our
# patches builds again.
key=$(cat "$bundle" "$SRC_DIR/build.sh" "$SELF" "${PATCHES[@]}" | sha256sum | cut -c1-16)
cached=$CACHE_ROOT/$key/libedgetpu.so.1
mkdir -p "$CACHE_ROOT"
chmod 0755 "$CACHE_ROOT" "$(dirname "$CACHE_ROOT")"
# One build at a time per machine (several checkouts may run setup at once); the
# second waits, then finds the cached result.
exec 9>"$CACHE_ROOT/.lock"
flock 9
if [ ! -f "$cached" ]; then
    echo "setup: building the real libedgetpu from $bundle (about 1-2 minutes on 2 cores)"
    # A fixed scratch path: libedgetpu's log lines carry their source path (__FILE__),
    # so the same bundle and packages give the same library bytes on every machine.
    work=$CACHE_ROOT/.build
    log=$CACHE_ROOT/.build.log
    rm -rf "$work"
    started=$(date +%s)
    # build.sh applies every patches/*.patch of the bundle in name order (after checking
    # SHA256SUMS, which lists only the bundle's own files): ours join them last, in our order
    # (9000-, 9001-), in a copy of the bundle (shared/ is read-only).
    mkdir -p "$work/bundle"
    tar -xJf "$bundle" -C "$work/bundle"
    number=9000
    for patch in "${PATCHES[@]}"; do
        cp "$patch" "$work/bundle/libedgetpu-src-bundle/patches/$number-slurm-tpu-$(basename "$patch")"
        number=$((number + 1))
    done
    tar -C "$work/bundle" -cf - libedgetpu-src-bundle | xz -1 -T2 >"$work/bundle.tar.xz"
    rm -rf "$work/bundle"
    # build.sh wants a writable place for its scratch tree and output.
    if ! OUT="$work/out" WORK="$work/tree" bash "$SRC_DIR/build.sh" "$work/bundle.tar.xz" >"$log" 2>&1; then
        tail -n 30 "$log" >&2
        echo "setup: building libedgetpu failed (last lines above; full log $log)" >&2
        exit 1
    fi
    mkdir -p "$CACHE_ROOT/$key"
    install -m 0755 "$work/out/libedgetpu.so.1" "$cached.tmp"
    mv -f "$cached.tmp" "$cached"
    chmod 0755 "$CACHE_ROOT/$key"
    echo "setup: built libedgetpu in $(( $(date +%s) - started )) s -> $cached"
    rm -rf "$work" "$log"
fi
exec 9>&-
mkdir -p "$(dirname "$LINK")"
ln -sfn "$cached" "$LINK"
echo "setup: real libedgetpu ready ($LINK -> $cached)"
