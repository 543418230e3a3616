"""``slurm-tpu detect --check-runtime``: what libedgetpu sees against our inventory.

The first thing to run when a job says "Failed to load delegate" or "libedgetpu cannot
open": every Edge TPU detection found should be in ``edgetpu_list_devices()`` at the
very path the task-prolog exports (``jobenv.libedgetpu_path``), and libedgetpu should
list nothing else; each disagreement's message says what it means. It only *lists*:
opening a USB stick resets it, which would kill a job that is using it.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from ..families.coral import KIND as EDGETPU
from ..hardware import Inventory
from ..protocol import jobenv


@dataclass(frozen=True)
class Finding:
    """One Edge TPU, as we and libedgetpu see it."""

    identity: str | None  # None: only libedgetpu knows it
    path: str | None  # "type:path" as libedgetpu names it
    ok: bool
    message: str


@dataclass(frozen=True)
class RuntimeCheck:
    library: str
    version: str | None
    listed: tuple[str, ...]  # "type:path", in libedgetpu's order
    findings: tuple[Finding, ...]

    @property
    def agrees(self) -> bool:
        return all(f.ok for f in self.findings)

    def as_dict(self) -> dict:
        return {
            "library": self.library,
            "version": self.version,
            "listed": list(self.listed),
            "agrees": self.agrees,
            "findings": [asdict(f) for f in self.findings],
        }

    def text(self) -> str:
        lines = [f"libedgetpu: {self.library} ({self.version or 'no edgetpu_version()'})"]
        lines += [f"{'ok' if f.ok else 'PROBLEM'}: {f.message}" for f in self.findings]
        if not self.findings:
            lines.append("ok: no Edge TPU here, and libedgetpu lists none")
        problems = sum(not f.ok for f in self.findings)
        lines.append(f"{problems} problem(s), see the PROBLEM lines" if problems else "libedgetpu and slurm-tpu agree")
        return "\n".join(lines) + "\n"


def _not_listed(identity: str, device_type: str, path: str) -> str:
    if device_type == "usb":
        name = path.rsplit("/", 1)[-1]
        return (
            f"{identity}: in sysfs at {path} but libedgetpu does not list it: libusb cannot enumerate it; "
            f"check that {path}/descriptors and those of every hub above it are readable "
            f"(lsusb -t should show {name})"
        )
    return (
        f"{identity}: {path} exists but libedgetpu does not list it: it looks in /sys/class/apex; check "
        "that the apex driver created the device (lsmod | grep apex; dmesg | grep apex)"
    )


def compare(inventory: Inventory, listed: Sequence[tuple[str, str]]) -> list[Finding]:
    """Our Edge TPUs against libedgetpu's list (pure: no I/O)."""
    seen = [f"{t}:{p}" for t, p in listed]
    findings, expected = [], set()
    for accelerator in inventory:
        if accelerator.kind != EDGETPU:
            continue
        identity = accelerator.identity
        if not accelerator.usable:
            findings.append(Finding(identity, None, False, f"{identity}: not usable: {accelerator.reason}"))
            continue
        try:
            device_type, path = jobenv.libedgetpu_path(identity, accelerator.primary_node)
        except ValueError as exc:
            findings.append(Finding(identity, None, False, str(exc)))
            continue
        where = f"{device_type}:{path}"
        expected.add(where)
        ok = where in seen
        message = f"{identity}: libedgetpu lists it at {where}" if ok else _not_listed(identity, device_type, path)
        findings.append(Finding(identity, where, ok, message))
    for where in (w for w in seen if w not in expected):
        message = (
            f"libedgetpu lists {where}, which is no Edge TPU of slurm-tpu's inventory: if that path does "
            "not exist, libusb placed a stick behind a hub it could not read (compare lsusb -t); "
            "otherwise detection missed it (run 'slurm-tpu detect')"
        )
        findings.append(Finding(None, where, False, message))
    return findings


def _access_findings(inventory: Inventory, environ: Mapping[str, str]) -> list[Finding]:
    """Inside a job, as its user: can this user open the nodes of the job's Edge TPUs?"""
    if os.geteuid() == 0:
        return []
    try:
        handles = jobenv.parse_environment(environ)
    except ValueError as exc:
        return [Finding(None, None, False, f"this job's environment: {exc}")]
    findings = []
    for handle in handles:
        accelerator = inventory.by_identity(handle.identity)
        for node in accelerator.device_nodes if accelerator is not None else ():
            if os.access(node, os.R_OK | os.W_OK):
                continue
            try:
                info = os.stat(node)
                how = f"owner uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):04o}"
            except OSError as exc:
                how = exc.strerror or "cannot stat"
            message = (
                f"{handle.identity}: this job's user cannot open {node} ({how}): the node's slurm-tpu prolog "
                "did not hand it over, or a udev rule took it back; check the prolog's log, and the installed "
                "udev rules against 'slurm-tpu udev-rules'"
            )
            findings.append(Finding(handle.identity, f"{handle.device_type}:{handle.path}", False, message))
    return findings


def check_runtime(
    inventory: Inventory, library_path: str | None = None, environ: Mapping[str, str] = os.environ
) -> RuntimeCheck:
    """Load libedgetpu (raises LibEdgeTpuError with one line if it cannot), list, compare."""
    from ..runner.engines import EdgeTpuLibrary

    library = EdgeTpuLibrary(library_path)
    # What libedgetpu lists on the whole node: inside a job, EDGETPU_VISIBLE_DEVICES (read by the
    # library at each call) would hide the other jobs' Edge TPUs from the comparison.
    saved = os.environ.pop(jobenv.EDGETPU_VISIBLE, None)
    try:
        listed = library.list_devices()
    finally:
        if saved is not None:
            os.environ[jobenv.EDGETPU_VISIBLE] = saved
    findings = compare(inventory, listed) + _access_findings(inventory, environ)
    return RuntimeCheck(library.path, library.version(), tuple(f"{t}:{p}" for t, p in listed), tuple(findings))


def installed_version(library_path: str | None = None) -> str | None:
    """edgetpu_version() of the libedgetpu jobs would load; None when none can be loaded."""
    from ..runner.engines import EdgeTpuLibrary
    from ..runner.errors import LibEdgeTpuError

    try:
        return EdgeTpuLibrary(library_path).version()
    except LibEdgeTpuError:
        return None


# A PCIe path no node has: asking for it opens nothing, whichever library answers.
VISIBLE_CHECK_PATH = "/dev/slurm-tpu-visible-check"
_VISIBLE_CHECK = (
    "import ctypes, sys\n"
    "library = ctypes.CDLL(sys.argv[1])\n"
    "library.edgetpu_create_delegate.restype = ctypes.c_void_p\n"
    "library.edgetpu_create_delegate(0, sys.argv[2].encode(), None, 0)\n"
)


def visible_devices_problem(library_path: str | None = None) -> str | None:
    """None when the libedgetpu jobs load honours EDGETPU_VISIBLE_DEVICES, else why not (one line).

    A child process (the library prints to its stderr) opens an explicit PCIe path with the
    variable set empty: a library built with scripts/libedgetpu-visible-devices.patch refuses at
    once with one line naming the variable; Coral's own build tries the path, silently.
    """
    import subprocess
    import sys

    from ..runner.engines import LIBEDGETPU_DEFAULT, LIBEDGETPU_ENV

    path = library_path or os.environ.get(LIBEDGETPU_ENV) or LIBEDGETPU_DEFAULT
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    env[jobenv.EDGETPU_VISIBLE] = ""
    argv = [sys.executable, "-I", "-c", _VISIBLE_CHECK, path, VISIBLE_CHECK_PATH]
    try:
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as exc:
        why = str(exc)
    else:
        if f"{VISIBLE_CHECK_PATH} is not in {jobenv.EDGETPU_VISIBLE}" in done.stderr:
            return None
        if done.returncode == 0:
            return (
                f"{path} ignores {jobenv.EDGETPU_VISIBLE}: unmodified Coral code in a job (pycoral's "
                "make_interpreter(model), list_edge_tpus()) sees every Edge TPU of the node and opens the first, "
                "not the job's"
            )
        why = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
    return f"cannot ask {path} whether it honours {jobenv.EDGETPU_VISIBLE} ({why})"
