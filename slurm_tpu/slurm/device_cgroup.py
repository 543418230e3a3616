"""Slurm's device cgroup (``ConstrainDevices=yes``) as a second layer: where it holds for our GRES.

The one place that knows these facts; ``doctor``, ``install`` and docs/security.md
say what this module says.

* **Release.** With ``TaskPlugin=task/cgroup`` and ``ConstrainDevices=yes`` in
  cgroup.conf, slurmstepd denies a job every ``File=`` of gres.conf it was not
  allocated (task_cgroup_devices.c, from the list ``gres_g_get_devices()``
  returns). Up to 22.05 that function skipped a GRES that has no gres plugin of
  its own (``gpu``, ``mps``, ``shard``, ``nic`` have one; ``tpu``, ``npu`` do not), so
  the device cgroup leaves our devices alone there. Fixed upstream in 23.02
  (commit dd2e76b9df, bug 14139). Measured: on Debian's 22.05 a job without the
  GRES opens a PCIe Edge TPU whose mode allows it; on 25.11 it gets EPERM
  (tests/isolation/test_device_cgroup.py). Our gres/tpu plugin (slurm_plugin/,
  named in slurm.conf's PluginDir) gives ``tpu`` a plugin on 22.05 too: its
  get_devices hands slurmd gres.conf's File= devices, and the job without the
  GRES gets EPERM there as well (measured, same test). ``npu`` has none.
* **Bus.** slurmd stat()s each ``File=`` once, when it starts, and denies those
  major:minor numbers. A PCIe card's node (``/dev/apex_N``) keeps its numbers,
  so the layer holds for it. A USB stick re-enumerates at every revocation (and
  on every replug): udev gives it a new ``/dev/bus/usb/BBB/DDD`` node, the slot
  node is re-pointed at it, and slurmd still denies the *old* numbers until it
  restarts. So for USB sticks the layer holds only until the stick's first
  re-enumeration after slurmd started; the file ownership the hooks manage is
  what keeps them private.
* **cgroup version.** Tested with ``CgroupPlugin=cgroup/v1`` on a hybrid
  mount (v1 controllers under /sys/fs/cgroup, v2 only at
  /sys/fs/cgroup/unified), the layout of these machines; cgroup/v2 needs the
  unified hierarchy mounted at /sys/fs/cgroup and is not tested here.
"""

from __future__ import annotations

import os

# The first release whose gres_g_get_devices() includes a GRES without a plugin (bug 14139).
FIRST_RELEASE = (23, 2)
FIRST_RELEASE_NAME = "Slurm 23.02"
FIX = f"{FIRST_RELEASE_NAME} (commit dd2e76b9df, bug 14139)"
# GRES names Slurm has a gres plugin for (gres_<name>.so): the device cgroup covers them on every release.
GRES_WITH_PLUGIN = ("gpu", "mps", "shard", "nic")


def needs_the_fix(gres_names) -> bool:
    """Whether any of a node's GRES names is one the device cgroup skips before 23.02 (no plugin)."""
    return any(name not in GRES_WITH_PLUGIN for name in gres_names)


def cgroup_conf_path(slurm_conf: str) -> str:
    """cgroup.conf is read from slurm.conf's directory."""
    return os.path.join(os.path.dirname(slurm_conf), "cgroup.conf")


def read_cgroup_conf(path: str) -> dict[str, str] | None:
    """cgroup.conf's ``Key=Value`` lines, keys lower-cased (Slurm's keys are case-insensitive); None if unreadable."""
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    options: dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        key, sep, value = line.partition("=")
        if sep:
            options[key.strip().lower()] = value.strip()
    return options


def constrains_devices(slurm_options: dict[str, str], cgroup_options: dict[str, str] | None) -> bool:
    """Whether this configuration asks for the device cgroup: task/cgroup (``slurm_options``: slurm.conf's,
    lower-case keys) and ConstrainDevices=yes."""
    task_plugins = slurm_options.get("taskplugin", "")
    return (
        "task/cgroup" in [p.strip() for p in task_plugins.split(",")]
        and cgroup_options is not None
        and cgroup_options.get("constraindevices", "no").lower() == "yes"
    )


def covers_gres_without_plugin(version: str) -> bool:
    """Whether slurmd ``version`` (``25.11.7``) puts a plugin-less GRES such as ``tpu`` in the device cgroup."""
    parts = version.split(".")
    try:
        return (int(parts[0]), int(parts[1])) >= FIRST_RELEASE
    except (IndexError, ValueError):
        return False


def where_it_holds(version: str) -> str:
    """One sentence: what ConstrainDevices=yes does for our GRES under slurmd ``version``."""
    if not covers_gres_without_plugin(version):
        return (
            f"ConstrainDevices=yes does nothing for gres/tpu or gres/npu under Slurm {version}: "
            "gres_g_get_devices() skips a GRES without a gres plugin (fixed in "
            f"{FIX}); the device files' ownership is the only layer"
        )
    return (
        f"ConstrainDevices=yes denies unallocated Edge TPUs under Slurm {version}: PCIe cards always; "
        "USB sticks only until their first re-enumeration (every revocation), because slurmd reads "
        "each File='s major:minor once at start"
    )


def status(slurm_options: dict[str, str], slurm_conf: str, version: str | None, has_tpu: bool) -> tuple[bool, str, str]:
    """(fine, what, fix) about the device cgroup on a node: ``doctor``'s finding and ``install``'s note.

    ``has_tpu``: the node has devices of a GRES without a plugin (:func:`needs_the_fix`: Edge TPUs,
    Hailo NPUs). Not fine only when ConstrainDevices is on for such a node under a release on which
    it does nothing for them: the admin would count on a layer that is not there.
    """
    cgroup_conf = cgroup_conf_path(slurm_conf)
    if not constrains_devices(slurm_options, read_cgroup_conf(cgroup_conf)):
        return (
            True,
            (
                f"off (no ConstrainDevices=yes in {cgroup_conf} with TaskPlugin=task/cgroup); "
                "the device files' ownership is the layer that isolates"
            ),
            "",
        )
    if version is None:
        return True, f"on ({cgroup_conf}); slurmd's release unknown", ""
    from .gres_plugin import in_plugin_dir

    if has_tpu and not covers_gres_without_plugin(version) and in_plugin_dir(slurm_options) is None:
        return (
            False,
            where_it_holds(version),
            (
                f"do not count on it for Edge TPUs or NPUs: run {FIRST_RELEASE_NAME} or "
                "later for this second layer (it still constrains GPUs)"
            ),
        )
    if not covers_gres_without_plugin(version):
        return (
            True,
            (
                f"ConstrainDevices=yes denies unallocated Edge TPUs under Slurm {version} through our "
                "gres/tpu plugin (PluginDir); USB sticks only until their first re-enumeration; "
                "not Hailo NPUs (no plugin)"
            ),
            "",
        )
    return True, where_it_holds(version), ""
