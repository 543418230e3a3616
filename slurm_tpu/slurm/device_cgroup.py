"""Slurm's device cgroup (``ConstrainDevices=yes``) as a second layer: where it holds for our GRES.

The one place in the code that knows these facts (``doctor`` and ``install`` report
:func:`status`); docs/security.md gives the measurements (tests/isolation/test_device_cgroup.py):

* **Release.** Up to 22.05 ``gres_g_get_devices()`` (task_cgroup_devices.c) skips a
  GRES without a gres plugin of its own (:data:`GRES_WITH_PLUGIN` have one; ``tpu``,
  ``npu`` do not), so ``ConstrainDevices=yes`` leaves our devices alone there; fixed in
  :data:`FIX`. Our gres/tpu plugin (slurm_plugin/, in slurm.conf's PluginDir) gives
  ``tpu`` one on 22.05 too; ``npu`` has none.
* **Bus.** slurmd reads each ``File=``'s major:minor once, at start: a PCIe node keeps
  its numbers, a USB stick gets a new node at every re-enumeration (each revocation),
  so for sticks the layer holds only until then.
* **cgroup version.** Tested with cgroup/v1 on a hybrid mount; cgroup/v2 is not.
"""

from __future__ import annotations

import os

FIRST_RELEASE = (23, 2)  # the first release whose gres_g_get_devices() includes a GRES without a plugin (bug 14139)
FIRST_RELEASE_NAME = "Slurm 23.02"
FIX = f"{FIRST_RELEASE_NAME} (commit dd2e76b9df, bug 14139)"
# GRES names Slurm has a gres plugin for (gres_<name>.so): the device cgroup covers them on every release.
GRES_WITH_PLUGIN = ("gpu", "mps", "shard", "nic")


def needs_the_fix(gres_names) -> bool:
    """Whether any of a node's GRES names is one the device cgroup skips before 23.02 (no plugin)."""
    return any(name not in GRES_WITH_PLUGIN for name in gres_names)


def read_cgroup_conf(path: str) -> dict[str, str] | None:
    """cgroup.conf's ``Key=Value`` lines, keys lower-cased (Slurm's keys are case-insensitive); None if unreadable."""
    from .parse import config_lines

    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            lines = [line.partition("=") for _, line in config_lines(handle.read())]
    except OSError:
        return None
    return {key.strip().lower(): value.strip() for key, sep, value in lines if sep}


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

    ``has_tpu``: the node has devices of a GRES without a plugin (:func:`needs_the_fix`). Not fine
    only when ConstrainDevices is on for such a node under a release on which it does nothing for
    them: the admin would count on a layer that is not there.
    """
    cgroup_conf = os.path.join(os.path.dirname(slurm_conf), "cgroup.conf")  # read from slurm.conf's directory
    if not constrains_devices(slurm_options, read_cgroup_conf(cgroup_conf)):
        what = f"off (no ConstrainDevices=yes in {cgroup_conf} with TaskPlugin=task/cgroup)"
        return True, f"{what}; the device files' ownership is the layer that isolates", ""
    if version is None:
        return True, f"on ({cgroup_conf}); slurmd's release unknown", ""
    if covers_gres_without_plugin(version):
        return True, where_it_holds(version), ""
    from .gres_plugin import in_plugin_dir

    if has_tpu and in_plugin_dir(slurm_options) is None:
        fix = f"do not count on it for Edge TPUs or NPUs: run {FIRST_RELEASE_NAME} or later for this second layer"
        return False, where_it_holds(version), f"{fix} (it still constrains GPUs)"
    return (
        True,
        f"ConstrainDevices=yes denies unallocated Edge TPUs under Slurm {version} through our gres/tpu plugin "
        "(PluginDir); USB sticks only until their first re-enumeration; not Hailo NPUs (no plugin)",
        "",
    )
