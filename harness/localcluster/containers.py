"""Pyxis + enroot for a LocalCluster: ``srun --container-image=<file.sqsh>`` on its nodes.

scripts/build-containers.sh builds enroot (``/opt/enroot-<v>``) and Pyxis for each Slurm release
(``/opt/slurm-tpu-plugins/<release>/spank_pyxis.so``). A cluster with ``containers`` on gets, all
under its base directory (no global state: two clusters on one machine never share a file):

- ``etc/plugstack.conf`` loading the Pyxis built for its Slurm release (slurm.conf's
  ``PlugStackConfig``), with Pyxis's runtime directory under ``pyxis/``;
- per node, an enroot of its own: ``nodes/<n>/enroot/bin/enroot``, first on that node's slurmd
  ``PATH`` (Pyxis runs ``enroot`` from slurmstepd's PATH, and drops every ``ENROOT_*`` path the
  job names), which sets enroot's system config to ``nodes/<n>/enroot/etc`` (enroot's own
  hooks.d, mounts.d and environ.d, slurm-tpu's hook rendered for that node as ``slurm-tpu
  install`` renders it, and the mounts below) and its data, runtime, cache, user-config and
  temporary directories to per-user ones under ``enroot/``, and restricts ``/dev`` to the basics
  (``ENROOT_RESTRICT_DEV``: a container then sees only the device nodes hooks give it);
- in each node's mounts.d, what the cluster's TaskProlog needs inside a container (Slurm runs it
  after Pyxis has entered the container: NVIDIA/pyxis#83, #163): the cluster's base, the
  package's root (its hooks and their client) and, for a source-built Slurm, its prefix
  (25.11's slurmstepd runs the TaskProlog through itself, and loads libslurmfull from there),
  read-only at the same paths; plus ``extra_mounts`` lines with ``%N`` for the node's directory,
  and ``extra_hook``, a sh hook (hooks.d/95-localcluster.sh) a test prepares the container's root with.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence

PLUGIN_FILE = "spank_pyxis.so"
# Where the libedgetpu double finds a node's simulated /sys and /dev inside a container
# (EDGETPU_DOUBLE_ROOT there): the node's sys bind-mounted (DOUBLE_MOUNT, a ``container_mounts`` line),
# and a link to the container's own /dev (DOUBLE_HOOK, a ``container_hook``), which holds only what
# enroot and the hooks put there. (The cluster's base is in the container too, but read-only and
# nodev: its simulated nodes cannot be opened through it.)
DOUBLE_ROOT = "/opt/stpu-double"
DOUBLE_HOOK = f'mkdir -p "$ENROOT_ROOTFS{DOUBLE_ROOT}/sys"\nln -sfn /dev "$ENROOT_ROOTFS{DOUBLE_ROOT}/dev"'
DOUBLE_MOUNT = f"%N/sys {DOUBLE_ROOT}/sys none x-create=dir,rbind,ro,nosuid,nodev,noexec"
IMAGE_CACHE = os.environ.get("SLURM_TPU_ENROOT_IMAGE_CACHE", "/var/cache/slurm-tpu/enroot-images")
ENROOT_PREFIX_ENV = "SLURM_TPU_ENROOT_PREFIX"  # where build-containers.sh installed enroot


def enroot_prefix() -> str | None:
    """The enroot scripts/build-containers.sh installed (``$SLURM_TPU_ENROOT_PREFIX``, else the newest
    ``/opt/enroot-*``), or None."""
    given = os.environ.get(ENROOT_PREFIX_ENV)
    candidates = [given] if given else sorted(glob.glob("/opt/enroot-*"))
    for prefix in reversed(candidates):
        if os.access(os.path.join(prefix, "bin", "enroot"), os.X_OK):
            return prefix
    return None


def pyxis_for(version: str) -> str | None:
    """The Pyxis plugin built for Slurm ``version`` (``22.05.8``), or None."""
    from slurm_tpu.slurm import gres_plugin

    path = os.path.join(gres_plugin.root(), version, PLUGIN_FILE)
    return path if os.path.isfile(path) else None


def missing(version: str | None) -> str | None:
    """Why Pyxis + enroot cannot run for a cluster of Slurm ``version`` here (one line), or None."""
    if not enroot_prefix():
        return "enroot is not built (scripts/build-containers.sh: no /opt/enroot-*/bin/enroot)"
    if not version or not pyxis_for(version):
        return f"Pyxis is not built for Slurm {version} (scripts/build-containers.sh)"
    if not shutil.which("unsquashfs"):
        return "unsquashfs (squashfs-tools) is not installed: enroot cannot unpack an image"
    return None


def _world_dir(path: str) -> None:
    """A sticky, world-writable directory (like /tmp): each user makes her own 0700 one in it."""
    os.makedirs(path, exist_ok=True)
    os.chmod(path, 0o1777)


def _tolerate_missing_dev(path: str) -> None:
    """enroot's restricted /dev (its hooks.d/10-devices.sh) binds /dev/mqueue and /dev/log from the
    host and fails when one is absent; machines without them (this suite's VMs: no mqueue mount, no
    syslog socket) get the line marked ``nofail,silent`` in the node's copy, as enroot's own
    /dev/hugepages line is."""
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    for node in ("/dev/mqueue", "/dev/log"):
        if not os.path.exists(node):
            text = re.sub(
                rf"^({re.escape(node)}\s+{re.escape(node)}\s+none\s+\S+)$", r"\1,nofail,silent", text, flags=re.M
            )
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(text)


def write_plugstack(base: str, version: str) -> str:
    """``<base>/etc/plugstack.conf`` loading Pyxis; returns its path."""
    plugin = pyxis_for(version)
    if not plugin:
        raise RuntimeError(f"Pyxis is not built for Slurm {version}: run scripts/build-containers.sh")
    runtime = os.path.join(base, "pyxis")
    os.makedirs(runtime, mode=0o755, exist_ok=True)
    path = os.path.join(base, "etc", "plugstack.conf")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(f"# Generated by harness.localcluster for {base}\nrequired {plugin} runtime_path={runtime}\n")
    return path


def configure_node(
    base: str,
    node: str,
    node_dir: str,
    node_config: str,
    libedgetpu: str,
    python: str,
    slurm_prefix: str | None,
    extra_mounts: Sequence[str] = (),
    extra_hook: str = "",
) -> str:
    """The node's enroot (wrapper and system config, see the module docstring); returns the
    directory to put first on its slurmd's PATH."""
    from slurm_tpu.hooks.enroot import HOOK_NAME
    from slurm_tpu.ops import node_files
    from slurm_tpu.ops.install import enroot_hook_text

    prefix = enroot_prefix()
    if not prefix:
        raise RuntimeError("enroot is not built: run scripts/build-containers.sh")
    top = os.path.join(base, "enroot")
    for sub in ("", "data", "run", "cache", "config", "tmp"):
        _world_dir(os.path.join(top, sub))
    for sub in ("data", "run"):
        _world_dir(os.path.join(top, sub, node))
    etc = os.path.join(node_dir, "enroot", "etc")
    if os.path.isdir(etc):
        shutil.rmtree(etc)
    shutil.copytree(os.path.join(prefix, "etc", "enroot"), etc, symlinks=True)
    _tolerate_missing_dev(os.path.join(etc, "hooks.d", "10-devices.sh"))
    hook = os.path.join(etc, "hooks.d", HOOK_NAME)
    with open(hook, "w", encoding="utf-8") as handle:
        handle.write(
            enroot_hook_text(
                python,
                node_files.package_root(),
                node_config,
                libedgetpu,
                os.path.join(node_dir, "dev"),
                os.path.join(node_dir, "sys"),
            )
        )
    os.chmod(hook, 0o755)
    if extra_hook:  # the test's own preparation of the container's root (%N: the node's directory)
        path = os.path.join(etc, "hooks.d", "95-localcluster.sh")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("#!/bin/sh\nset -eu\n" + extra_hook.replace("%N", node_dir).replace("%n", node) + "\n")
        os.chmod(path, 0o755)
    readonly = "x-create=dir,rbind,ro,nosuid,nodev,private"
    lines = [
        f"{base} {base} none {readonly}",
        f"{node_files.package_root()} {node_files.package_root()} none {readonly}",
    ]
    if slurm_prefix:
        lines.append(f"{slurm_prefix} {slurm_prefix} none {readonly}")
    lines += [line.replace("%N", node_dir).replace("%n", node) for line in extra_mounts]
    with open(os.path.join(etc, "mounts.d", "90-localcluster.fstab"), "w", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
    bin_dir = os.path.join(node_dir, "enroot", "bin")
    os.makedirs(bin_dir, exist_ok=True)
    wrapper = os.path.join(bin_dir, "enroot")
    with open(wrapper, "w", encoding="utf-8") as handle:
        handle.write(
            "#!/bin/sh\n"
            f"# enroot for node {node} of the cluster in {base} (harness/localcluster/containers.py)\n"
            "uid=$(id -u)\n"
            f'ENROOT_SYSCONF_PATH="{etc}"\n'
            f'ENROOT_DATA_PATH="{top}/data/{node}/$uid"\n'
            f'ENROOT_RUNTIME_PATH="{top}/run/{node}/$uid"\n'
            f'ENROOT_CACHE_PATH="{top}/cache/$uid"\n'
            f'ENROOT_CONFIG_PATH="{top}/config/$uid"\n'
            f'ENROOT_TEMP_PATH="{top}/tmp"\n'
            "ENROOT_RESTRICT_DEV=y\n"
            f'PATH="{prefix}/bin:$PATH"  # its utilities (enroot-mount, enroot-nsenter...)\n'
            "export ENROOT_SYSCONF_PATH ENROOT_DATA_PATH ENROOT_RUNTIME_PATH ENROOT_CACHE_PATH ENROOT_CONFIG_PATH\n"
            "export ENROOT_TEMP_PATH ENROOT_RESTRICT_DEV PATH\n"
            f'exec "{prefix}/bin/enroot" "$@"\n'
        )
    os.chmod(wrapper, 0o755)
    return bin_dir


def enroot_image() -> str:
    """The suite's offline image (harness/containers/image.py) as enroot unpacks it: its root
    filesystem without device nodes (an unprivileged unsquashfs, which is what ``enroot create``
    runs, refuses to make them: "could not create character device ... you're not superuser", and
    enroot's restricted /dev replaces them anyway), squashed once per image key and cached under
    ``IMAGE_CACHE``. RuntimeError (one line) when the image cannot be built here."""
    from harness.containers import image as builder

    built = builder.build()
    entry = os.path.join(IMAGE_CACHE, built.key)
    squashfs = os.path.join(entry, "image.sqsh")
    if os.path.isfile(squashfs):
        return squashfs
    os.makedirs(IMAGE_CACHE, exist_ok=True)
    work = tempfile.mkdtemp(prefix=f"{built.key}.", dir=IMAGE_CACHE)
    try:
        rootfs = os.path.join(work, "rootfs")
        os.mkdir(rootfs)
        subprocess.run(["tar", "-xf", built.rootfs, "-C", rootfs, "--exclude=./dev/*"], check=True, capture_output=True)
        subprocess.run(
            [
                "mksquashfs",
                rootfs,
                os.path.join(work, "image.sqsh"),
                "-noappend",
                "-quiet",
                "-no-progress",
                "-all-root",
            ],
            check=True,
            capture_output=True,
        )
        shutil.rmtree(rootfs)
        os.chmod(work, 0o755)
        os.chmod(os.path.join(work, "image.sqsh"), 0o644)
        os.rename(work, entry)
    except subprocess.CalledProcessError as exc:
        shutil.rmtree(work, ignore_errors=True)
        raise RuntimeError(
            f"cannot squash the image for enroot: {(exc.stderr or b'').decode().strip()[-300:]}"
        ) from None
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        if not os.path.isfile(squashfs):  # another process's rename won the race: use its image
            raise
    return squashfs
