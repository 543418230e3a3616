#!/usr/bin/env bash
# The arm64 leg of CI: slurm-tpu on Debian bookworm arm64 (Raspberry Pi OS bookworm's base), run
# under qemu-user emulation on this x86_64 machine. As root:
#
#   scripts/ci-arm64.sh prepare   prepare-host, then prepare-root:
#     prepare-host                host packages, the aarch64 binfmt handler, the aarch64 wheels
#                                 (quick; apt and the host venv's pip: not beside another setup)
#     prepare-root                the arm64 root (mmdebstrap, cached), libedgetpu for aarch64
#                                 (cached), the wheel installed in the root: minutes on a fresh
#                                 machine, what CI runs in the background
#   scripts/ci-arm64.sh test      in the root: install the wheel with [infer], build the hook client
#                                 and the gres/tpu plugin, run the arm64 tests, compare the runner's
#                                 results with this host's
#   scripts/ci-arm64.sh           both
#   scripts/ci-arm64.sh run CMD   CMD in the root (after a test run: the checkout's copy in /srv/slurm-tpu,
#                                 its venv /opt/slurm-tpu-venv), e.g. run /opt/slurm-tpu-venv/bin/python -m pytest -x tests/detect
#
# The root (/var/cache/slurm-tpu/arm64/root-<key>) is Debian's arm64 packages: Slurm 22.05, munge,
# umockdev, Python 3.11. It is built once per package list (several minutes: every maintainer
# script runs emulated) and reused. The wheels are downloaded here, natively, for aarch64
# (`pip download --platform`), and installed in the root offline. Native code: libedgetpu is
# cross-compiled here against the root (scripts/build-libedgetpu.sh --target aarch64), the
# gres/tpu plugin too (against the Slurm source tree build-gres-plugin.sh prepared, the same
# release as the root's slurmd), the hook client is compiled in the root by its own gcc.
# What cannot run under qemu-user is listed in docs/limits.md (Tested platforms).
set -euo pipefail
cd "$(dirname "$0")/.."
# Canonical: processes are told to be the root's by comparing /proc/<pid>/root with it.
CACHE=$(realpath -m "${SLURM_TPU_ARM64_CACHE:-/var/cache/slurm-tpu/arm64}")
MIRROR=${SLURM_TPU_DEBIAN_MIRROR:-http://deb.debian.org/debian}
SUITE=bookworm
# Inside the root: the checkout's copy, its venv, the native pieces.
SRV=/srv/slurm-tpu
VENV=/opt/slurm-tpu-venv
say() { echo "ci-arm64: $*"; }
fail() { echo "ci-arm64: $*" >&2; exit 1; }

# What the root holds: what scripts/setup.sh installs on a node, for the tests this leg runs, plus
# the -dev packages libedgetpu's cross build links against (the root is its sysroot).
ROOT_PACKAGES=(python3 python3-venv python3-yaml python3-gi gir1.2-umockdev-1.0 umockdev libudev1
               slurm-wlm slurmd slurmctld munge gcc libc6-dev make util-linux passwd acl procps file
               libusb-1.0-0 libabsl20220623 libflatbuffers2 libabsl-dev libflatbuffers-dev libusb-1.0-0-dev)
HOST_PACKAGES=(qemu-user-static binfmt-support arch-test mmdebstrap crossbuild-essential-arm64)
# The tests this leg runs in the root: what a Raspberry Pi node must show (detection of the Pi 4 and
# Pi 5, the real libedgetpu's enumeration, EDGETPU_VISIBLE_DEVICES and error paths, a real cluster's
# isolation), within CI's time. The rest of the suite runs on x86_64 only (docs/limits.md, which also
# says what qemu-user cannot show: e.g. slurmstepd's title, by which `slurm-tpu leases` tells a
# running job's lease from a stale one).
ARM64_TESTS=(
    tests/detect/test_raspberry_pi.py
    tests/libedgetpu/test_raspberry_pi_runtime.py tests/libedgetpu/test_ground_truth.py
    tests/libedgetpu/test_visible_devices.py tests/libedgetpu/test_runner_faults.py
    tests/isolation/test_raspberry_pi_cluster.py
)

root_key() {
    printf '%s\n' "$SUITE" "${ROOT_PACKAGES[@]}" | sha256sum | cut -c1-16
}
ROOT=$CACHE/root-$(root_key)

# shellcheck source=scripts/sources.sh
. scripts/sources.sh
host_packages() {
    sources_apt ci-arm64 "${HOST_PACKAGES[@]}" || exit 1
}

binfmt() {
    # qemu-user-static registers its handlers with the F flag (the interpreter is opened once, at
    # registration), so arm64 programs run inside a root that has no qemu of its own.
    local handler=/proc/sys/fs/binfmt_misc/qemu-aarch64
    if [ ! -e /proc/sys/fs/binfmt_misc/status ]; then
        mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc 2>/dev/null \
            || fail "binfmt_misc is not mounted and cannot be (this kernel or container has no binfmt_misc): arm64 programs cannot run here"
    fi
    [ -e "$handler" ] || update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
    grep -qx enabled "$handler" 2>/dev/null \
        || fail "no enabled qemu-aarch64 binfmt handler ($handler): run update-binfmts --enable qemu-aarch64"
}

build_root() {
    if [ -x "$ROOT/usr/bin/python3" ]; then
        return
    fi
    local started tmp log
    started=$(date +%s)
    tmp=$ROOT.tmp
    log=$CACHE/mmdebstrap.log
    discard_partial_root "$tmp"
    say "building the arm64 Debian $SUITE root (several minutes: its package scripts run emulated)"
    if ! mmdebstrap --variant=apt --architectures=arm64 --include="$(IFS=,; echo "${ROOT_PACKAGES[*]}")" \
            "$SUITE" "$tmp" "$MIRROR" >"$log" 2>&1; then
        tail -n 20 "$log" >&2
        discard_partial_root "$tmp"
        fail "mmdebstrap failed (last lines above, full log $log)"
    fi
    mv "$tmp" "$ROOT"
    say "built $ROOT in $(( $(date +%s) - started )) s"
}

# A root mmdebstrap did not finish (CI stopped it): mmdebstrap's root mode mounts /proc, /sys and
# /dev files inside it, which a killed run leaves; unmount them (deepest first), never delete
# across a file system.
discard_partial_root() {
    local tmp=$1
    [ -e "$tmp" ] || return 0
    findmnt -rn -o TARGET | grep -F "$tmp/" | sort -r | xargs -r -d '\n' umount -l
    rm -rf --one-file-system "$tmp"
}

# Roots of older package lists: only the current one is used. Called by the test leg, after the
# suite, never while a test may be reading an old root (tests/install/test_public_sources.py).
remove_old_roots() {
    local old
    for old in "$CACHE"/root-*; do
        [ "$old" = "$ROOT" ] || [ ! -d "$old" ] || discard_partial_root "$old"
    done
}

WHEELS=$CACHE/wheels
download_wheels() {
    # The project's wheel (pure Python) and aarch64 wheels of everything [infer,test] needs, for
    # the root's CPython 3.11 and glibc 2.36. pip resolves here, natively; the root installs offline.
    # The host venv's versions are the constraints: the runner's results are compared with this
    # host's, and should differ only by the machine (LiteRT's kernels), not by a numpy or Pillow release.
    local dist=$CACHE/dist
    # Afresh each run (pip's own cache keeps it cheap): a stale wheel must not reach the root.
    rm -rf "$dist" "$WHEELS" && mkdir -p "$dist" "$WHEELS"
    .venv/bin/python -m pip freeze --exclude-editable >"$WHEELS/constraints.txt"
    .venv/bin/python -m pip wheel -q --no-deps -w "$dist" . >"$CACHE/wheel.log" 2>&1 \
        || fail "could not build the project's wheel (log $CACHE/wheel.log)"
    local wheel
    wheel=$(ls "$dist"/slurm_tpu-*.whl)
    .venv/bin/python -m pip download -q -d "$WHEELS" --only-binary=:all: --implementation cp --python-version 3.11 \
        --abi cp311 --platform manylinux_2_36_aarch64 --platform manylinux_2_28_aarch64 \
        --platform manylinux_2_27_aarch64 --platform manylinux_2_17_aarch64 --platform manylinux2014_aarch64 \
        -c "$WHEELS/constraints.txt" "${wheel}[infer,test]" >"$CACHE/pip-download.log" 2>&1 \
        || { tail -n 5 "$CACHE/pip-download.log" >&2; fail "could not download aarch64 wheels (log $CACHE/pip-download.log)"; }
    cp "$wheel" "$WHEELS/"
    local wheels=("$WHEELS"/*.whl)
    say "wheels for aarch64: ${#wheels[@]} in $WHEELS"
}

libedgetpu_aarch64() {
    scripts/build-libedgetpu.sh --target aarch64 --sysroot "$ROOT" --output "$CACHE/libedgetpu.so.1"
}

gres_plugin_aarch64() {
    # Debian's Slurm source tree, configured by build-gres-plugin.sh --debian (setup runs it): the
    # root's slurmd is the same Debian release for arm64.
    local version tree
    # shellcheck disable=SC2016  # dpkg-query's format, not the shell's
    version=$(chroot "$ROOT" dpkg-query -W -f='${source:Version}' slurmd)
    tree=/var/cache/slurm-tpu/slurm-src/slurm-wlm_$version
    [ -f "$tree/config.h" ] || scripts/build-gres-plugin.sh --debian >/dev/null || true
    [ -f "$tree/config.h" ] || fail "no configured source tree of the root's Slurm $version ($tree): this host's" \
        "Debian Slurm is another release; rebuild the root (rm -rf $ROOT) after updating the host"
    # Slurm's headers come from the tree, the C library's from the cross toolchain.
    CC=aarch64-linux-gnu-gcc slurm_plugin/build.sh "$tree" "$ROOT/opt/slurm-tpu-plugins/{version}" >/dev/null \
        || fail "the gres/tpu plugin did not build for arm64"
    file -b "$ROOT"/opt/slurm-tpu-plugins/*/gres_tpu.so | grep -q aarch64 || fail "gres_tpu.so is not an arm64 object"
}

# The machine the root emulates: a Raspberry Pi 4's CPU, the Cortex-A72 (QEMU_CPU, read by
# qemu-user at every exec), and a /proc/cpuinfo that says so. qemu-user passes the host's x86
# /proc/cpuinfo through, and LiteRT (XNNPACK's cpuinfo) crashes reading it: a segmentation fault
# in the Interpreter's constructor, before any model runs. One entry per host CPU, as sysfs says.
QEMU_CPU_MODEL=cortex-a72
cpuinfo() {
    local n
    for n in $(seq 0 $(( $(nproc --all) - 1 ))); do
        printf 'processor\t: %s\nBogoMIPS\t: 108.00\nFeatures\t: fp asimd evtstrm crc32 cpuid\n' "$n"
        printf 'CPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0xd08\nCPU revision\t: 3\n\n'
    done
    printf 'Hardware\t: BCM2835\nRevision\t: c03114\nModel\t\t: Raspberry Pi 4 Model B Rev 1.4\n'
}

# Run a command in the root: a private mount namespace with the root's own /proc (its cpuinfo the
# Pi's), /dev, a fresh /tmp and /run, the host's /sys (umockdev replaces what the tests read of it).
# The arguments are this script's own words, never a job's.
in_root() {
    cpuinfo >"$CACHE/cpuinfo"
    # shellcheck disable=SC2016  # the script is for the inner shell, its arguments come after it
    unshare --mount --propagation private -- /bin/sh -euc '
        root=$1; cache=$2; shift 2
        mount -t proc proc "$root/proc"
        mount --bind "$cache/cpuinfo" "$root/proc/cpuinfo"
        mount --rbind /sys "$root/sys"
        mount --rbind /dev "$root/dev"
        mount -t tmpfs -o mode=1777 tmpfs "$root/tmp"
        mount -t tmpfs -o mode=0755 tmpfs "$root/run"
        exec chroot "$root" /usr/bin/env -i -C '"$SRV"' PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
            HOME=/root LANG=C.UTF-8 TERM=dumb QEMU_CPU='"$QEMU_CPU_MODEL"' "$@"' sh "$ROOT" "$CACHE" "$@"
}

# Every process left running in the root when a run ends (a daemon a failed test did not stop).
stop_leftovers() {
    local proc pid
    for proc in /proc/[0-9]*; do
        [ "$(readlink "$proc/root" 2>/dev/null)" = "$ROOT" ] || continue
        pid=${proc#/proc/}
        kill -9 "$pid" 2>/dev/null || true
    done
}

prepare_host() {
    mkdir -p "$CACHE"
    host_packages
    binfmt
    download_wheels
}

prepare_root() {
    local started
    started=$(date +%s)
    mkdir -p "$CACHE"
    binfmt
    build_root
    libedgetpu_aarch64
    venv
    say "root, libedgetpu for aarch64 and the venv ready in $(( $(date +%s) - started )) s"
}

copy_checkout() {
    # The checkout's files (tracked and untracked-but-not-ignored), fresh each run.
    rm -rf "$ROOT$SRV"
    mkdir -p "$ROOT$SRV"
    git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$ROOT$SRV"
    mkdir -p "$ROOT$SRV/build/libedgetpu"
    cp "$CACHE/libedgetpu.so.1" "$ROOT$SRV/build/libedgetpu/libedgetpu.so.1"
}

venv() {
    # The venv is kept between runs while the wheels of its dependencies are the same (pip under
    # emulation takes over a minute); the project's own wheel is installed afresh each run.
    [ -d "$WHEELS" ] || fail "no wheels in $WHEELS: run scripts/ci-arm64.sh prepare-host"
    rm -rf "$ROOT/opt/slurm-tpu-wheels"
    cp -r "$WHEELS" "$ROOT/opt/slurm-tpu-wheels"
    local key
    key=$(cd "$WHEELS" && find . -name '*.whl' ! -name 'slurm_tpu-*' | LC_ALL=C sort | sha256sum | cut -c1-16)
    if [ "$(cat "$ROOT$VENV/.wheels-key" 2>/dev/null)" != "$key" ]; then
        rm -f "$ROOT$VENV/.wheels-key"
        rm -rf "$ROOT$VENV"
        in_root /usr/bin/python3 -m venv "$VENV"
    fi
    local wheel
    wheel=$(basename "$(ls "$WHEELS"/slurm_tpu-*.whl)")
    # The wheel as a Raspberry Pi admin installs it, with the [infer] extra (LiteRT's aarch64 wheel).
    in_root "$VENV/bin/pip" install -q --no-index --find-links /opt/slurm-tpu-wheels --force-reinstall --no-deps \
        "/opt/slurm-tpu-wheels/$wheel" || fail "the wheel did not install in the arm64 root"
    in_root "$VENV/bin/pip" install -q --no-index --find-links /opt/slurm-tpu-wheels \
        -c /opt/slurm-tpu-wheels/constraints.txt "/opt/slurm-tpu-wheels/${wheel}[infer,test]" \
        || fail "the wheel's [infer,test] extras did not install in the arm64 root"
    echo "$key" >"$ROOT$VENV/.wheels-key"
    local installed
    installed=$(in_root "$VENV/bin/python" -c 'import ai_edge_litert, numpy, platform, slurm_tpu
print("slurm-tpu", slurm_tpu.__version__, "with ai-edge-litert, numpy", numpy.__version__, "on", platform.machine())') \
        || fail "the installed wheel does not import in the arm64 root"
    say "installed $installed"
}

parity() {
    # The same model and image files on both machines (written here), the runner's results compared.
    local models=$CACHE/parity-models
    rm -rf "$models"
    .venv/bin/python -m harness.modelgen --out "$models" >/dev/null
    .venv/bin/python -m harness.arm64.parity results --models "$models" --out "$CACHE/parity-$(uname -m).json"
    cp -r "$models" "$ROOT$SRV/build/parity-models"
    in_root "$VENV/bin/python" -m harness.arm64.parity results --models build/parity-models --out build/parity-aarch64.json
    .venv/bin/python -m harness.arm64.parity compare "$CACHE/parity-$(uname -m).json" "$ROOT$SRV/build/parity-aarch64.json"
}

test_leg() {
    local started
    started=$(date +%s)
    [ -x "$ROOT/usr/bin/python3" ] || fail "no arm64 root at $ROOT: run scripts/ci-arm64.sh prepare"
    binfmt
    trap stop_leftovers EXIT
    remove_old_roots
    copy_checkout
    gres_plugin_aarch64
    # prepare-root installed the wheel; a leg run on its own (after prepare-host) installs it here.
    if [ ! -x "$ROOT$VENV/bin/slurm-tpu" ] || [ ! "$ROOT$VENV/.wheels-key" -nt "$WHEELS/constraints.txt" ]; then
        venv
    fi
    in_root "$VENV/bin/python" -m slurm_tpu.ops.hook_client >/dev/null || fail "the hook client did not build in the arm64 root"
    file -b "$ROOT$SRV/hook_client/slurm-tpu-hook-client" | grep -q aarch64 || fail "the hook client is not an arm64 program"
    say "hook client, gres/tpu plugin and libedgetpu built for arm64; setup took $(( $(date +%s) - started )) s"
    parity
    # SLURM_TPU_TEST_EMULATION: the libedgetpu tests trace syscalls with qemu's log, not strace.
    in_root /usr/bin/env SLURM_TPU_TEST_EMULATION=qemu-user "$VENV/bin/python" -m pytest -ra -p no:cacheprovider \
        "${ARM64_TESTS[@]}"
    say "arm64 leg: $(( $(date +%s) - started )) s"
}

case ${1:-all} in
    prepare) prepare_host && prepare_root ;;
    prepare-host) prepare_host ;;
    prepare-root) prepare_root ;;
    test) test_leg ;;
    all) prepare_host && prepare_root && test_leg ;;
    run) shift; trap stop_leftovers EXIT; in_root "$@" ;;
    *) echo "usage: scripts/ci-arm64.sh [prepare|prepare-host|prepare-root|test|all|run COMMAND...]" >&2; exit 2 ;;
esac
