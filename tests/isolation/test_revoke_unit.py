"""The revocation sequence against a materialized sysfs testbed, and the holder scan.

No USB core runs here: a thread plays the kernel's part of drivers/usb/core/port.c
disable_store() (on "1" the device directory goes) and records what the hooks
did, and in which order. What a real kernel then does to usbfs fds is argued in
slurm_tpu/access/revoke.py; tests/isolation/test_revocation.py shows it with real
fds on the emulated USB core.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys
import threading
import time

import pytest
from hidden_holders import DECOYS

from harness.localcluster.hardware import usb_sysfs_device
from slurm_tpu.access import processes, revoke
from slurm_tpu.access.ledger import Ledger
from slurm_tpu.config import Config
from slurm_tpu.hooks import leasing
from slurm_tpu.hooks.context import JobContext
from slurm_tpu.hooks.settings import HookSettings, apply_families
from slurm_tpu.protocol.inventory import KnownDevice

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (mknod, chown)")


class KernelPort(threading.Thread):
    """Watches one hub port's ``disable``; on 1 removes the device (as usb_disconnect does)."""

    def __init__(self, sys_root: str, port_path: str, node: str):
        super().__init__(daemon=True)
        self.device = os.path.realpath(os.path.join(sys_root, "bus", "usb", "devices", port_path))
        self.link = os.path.join(sys_root, "bus", "usb", "devices", port_path)
        self.disable = os.path.join(os.path.realpath(os.path.join(self.device, "port")), "disable")
        self.node, self.seen, self.stopping = node, [], False

    def run(self) -> None:
        last = "0"
        while not self.stopping:
            with open(self.disable, encoding="ascii") as handle:
                value = handle.read().strip()
            if value != last:
                info = os.lstat(self.node)
                # What the hooks had done to the node when the kernel acted on the write.
                self.seen.append((value, os.path.exists(self.device), info.st_uid, stat.S_IMODE(info.st_mode)))
                if value == "1":
                    shutil.rmtree(self.device)
                    os.unlink(self.link)
                last = value
            time.sleep(0.002)


def _stick_settings(tmp_path, node: str) -> tuple[KnownDevice, HookSettings]:
    """The emulated stick as a known device, and hook settings (default config) that know it."""
    device = KnownDevice("usb-2-1.3", "edgetpu", "usb", (node,))
    settings = HookSettings(str(tmp_path / "state"), devices={device.identity: device})
    apply_families(settings, Config())
    return device, settings


@pytest.fixture()
def usb_testbed(tmp_path):
    sys_root = str(tmp_path / "sys")
    node = str(tmp_path / "dev" / "bus" / "usb" / "002" / "005")
    os.makedirs(os.path.dirname(node))
    os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(240, 211))
    usb_sysfs_device(sys_root, "2-1.3", 2, 5, node)
    return sys_root, node


@needs_root
def test_epilog_takes_ownership_away_then_disconnects_then_powers_the_port_again(tmp_path, usb_testbed):
    sys_root, node = usb_testbed
    device, settings = _stick_settings(tmp_path, node)
    settings.sysfs_root = sys_root
    kernel = KernelPort(sys_root, "2-1.3", node)
    kernel.start()
    try:
        with Ledger(settings.state_dir) as ledger:
            leasing.acquire(ledger, JobContext(5, 4321, "alice", "n1"), [device], settings)
            assert os.lstat(node).st_uid == 4321
            assert leasing.release(ledger, 5, settings) == []
            # The lease stays until udev reports the stick back (udev_event ends it).
            assert ledger.read(device.identity).phase == "revoking"
        deadline = time.monotonic() + 10
        while len(kernel.seen) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        kernel.stopping = True
        kernel.join()
    # 1 was written while the device existed and the node was already root 0600;
    # 0 only after the kernel had destroyed the device.
    assert kernel.seen == [("1", True, 0, 0o600), ("0", False, 0, 0o600)]


@needs_root
def test_a_kernel_without_the_port_attribute_keeps_the_lease_with_one_line(tmp_path, usb_testbed):
    sys_root, node = usb_testbed
    os.unlink(os.path.join(os.path.realpath(os.path.join(sys_root, "bus/usb/devices/2-1.3/port")), "disable"))
    device, settings = _stick_settings(tmp_path, node)
    settings.sysfs_root = sys_root
    with Ledger(settings.state_dir) as ledger:
        leasing.acquire(ledger, JobContext(6, 4321, "alice", "n1"), [device], settings)
        problems = leasing.release(ledger, 6, settings)
        assert len(problems) == 1 and "devices.revoke: false" in problems[0] and "usb-2-1.3" in problems[0]
        assert ledger.read(device.identity).phase == "kept"
    assert os.lstat(node).st_uid == 0


@needs_root
def test_revoke_false_releases_at_once_after_the_holder_scan(tmp_path, usb_testbed):
    sys_root, node = usb_testbed
    device, settings = _stick_settings(tmp_path, node)
    settings.sysfs_root, settings.revoke = sys_root, False
    with Ledger(settings.state_dir) as ledger:
        leasing.acquire(ledger, JobContext(7, 4321, "alice", "n1"), [device], settings)
        assert leasing.release(ledger, 7, settings) == []
        assert ledger.names() == []
    with open(
        os.path.join(os.path.realpath(os.path.join(sys_root, "bus/usb/devices/2-1.3/port")), "disable")
    ) as handle:
        assert handle.read().strip() == "0"  # never touched


# libc's mmap, not Python's mmap module (which keeps a dup() of the fd).
HOLD_MAPPED = """
import ctypes, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long)
fd = os.open(sys.argv[1], os.O_RDWR)
address = libc.mmap(None, 4096, 3, 2, fd, 0)  # PROT_READ|PROT_WRITE, MAP_PRIVATE
assert address not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
os.close(fd)  # only the mapping keeps the device now
print("mapped", flush=True)
time.sleep(60)
"""


@needs_root
def test_scan_finds_an_open_fd_and_a_mapping_whose_fd_is_closed(tmp_path):
    zero = str(tmp_path / "apex_0")
    os.mknod(zero, stat.S_IFCHR | 0o600, os.stat("/dev/zero").st_rdev)  # mappable, keeps vm_file
    rdev = os.stat(zero).st_rdev
    filesystems = {os.lstat(zero).st_dev}
    holder = subprocess.Popen([sys.executable, "-c", HOLD_MAPPED, zero], stdout=subprocess.PIPE, text=True)
    opener = subprocess.Popen(["sleep", "60"], stdin=open(zero, "rb"))
    try:
        assert holder.stdout.readline().strip() == "mapped"
        scan = processes.scan_holders([rdev], filesystems, 5.0)
        assert scan.complete
        assert scan.holders[holder.pid] == "mmap" and scan.holders[opener.pid] == "fd"
        # The same mapping is invisible to a scan told the node lives elsewhere.
        assert holder.pid not in processes.scan_holders([rdev], set(), 5.0).holders
    finally:
        for process in (holder, opener):
            process.kill()
            process.wait()


def start_decoys(count: int, fds_each: int, user: str | None = None) -> list[subprocess.Popen]:
    """Processes holding many fds of /dev/null each (this sandbox caps a process at 20000)."""
    prefix = ["runuser", "-u", user, "--"] if user else []
    decoys = [
        subprocess.Popen(
            [*prefix, "/usr/bin/python3", "-I", "-c", DECOYS, str(fds_each)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]
    for decoy in decoys:
        assert decoy.stdout.readline().strip() == "ready"
    return decoys


def stop_decoys(decoys: list[subprocess.Popen]) -> None:
    for decoy in decoys:
        decoy.kill()
        decoy.wait()


@needs_root
def test_a_flood_of_decoy_fds_makes_the_scan_incomplete_not_clean():
    decoys = start_decoys(10, 19000)  # 190000 fds: far more than 50 ms of stat() calls
    try:
        started = time.monotonic()
        scan = processes.scan_holders([os.makedev(240, 250)], set(), 0.05)
        elapsed = time.monotonic() - started
        assert not scan.complete and scan.holders == {} and scan.scanned < scan.total
        # Bounded by the budget plus one directory listing of a decoy's fds, not by the stats.
        assert elapsed < 5
    finally:
        stop_decoys(decoys)


@needs_root
def test_a_process_titled_slurmstepd_is_no_job_step():
    forged = subprocess.Popen(["bash", "-c", "exec -a 'slurmstepd: [63.batch]' sleep 60"])
    try:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            with open(f"/proc/{forged.pid}/cmdline", "rb") as handle:
                if handle.read().startswith(b"slurmstepd: [63."):
                    break
            time.sleep(0.01)
        else:
            pytest.fail("exec -a did not retitle the process")
        # Even as root its executable is sleep, not Slurm's slurmstepd.
        assert not processes.is_slurmstepd(forged.pid)
        assert processes.job_step_pids(63) == []
    finally:
        forged.kill()
        forged.wait()


def test_only_usb_edge_tpus_are_power_cycled_and_pcie_ones_counted():
    from slurm_tpu.protocol.hooks_snapshot import GASKET_WRITERS, SCAN, USB_PORT

    settings = HookSettings("/run/x")
    apply_families(settings, Config())
    assert settings.revocation("edgetpu", "usb") == USB_PORT
    assert settings.revocation("edgetpu", "pci") == GASKET_WRITERS
    assert settings.revocation("gpu", "pci") == SCAN and settings.revocation("unknown", "usb") == SCAN


def test_gasket_write_count_is_read_from_the_apex_class(tmp_path):
    directory = tmp_path / "class" / "apex" / "apex_0"
    directory.mkdir(parents=True)
    (directory / "write_open_count").write_text("2\n")
    assert revoke.gasket_writers(str(tmp_path), "/dev/apex_0") == 2
    assert revoke.gasket_writers(str(tmp_path), "/dev/apex_1") is None
