"""An emulated USB core for local clusters: what the kernel does for a hub port's ``disable``.

There is no USB hardware (nor a usbfs) here, so the epilog's revocation
(slurm_tpu/access/revoke.py) writes to a materialized sysfs (hardware.py
usb_sysfs_device). This process plays the kernel's and udev's part, one node:

* ``disable`` set to 1 -> the usb_device is destroyed (drivers/usb/core/port.c
  disable_store() -> usb_disconnect()): its sysfs directory and device node go,
  and every fd on it becomes useless. Only a tty can have *that* done to its fds
  here: when the device's node (DEVNAME in its ``uevent``) is a pseudo-terminal,
  the tty layer's hangup (TIOCVHANGUP, drivers/tty/tty_io.c __tty_hangup()) is
  applied, which makes every open file on it fail writes with EIO — whoever
  holds it, in flight over a socket or not. Tests use that to show a smuggled fd
  really dies. Other nodes (experimental majors, no driver) have no fds to kill.
  Then udev's ``remove`` event runs the udev hook (``slurm-tpu-udev-event``).
* ``disable`` set to 0 -> the stick re-enumerates with the next devnum, as a
  fresh 1a6e:089a (no firmware), with a new node; then udev's ``add`` event.

The kernel never waits for udev: it queues the uevent and goes on
(lib/kobject_uevent.c kobject_uevent_env() only broadcasts it), and udevd runs
the rules in its own workers. So the udev hook runs here on a thread of its
own, one event at a time in the order the kernel made them (udevd keeps a
device's events in order), while the main loop goes on acting on ports. Run in
the loop itself, a udev hook waiting for the node's state lock (held by an
epilog that waits for *another* stick of the node to detach) stopped the
disconnect that epilog waited for: a deadlock no real node has.

Usage: ``python -m harness.localcluster.usbcore SYS_ROOT DEV_ROOT -- UDEV_HOOK_COMMAND...``
(the environment carries SLURM_TPU_CONFIG / SLURMD_NODENAME / SLURM_CONF for it).
It waits on inotify for writes to the ports' ``disable`` attributes (the kernel acts
within the write itself; a 10 ms poll made every revocation wait 5 ms on average for
the emulator, not for anything real), and polls as a fallback.
"""

from __future__ import annotations

import fcntl
import os
import queue
import shutil
import stat
import subprocess
import sys
import threading
import time

from slurm_tpu.families.coral import USB_BOOTLOADER, usb_product_prefix

from .hardware import EXPERIMENTAL_MAJOR, usb_sysfs_device

TIOCVHANGUP = 0x5437
PTY_SLAVE_MAJORS = range(136, 144)  # Unix98 pty slaves
POLL_S = 0.01  # fallback when inotify is not there
_IN_MODIFY, _IN_CLOSE_WRITE, _IN_CLOEXEC, _IN_NONBLOCK = 0x2, 0x8, 0o2000000, 0o4000


def _inotify(paths: list[str]) -> int | None:
    """An inotify fd watching writes to ``paths`` (the stdlib has no inotify: libc through ctypes);
    None if unavailable."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        fd = libc.inotify_init1(_IN_CLOEXEC | _IN_NONBLOCK)
        if fd < 0:
            return None
        for path in paths:
            if libc.inotify_add_watch(fd, path.encode(), _IN_MODIFY | _IN_CLOSE_WRITE) < 0:
                os.close(fd)
                return None
        return fd
    except (OSError, AttributeError):
        return None


class Port:
    """One hub port with an Edge TPU behind it."""

    def __init__(self, sys_root: str, port_path: str):
        self.sys_root, self.port_path = sys_root, port_path
        device = self.device_dir
        self.port_dir = os.path.realpath(os.path.join(device, "port"))
        self.busnum = int(_read(os.path.join(device, "busnum")))
        self.devnum = int(_read(os.path.join(device, "devnum")))
        self.devpath = "/" + os.path.relpath(os.path.realpath(device), sys_root)
        self.attached = True

    @property
    def device_dir(self) -> str:
        return os.path.join(self.sys_root, "bus", "usb", "devices", self.port_path)

    def disabled(self) -> bool:
        return _read(os.path.join(self.port_dir, "disable")) == "1"


def _read(path: str) -> str:
    with open(path, encoding="ascii") as handle:
        return handle.read().strip()


def _devname(device: str) -> str:
    for line in _read(os.path.join(device, "uevent")).splitlines():
        if line.startswith("DEVNAME="):
            return line[len("DEVNAME=") :]
    return ""


def _hang_up(node: str) -> None:
    """Make every open file on a tty useless (the only fds this machine can revoke)."""
    try:
        info = os.stat(node)
    except OSError:
        return
    if not stat.S_ISCHR(info.st_mode) or os.major(info.st_rdev) not in PTY_SLAVE_MAJORS:
        return
    try:
        fd = os.open(node, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError:
        return  # already hung up / master closed: nothing left to kill
    try:
        fcntl.ioctl(fd, TIOCVHANGUP)
    finally:
        os.close(fd)


class Udevd:
    """udev's side: runs the udev hook for each queued event, in order, on a thread of its own."""

    def __init__(self, command: list[str]):
        self.command = command
        self.events: queue.Queue = queue.Queue()
        threading.Thread(target=self._run, name="udevd", daemon=True).start()

    def __call__(self, action: str, port: Port, node: str) -> None:
        """Queue the event; what the environment says is fixed now, as the kernel's uevent is."""
        env = dict(
            os.environ,
            ACTION=action,
            DEVPATH=port.devpath,
            DEVNAME=node,
            SUBSYSTEM="usb",
            DEVTYPE="usb_device",
            PRODUCT=usb_product_prefix(USB_BOOTLOADER) + "100",
        )
        self.events.put((action, port.port_path, env))

    def _run(self) -> None:
        while True:
            action, port_path, env = self.events.get()
            done = subprocess.run(self.command, env=env, capture_output=True, text=True, timeout=120, check=False)
            if done.returncode != 0:
                sys.stderr.write(f"usbcore: udev-event {action} {port_path} failed: {done.stderr.strip()}\n")
                sys.stderr.flush()


def disconnect(port: Port, udev_event) -> None:
    device = port.device_dir
    node = _devname(device)
    _hang_up(node)
    shutil.rmtree(os.path.realpath(device))
    os.unlink(device)
    if node and not node.startswith("/dev/pts/"):
        try:
            os.unlink(node)
        except FileNotFoundError:
            pass
    port.attached = False
    udev_event("remove", port, node)


def connect(port: Port, dev_root: str, udev_event) -> None:
    port.devnum = port.devnum % 127 + 1
    node = os.path.join(dev_root, "bus", "usb", f"{port.busnum:03d}", f"{port.devnum:03d}")
    os.makedirs(os.path.dirname(node), exist_ok=True)
    if os.path.lexists(node):
        os.unlink(node)
    # A node of no driver (like hardware.materialize's), root 0600 as devtmpfs makes it.
    os.mknod(node, stat.S_IFCHR | 0o600, os.makedev(EXPERIMENTAL_MAJOR, 128 + port.devnum))
    os.chmod(node, 0o600)
    usb_sysfs_device(port.sys_root, port.port_path, port.busnum, port.devnum, node)
    port.attached = True
    udev_event("add", port, node)


def ports(sys_root: str) -> list[Port]:
    bus = os.path.join(sys_root, "bus", "usb", "devices")
    try:
        names = sorted(os.listdir(bus))
    except FileNotFoundError:
        return []
    return [Port(sys_root, name) for name in names]


def main(argv: list[str]) -> int:
    separator = argv.index("--")
    sys_root, dev_root = argv[0], argv[1]
    udev_event = Udevd(argv[separator + 1 :])
    import select

    watched = ports(sys_root)
    notify = _inotify([os.path.join(port.port_dir, "disable") for port in watched])
    while True:
        for port in watched:
            disabled = port.disabled()
            if disabled and port.attached:
                disconnect(port, udev_event)
            elif not disabled and not port.attached:
                connect(port, dev_root, udev_event)
        if notify is None:
            time.sleep(POLL_S)
            continue
        select.select([notify], [], [], 1.0)
        try:
            os.read(notify, 65536)  # drain: the loop above looks at every port anyway
        except BlockingIOError:
            pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
