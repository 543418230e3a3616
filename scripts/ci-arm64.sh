#!/usr/bin/env bash
# The arm64 leg of CI: slurm-tpu on Debian bookworm arm64 (Raspberry Pi OS bookworm's base), run
# under qemu-user emulation on this x86_64 machine. As root:
#
#   scripts/ci-arm64.sh prepare   host packages, the aarch64 binfmt handler, the arm64 root
#                                 (mmdebstrap, cached), the wheels, libedgetpu for aarch64 (cached)
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
REPO=$(pwd)
CACHE=${SLURM_TPU_ARM64_CACHE:-/var/cache/slurm-tpu/arm64}
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
# The tests this leg runs in the root (see docs/limits.md for what is left out and why).
ARM64_TESTS=(
    tests/detect/test_raspberry_pi.py tests/detect/test_detect.py
    tests/libedgetpu/test_visible_devices.py tests/libedgetpu/test_runner_faults.py
    tests/libedgetpu/test_ground_truth.py tests/libedgetpu/test_raspberry_pi_runtime.py
    tests/isolation/test_raspberry_pi_cluster.py tests/isolation/test_cluster_isolation.py
)
# Left out, each for what qemu-user cannot show (docs/limits.md): another process's /proc/<pid>/cmdline
# is qemu's own argv ("/usr/libexec/qemu-binfmt/aarch64-binfmt-P /usr/sbin/slurmstepd ..."), so the
# title slurmstepd sets ("slurmstepd: [<job>.<step>]"), by which the hooks tell a running job's lease
# from a stale one, is not seen: `slurm-tpu leases` calls a running job's lease stale.
ARM64_DESELECT=(
    tests/isolation/test_cluster_isolation.py::test_leases_command_shows_who_holds_what
)

root_key() {
    printf '%s\n' "$SUITE" "${ROOT_PACKAGES[@]}" | sha256sum | cut -c1-16
}
ROOT=$CACHE/root-$(root_key)

host_packages() {
    local missing=() package
    for package in "${HOST_PACKAGES[@]}"; do
        dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        say "installing ${missing[*]}"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
            || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; } \
            || fail "could not install ${missing[*]} (apt-get install them)"
    fi
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
    rm -rf "$tmp"
    say "building the arm64 Debian $SUITE root (several minutes: its package scripts run emulated)"
    if ! mmdebstrap --variant=apt --architectures=arm64 --include="$(IFS=,; echo "${ROOT_PACKAGES[*]}")" \
            "$SUITE" "$tmp" "$MIRROR" >"$log" 2>&1; then
        tail -n 20 "$log" >&2
        rm -rf "$tmp"
        fail "mmdebstrap failed (last lines above, full log $log)"
    fi
    mv "$tmp" "$ROOT"
    # Roots of older package lists: only the current one is used.
    find "$CACHE" -maxdepth 1 -name 'root-*' ! -path "$ROOT" -exec rm -rf {} +
    say "built $ROOT in $(( $(date +%s) - started )) s"
}

WHEELS=$CACHE/wheels
download_wheels() {
    # The project's wheel (pure Python) and aarch64 wheels of everything [infer,test] needs, for
    # the root's CPython 3.11 and glibc 2.36. pip resolves here, natively; the root installs offline.
    # The host venv's versions are the constraints: the runner's results are compared with this
    # host's, and should differ only by the machine (LiteRT's kernels), not by a numpy or Pillow release.
    local dist=$CACHE/dist
    .venv/bin/python -m pip freeze --exclude-editable >"$CACHE/constraints.txt"
    rm -rf "$dist" && mkdir -p "$dist" "$WHEELS"
    .venv/bin/python -m pip wheel -q --no-deps -w "$dist" . >"$CACHE/wheel.log" 2>&1 \
        || fail "could not build the project's wheel (log $CACHE/wheel.log)"
    local wheel
    wheel=$(ls "$dist"/slurm_tpu-*.whl)
    .venv/bin/python -m pip download -q -d "$WHEELS" --only-binary=:all: --implementation cp --python-version 3.11 \
        --abi cp311 --platform manylinux_2_36_aarch64 --platform manylinux_2_28_aarch64 \
        --platform manylinux_2_27_aarch64 --platform manylinux_2_17_aarch64 --platform manylinux2014_aarch64 \
        -c "$CACHE/constraints.txt" "$wheel[infer,test]" >"$CACHE/pip-download.log" 2>&1 \
        || { tail -n 5 "$CACHE/pip-download.log" >&2; fail "could not download aarch64 wheels (log $CACHE/pip-download.log)"; }
    cp "$wheel" "$WHEELS/"
    say "wheels for aarch64: $(ls "$WHEELS" | grep -c whl) in $WHEELS"
}

libedgetpu_aarch64() {
    scripts/build-libedgetpu.sh --target aarch64 --sysroot "$ROOT" --output "$CACHE/libedgetpu.so.1"
}

gres_plugin_aarch64() {
    # Debian's Slurm source tree, configured by build-gres-plugin.sh --debian (setup runs it): the
    # root's slurmd is the same Debian release for arm64.
    local version tree
    version=$(chroot "$ROOT" dpkg-query -W -f='${source:Version}' slurmd)
    tree=/var/cache/slurm-tpu/slurm-src/slurm-wlm_$version
    [ -f "$tree/config.h" ] || scripts/build-gres-plugin.sh --debian >/dev/null || true
    [ -f "$tree/config.h" ] || { say "no configured Slurm $version source tree: the cluster test runs without the gres/tpu plugin"; return 0; }
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

prepare() {
    local started
    started=$(date +%s)
    mkdir -p "$CACHE"
    host_packages
    binfmt
    build_root
    download_wheels
    libedgetpu_aarch64
    say "prepared in $(( $(date +%s) - started )) s"
}

copy_checkout() {
    # The checkout's files (tracked and untracked-but-not-ignored), fresh each run.
    rm -rf "$ROOT$SRV"
    mkdir -p "$ROOT$SRV"
    git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf - | tar -xf - -C "$ROOT$SRV"
    mkdir -p "$ROOT$SRV/build/libedgetpu"
    cp "$CACHE/libedgetpu.so.1" "$ROOT$SRV/build/libedgetpu/libedgetpu.so.1"
    rm -rf "$ROOT/opt/slurm-tpu-wheels"
    cp -r "$WHEELS" "$ROOT/opt/slurm-tpu-wheels"
}

venv() {
    # The venv is kept between runs while the wheels of its dependencies are the same (pip under
    # emulation takes over a minute); the project's own wheel is installed afresh each run.
    local key
    key=$(ls "$WHEELS" | grep -v '^slurm_tpu-' | sha256sum | cut -c1-16)
    if [ "$(cat "$ROOT$VENV/.wheels-key" 2>/dev/null)" != "$key" ]; then
        rm -rf "$ROOT$VENV"
        in_root /usr/bin/python3 -m venv "$VENV"
    fi
    local wheel
    wheel=$(basename "$(ls "$WHEELS"/slurm_tpu-*.whl)")
    # The wheel as a Raspberry Pi admin installs it, with the [infer] extra (LiteRT's aarch64 wheel).
    in_root "$VENV/bin/pip" install -q --no-index --find-links /opt/slurm-tpu-wheels --force-reinstall --no-deps \
        "/opt/slurm-tpu-wheels/$wheel" || fail "the wheel did not install in the arm64 root"
    in_root "$VENV/bin/pip" install -q --no-index --find-links /opt/slurm-tpu-wheels \
        "/opt/slurm-tpu-wheels/$wheel[infer,test]" || fail "the wheel's [infer,test] extras did not install in the arm64 root"
    echo "$key" >"$ROOT$VENV/.wheels-key"
    say "installed $(in_root "$VENV/bin/python" -c 'import ai_edge_litert, numpy, platform, slurm_tpu
print("slurm-tpu", slurm_tpu.__version__, "with ai-edge-litert, numpy", numpy.__version__, "on", platform.machine())')"
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
    copy_checkout
    gres_plugin_aarch64
    venv
    in_root "$VENV/bin/python" -m slurm_tpu.ops.hook_client >/dev/null || fail "the hook client did not build in the arm64 root"
    file -b "$ROOT$SRV/hook_client/slurm-tpu-hook-client" | grep -q aarch64 || fail "the hook client is not an arm64 program"
    say "hook client, gres/tpu plugin and libedgetpu built for arm64; setup took $(( $(date +%s) - started )) s"
    parity
    # SLURM_TPU_TEST_EMULATION: the libedgetpu tests trace syscalls with qemu's log, not strace.
    in_root /usr/bin/env SLURM_TPU_TEST_EMULATION=qemu-user "$VENV/bin/python" -m pytest -ra -p no:cacheprovider \
        "${ARM64_TESTS[@]}" "${ARM64_DESELECT[@]/#/--deselect=}"
    say "arm64 leg: $(( $(date +%s) - started )) s"
}

case ${1:-all} in
    prepare) prepare ;;
    test) test_leg ;;
    all) prepare && test_leg ;;
    run) shift; trap stop_leftovers EXIT; in_root "$@" ;;
    *) echo "usage: scripts/ci-arm64.sh [prepare|test|all|run COMMAND...]" >&2; exit 2 ;;
esac
