#!/usr/bin/env bash
# Install what slurm-tpu, its tests and its demo need on a Debian machine (as root):
# Debian's Slurm, munge, umockdev, a C compiler, a venv (.venv) with the package, and the
# real libedgetpu built from ../shared/libedgetpu when that bundle is there.
# Safe to re-run: it installs only what is missing.
set -euo pipefail
cd "$(dirname "$0")/.."

# python3 + python3-yaml: the Slurm hooks run under Debian's /usr/bin/python3 -IS (stdlib,
# plus PyYAML when a config file exists). python3-gi + gir1.2-umockdev-1.0: the watcher
# tests drive real uevents through UMockdev's GObject API.
APT_PACKAGES=(slurm-wlm slurmd slurmctld munge umockdev libudev1 gcc python3 python3-venv python3-yaml
              util-linux passwd python3-gi gir1.2-umockdev-1.0 strace)
# dpkg-dev: dpkg-source, which unpacks Debian's Slurm source for our gres/tpu plugin (below).
APT_PACKAGES+=(dpkg-dev)
# acl: setfacl/getfacl, with which the isolation tests play a job owner who grants another
# user access to her leased node (the hooks must strip it).
APT_PACKAGES+=(acl)
# mariadb-server + slurmdbd: Slurm's own accounting in the demo and the accounting tests (each
# cluster runs a private MariaDB and slurmdbd; Debian's services are left stopped).
APT_PACKAGES+=(mariadb-server mariadb-client slurmdbd)
# What the real libedgetpu built below needs at run time (its build packages: scripts/build-libedgetpu.sh).
APT_PACKAGES+=(libusb-1.0-0 libabsl20220623 libflatbuffers2)
# Containers (issue 34): rootless Podman with runc (crun refuses this hybrid cgroup layout),
# newuidmap/newgidmap (uidmap), the per-user pause process (catatonit); mmdebstrap and
# squashfs-tools build the tests' image offline (harness/containers/image.py).
APT_PACKAGES+=(podman runc uidmap catatonit fuse-overlayfs mmdebstrap squashfs-tools)
missing=()
for package in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "setup: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# Debian starts munge/slurm services on install where systemd runs; our tests and
# demo start their own daemons on their own sockets and ports, so leave those be.

# Debian's interpreter, not one under a private home (pyenv in /root): the jobs' users
# run `slurm-tpu infer` from this venv, so its interpreter must be theirs to execute.
PYTHON=${PYTHON:-/usr/bin/python3}
[ -x "$PYTHON" ] || PYTHON=python3
want_home=$(dirname "$(readlink -f "$(command -v "$PYTHON")")")
if [ -f .venv/pyvenv.cfg ] && ! grep -qx "home = $want_home" .venv/pyvenv.cfg; then
    echo "setup: rebuilding .venv with $PYTHON"
    rm -rf .venv
fi
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
log=$(mktemp)
if ! { .venv/bin/python -m pip install -q --upgrade pip && .venv/bin/python -m pip install -q -e '.[infer,test,lint]'; } >"$log" 2>&1; then
    cat "$log" >&2
    echo "setup: pip install failed (output above)" >&2
    exit 1
fi
rm -f "$log"

# The real Coral runtime (libedgetpu.so.1) from ../shared/libedgetpu, built once per bundle
# and cached; the tests about what libedgetpu itself does use it (see tests/hardware/README.md).
scripts/build-libedgetpu.sh

# The hooks' thin client of the node agent (C, no interpreter start per hook): see
# slurm_tpu/hooks/agent.py. Without it the hooks run the Python hooks.
.venv/bin/python -m slurm_tpu.ops.hook_client >/dev/null || echo "setup: hook client not built (no cc?)" >&2

# Slurm 25.11 (source build in /opt, cached) and pyslurm for it, beside Debian's 22.05:
# SLURM_TPU_WITH_SLURM25=1 scripts/setup.sh (CI does; see scripts/build-slurm.sh).
if [ "${SLURM_TPU_WITH_SLURM25:-0}" = 1 ]; then
    scripts/build-slurm.sh --pyslurm
fi

# Our gres/tpu Slurm plugin (slurm_plugin/) for each Slurm here, in /opt/slurm-tpu-plugins/<release>
# (sources cached in /var/cache/slurm-tpu/slurm-src): the test clusters load it, and the prolog
# then reads each job's Edge TPUs from its environment instead of asking slurmctld. Optional:
# a failed build says so in one line and setup goes on (the hooks ask Slurm, as without it).
scripts/build-gres-plugin.sh --debian || true
if [ "${SLURM_TPU_WITH_SLURM25:-0}" = 1 ]; then
    scripts/build-gres-plugin.sh --slurm25 || true
fi

# enroot and Pyxis (`srun --container-image=...`) from ../shared/containers, Pyxis for each Slurm
# here (scripts/build-containers.sh, cached): the container tests use them. Optional like the
# plugin: a failed build says so in one line and the Pyxis tests skip.
if [ "${SLURM_TPU_WITH_SLURM25:-0}" = 1 ]; then
    scripts/build-containers.sh --debian --slurm25 || true
else
    scripts/build-containers.sh --debian || true
fi
# The tests' container image (Debian bookworm + LiteRT + Coral's example), built once and cached
# in /var/cache/slurm-tpu/containers/ by its inputs (about a minute the first time).
.venv/bin/python -m harness.containers.image >/dev/null || echo "setup: container image not built (tests/containers skip)" >&2

echo "setup: ready ($(.venv/bin/slurm-tpu --version))"
