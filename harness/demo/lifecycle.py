"""Start, reuse, restart and stop the demo's own cluster (and only that)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Callable

from slurm_tpu.protocol.jobenv import libedgetpu_path
from slurm_tpu.slurm import installation

from ..localcluster import containers
from ..localcluster.cluster import LocalCluster, NodeSpec, project_hooks
from .errors import DemoError
from .layout import NODES, PARTITION_EXTRA, REPO, SHARD_NODE, SHARED_STICK, SHARES, Layout
from .preflight import classify, running_slurm_daemons

FORMAT = 7  # bump when the demo's cluster layout changes: a running old one is restarted
_HEALTHY = ("IDLE", "MIXED", "ALLOCATED", "COMPLETING")
SHARING = {"version": 2, "families": {"edgetpu": {"shared": [SHARED_STICK], "shares_per_device": SHARES}}}


def containers_missing() -> str | None:
    """Why the demo's cluster runs no Pyxis (one line: enroot or Pyxis not built for its Slurm), or None."""
    return containers.missing(installation.version_of(installation.find(use_daemons=False).program("slurmd")))


def make_cluster(layout: Layout) -> LocalCluster:
    """The demo's LocalCluster object (nothing is started or written)."""
    hooks = project_hooks()
    nodes = [NodeSpec(n.name, n.hardware_path, n.cpus, n.real_memory_mb) for n in NODES]
    # accounting: its own MariaDB + slurmdbd, so sacct/sreport and QOS limits know the TPUs.
    return LocalCluster(
        base=layout.base,
        nodes=nodes,
        hooks=hooks,
        name="tpudemo",
        python=sys.executable,
        partition_extra=PARTITION_EXTRA,
        accounting=True,
        # One config for every node: only node-shard has this stick, so only it shares (and runs a broker).
        node_config_extra=SHARING,
        # The broker's libedgetpu: the double (built with the jobs' copy, before any shard job loads a model).
        broker_env={
            "SLURM_TPU_LIBEDGETPU": layout.libedgetpu,
            "EDGETPU_DOUBLE_DEVICES": "{}:{}".format(*libedgetpu_path(SHARED_STICK, None)),
            # No silicon runs an Edge TPU executable here: the broker runs the compiled model's CPU twin
            # (slurm_tpu/broker/executor.py, docs/limits.md), with the stick's node still opened.
            "SLURM_TPU_BROKER_TWIN": "1",
        },
        # Pyxis + enroot where they are built (scripts/build-containers.sh): the containerised step;
        # the enroot hook gives each container the node's libedgetpu, here the double.
        containers=containers_missing() is None,
        container_libedgetpu=layout.libedgetpu,
        container_mounts=(containers.DOUBLE_MOUNT,),
        container_hook=containers.DOUBLE_HOOK,
    )


def fingerprint() -> str:
    """Everything that shapes the cluster: a running one with another fingerprint is restarted."""
    slurm = list(installation.find(use_daemons=False).dirs)  # another Slurm release: another cluster
    digest = hashlib.sha256(
        json.dumps(
            [
                FORMAT,
                containers_missing() is None,
                sys.executable,
                str(REPO),
                list(PARTITION_EXTRA),
                SHARING,
                slurm,
                [(n.name, n.hardware, n.cpus, n.real_memory_mb) for n in NODES],
            ]
        ).encode()
    )
    for node in NODES:
        with open(node.hardware_path, "rb") as handle:
            digest.update(handle.read())
    return digest.hexdigest()[:16]


def _read_marker(layout: Layout) -> dict:
    try:
        with open(layout.marker, encoding="utf-8") as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return {}


def _healthy(cluster: LocalCluster) -> str | None:
    """None when every daemon runs and every node can take jobs, else why not."""
    pids = cluster.running_pids()
    expected = {"munged", "mariadbd", "slurmdbd", "slurmctld", *(f"slurmd-{n.name}" for n in NODES)}
    # Without its emulated apex driver a node's PCIe Edge TPUs show no write_open_count: not free.
    expected |= {f"apex-{n.name}" for n in NODES if cluster.apex_cards(n.name)}
    expected.add(f"broker-{SHARD_NODE}")
    if expected - set(pids):
        return "daemons missing: " + ", ".join(sorted(expected - set(pids)))
    try:
        states = cluster.node_states()
    except RuntimeError as exc:
        return f"slurmctld does not answer ({exc})"
    bad = {n: s for n, s in states.items() if s.split("+")[0] not in _HEALTHY or "DRAIN" in s}
    return f"nodes not ready: {bad}" if bad else None


def stop_own_daemons(layout: Layout) -> None:
    """Cancel the demo cluster's jobs and stop its daemons, strays included; nobody else's."""
    cluster = make_cluster(layout)
    if "slurmctld" in cluster.running_pids():
        subprocess.run(["scancel", "--partition=debug"], env=cluster.env(), capture_output=True, timeout=30)
    cluster.stop()
    strays = [d for d in running_slurm_daemons() if classify(d, layout.slurm_conf) == "own"]
    for daemon in strays:  # ours by their config, but their pid files are gone
        try:
            os.kill(daemon.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + 10
    while strays and time.monotonic() < deadline and any(os.path.exists(f"/proc/{d.pid}") for d in strays):
        time.sleep(0.2)


def _wipe(layout: Layout) -> None:
    """Empty the base directory (it is checked to be the demo's before this runs)."""
    if os.path.isdir(layout.base):
        for entry in os.listdir(layout.base):
            path = layout.path(entry)
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.unlink(path)
    os.makedirs(layout.base, mode=0o755, exist_ok=True)
    os.chmod(layout.base, 0o755)


def ensure_cluster(layout: Layout, say: Callable[[str], None]) -> tuple[LocalCluster, bool]:
    """The demo cluster, running: reused when healthy and unchanged, else (re)started.

    Returns the cluster and whether it was reused.
    """
    cluster = make_cluster(layout)
    marker = _read_marker(layout)
    running = cluster.running_pids()
    if running and marker.get("fingerprint") == fingerprint():
        problem = _healthy(cluster)
        if problem is None:
            return cluster, True
        say(f"restarting the demo cluster in {layout.base}: {problem}")
    elif running:
        say(f"restarting the demo cluster in {layout.base}: its configuration changed")
    stop_own_daemons(layout)
    _wipe(layout)
    with open(layout.marker, "w", encoding="utf-8") as handle:
        json.dump({"fingerprint": fingerprint(), "created": time.time()}, handle)
    try:
        cluster.configure()
        cluster.start()
    except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
        cluster.stop()
        raise DemoError(f"the demo cluster did not start ({exc}); logs are in {layout.path('log')}") from None
    return cluster, False


def double_devices(layout: Layout) -> str:
    """EDGETPU_DOUBLE_DEVICES: every simulated Edge TPU of the cluster as ``type:path``."""
    entries = []
    for node in NODES:
        with open(os.path.join(layout.node_dir(node.name), "inventory.json"), encoding="utf-8") as handle:
            inventory = json.load(handle)
        for accelerator in inventory["accelerators"]:
            if accelerator["kind"] == "edgetpu" and accelerator.get("usable", True):
                nodes = accelerator.get("device_nodes") or [None]
                entries.append("{}:{}".format(*libedgetpu_path(accelerator["identity"], nodes[0])))
    return ",".join(entries)
