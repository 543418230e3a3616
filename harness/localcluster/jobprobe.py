"""The scale benchmark's job: open the job's Edge TPUs, hold them, close them, and write down when.

Run by each job, as the job's user, from a copy in the cluster's directory
(``/usr/bin/python3 -I -S jobprobe.py OUT_DIR NODES_DIR HOLD_S [holder]``:
stdlib only, no import of slurm_tpu, which the job's user may not be able to read).

For every device the hooks gave the job (``SLURM_TPU_DEVICES`` and
``SLURM_TPU_EDGETPU_PATHS``, set by the task prolog) it finds the device node
as libedgetpu would: a PCIe card's path is its node; a USB stick's path is its
sysfs directory, whose ``uevent`` names the node (DEVNAME). In a local cluster
``/sys`` is the node's materialized sysfs under ``NODES_DIR/<node>/sys``.

Each open is recorded with CLOCK_MONOTONIC and CLOCK_REALTIME stamps before
the open and after the close. ``result`` is ``ok`` (an fd: the emulated apex
driver's pty), or the errno name: a simulated USB node reaches no driver, so a
*permitted* open fails with ENXIO after the permission check; EACCES means the
job was refused its own device.

``holder`` mode: after the first open the job writes ``OUT_DIR/<job>.holding``
and keeps the devices open until ``OUT_DIR/<job>.go`` appears (the benchmark
restarts slurmd or re-plugs the stick meanwhile), then finds each node again
(a re-plugged stick has a new one) and opens it once more.

The record goes to ``OUT_DIR/<job>.json`` (written to a temporary name, then
renamed: a record that exists is complete).
"""

import errno
import json
import os
import sys
import time

HOLDER_WAIT_S = 900  # a holder whose benchmark died ends anyway


def _stamp() -> dict:
    return {"mono": time.clock_gettime(time.CLOCK_MONOTONIC), "real": time.clock_gettime(time.CLOCK_REALTIME)}


def device_node(entry: str, nodes_dir: str, node: str) -> str:
    """``usb:/sys/bus/usb/devices/2-1.3`` or ``pci:/dev/apex_0`` (an EDGETPU_PATHS entry) -> the device node."""
    kind, _, path = entry.partition(":")
    if kind != "usb":
        return path
    if path.startswith("/sys/"):
        path = os.path.join(nodes_dir, node, "sys", path[len("/sys/") :])
    try:
        with open(os.path.join(path, "uevent"), encoding="ascii") as handle:
            for line in handle:
                if line.startswith("DEVNAME="):
                    return line[len("DEVNAME=") :].strip()
    except OSError:
        pass
    return path + " (no uevent: unplugged?)"


def open_all(devices: list, nodes_dir: str, node: str) -> list:
    """Open every device; returns [(record, fd or None)]."""
    opened = []
    for identity, entry in devices:
        path = device_node(entry, nodes_dir, node)
        record = {"identity": identity, "node": path, "open": _stamp()}
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
            record["result"] = "ok"
        except OSError as exc:
            fd = None
            record["result"] = errno.errorcode.get(exc.errno or 0, str(exc.errno))
        record["uid"] = os.lstat(path).st_uid if os.path.lexists(path) else None
        opened.append((record, fd))
    return opened


def close_all(opened: list) -> list:
    records = []
    for record, fd in opened:
        if fd is not None:
            os.close(fd)
        record["close"] = _stamp()
        records.append(record)
    return records


def main(argv: list) -> int:
    out_dir, nodes_dir, hold_s = argv[0], argv[1], float(argv[2])
    holder = argv[3:] == ["holder"]
    env = os.environ
    job = env.get("SLURM_JOB_ID", "?")
    node = env.get("SLURMD_NODENAME", "")
    identities = [i for i in env.get("SLURM_TPU_DEVICES", "").split(",") if i]
    entries = [e for e in env.get("SLURM_TPU_EDGETPU_PATHS", "").split(",") if e]
    devices = list(zip(identities, entries))
    record = {
        "job": job,
        "array_job": env.get("SLURM_ARRAY_JOB_ID"),
        "array_task": env.get("SLURM_ARRAY_TASK_ID"),
        "node": node,
        "uid": os.getuid(),
        "devices_env": env.get("SLURM_TPU_DEVICES"),
        "opens": [],
    }
    opened = open_all(devices, nodes_dir, node)
    if holder:
        marker = os.path.join(out_dir, f"{job}.holding")
        with open(marker + ".tmp", "w", encoding="ascii") as handle:
            handle.write(node + "\n")
        os.rename(marker + ".tmp", marker)
        deadline = time.monotonic() + HOLDER_WAIT_S
        while not os.path.exists(os.path.join(out_dir, f"{job}.go")) and time.monotonic() < deadline:
            time.sleep(0.05)
        record["opens"] += close_all(opened)
        opened = open_all(devices, nodes_dir, node)  # again: a re-plugged stick has a new node
    elif hold_s > 0:
        time.sleep(hold_s)
    record["opens"] += close_all(opened)
    path = os.path.join(out_dir, f"{job}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(record, handle)
    os.rename(path + ".tmp", path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
