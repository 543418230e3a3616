"""A job owner's ACL on her leased node must not outlive her lease.

While alice's job owns a node she may ``setfacl -m u:stpu_bob:rw`` it. chmod only
rewrites an ACL's mask, so with a mode that has group bits (an admin's
``devices.idle.mode: '0660'``) her grant would let bob in after her job. The
hooks strip extended ACLs on every ownership change (slurm_tpu/access/ownership.py).
"""

from __future__ import annotations

import os
import stat
import subprocess

import pytest
from support import (
    PCI,
    clear_lease_when_free,
    inventory,
    leases,
    node_on,
    one_node_two_tpus,
    open_as,
    out,
    owner,
    restore_node,
    resume,
    wait_until,
)

ACCESS_ACL = "system.posix_acl_access"
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mknod, chown)")
needs_setfacl = pytest.mark.skipif(
    not os.path.exists("/usr/bin/setfacl"), reason="setfacl is not installed (scripts/setup.sh installs acl)"
)


def setfacl(*args: str) -> None:
    subprocess.run(["setfacl", *args], check=True, capture_output=True, timeout=30)


@needs_root
@needs_setfacl
def test_set_owner_strips_an_access_acl_even_when_owner_and_mode_are_already_right(tmp_path):
    from slurm_tpu.access.ownership import set_owner

    node = str(tmp_path / "node")
    os.mknod(node, stat.S_IFCHR | 0o660, os.makedev(240, 7))
    setfacl("-m", "u:nobody:rw", node)
    assert ACCESS_ACL in os.listxattr(node)
    assert set_owner(node, PCI, 0, 0, stat.S_IMODE(os.lstat(node).st_mode))  # only the ACL differs
    assert ACCESS_ACL not in os.listxattr(node)
    assert not set_owner(node, PCI, 0, 0, 0o660)  # nothing left to change


@needs_root
@needs_setfacl
def test_a_slot_node_does_not_inherit_the_slot_directorys_default_acl(tmp_path):
    from slurm_tpu.access.slots import ensure_placeholder_slot

    slot_dir = tmp_path / "slots"
    slot_dir.mkdir()
    setfacl("-d", "-m", "u:nobody:rw", str(slot_dir))  # what mknod in it would inherit
    assert ensure_placeholder_slot(str(slot_dir), PCI)
    slot = os.path.join(slot_dir, PCI)
    assert ACCESS_ACL not in os.listxattr(slot, follow_symlinks=False)
    assert owner(slot) == (0, 0, 0o600)


@pytest.fixture(scope="module")
def cluster():
    yield from one_node_two_tpus()


def set_modes(cluster, mode: str | None) -> None:
    """Idle and lease mode of n1's nodes (None: the defaults, 0600); the hooks read it per run."""
    import yaml

    path = cluster.node_config("n1")
    with open(path, encoding="utf-8") as handle:
        config = yaml.safe_load(handle)
    devices = config.setdefault("devices", {})
    for key in ("idle", "lease"):
        if mode is None:
            devices.pop(key, None)
        else:
            devices[key] = {"mode": mode}
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(config, handle)


@pytest.mark.slurm
@needs_setfacl
def test_an_acl_the_job_owner_granted_is_gone_after_her_job_even_under_group_modes(cluster, users):
    node = inventory(cluster, "n1")[PCI][0]
    # The emulated apex driver's node is a pty, and devpts keeps no ACLs: put the card's node
    # on a filesystem that does, with numbers no driver answers (an open past the permission
    # check gets ENXIO, so what the file mode and ACL allow is all an open tells).
    unanswered = out(cluster, "acl.nodriver")
    if os.path.lexists(unanswered):
        os.unlink(unanswered)
    os.mknod(unanswered, stat.S_IFCHR | 0o600, os.makedev(240, 250))
    rdev = node_on(node, unanswered)
    set_modes(cluster, "0660")  # an admin's group modes: a leftover ACL's mask would be rw
    try:
        started, stop_file, err = out(cluster, "acl.started"), out(cluster, "acl.stop"), out(cluster, "acl.err")
        script = (
            f"#!/bin/sh\nset -e\nsetfacl -m u:stpu_bob:rw {node}\ntouch {started}\n"
            f"while [ ! -e {stop_file} ]; do sleep 0.1; done\n"
        )
        job = cluster.sbatch(
            ["-w", "n1", "--gres=tpu:edgetpu_pci:1", "-o", "/dev/null", "-e", err], script, user="stpu_alice"
        )
        wait_until(
            lambda: os.path.exists(started) or cluster.job_state(job) in ("FAILED", "CANCELLED"),
            180,
            f"job {job} to start and set its ACL",
        )
        assert os.path.exists(started), open(err).read()
        # Alice's grant works while she owns the node (ENXIO: past the permission check).
        assert owner(node) == (users["stpu_alice"], 0, 0o660) and ACCESS_ACL in os.listxattr(node)
        assert open_as("stpu_bob", node) == "ENXIO"
        open(stop_file, "w").close()
        assert cluster.wait_for_jobs([job], timeout=180)[job] == "COMPLETED"
        if leases(cluster, "n1"):
            # The epilog kept the lease (a holder scan cut short on a machine busy with other tests'
            # fds drains, by design): the admin's clear hands the node back to its idle owner.
            clear_lease_when_free(cluster, PCI)
        assert owner(node) == (0, 0, 0o660)
        assert open_as("stpu_bob", node) == "EACCES"
        assert ACCESS_ACL not in os.listxattr(node)
        listing = subprocess.run(["getfacl", "-c", node], capture_output=True, text=True, check=True).stdout
        assert "user:stpu_bob" not in listing, listing
    finally:
        set_modes(cluster, None)
        restore_node(node, rdev)
        if "DRAIN" in cluster.node_states()["n1"]:
            resume(cluster)
