"""The enroot hook (``enroot/98-slurm-tpu.sh``): a Pyxis/enroot container gets its job's accelerators.

enroot runs ``<sysconfdir>/enroot/hooks.d/*.sh`` after it has set up the container's root and
before it starts the command (enroot's doc/configuration.md; NVIDIA's 98-nvidia.sh works so). A
hook adds fstab lines to ``$ENROOT_MOUNTS`` and ``NAME=value`` lines to ``$ENROOT_ENVIRON``; Pyxis
then copies the container's environment into the task's. This one, keyed on the job's allocation
as 98-nvidia.sh is keyed on NVIDIA_VISIBLE_DEVICES, adds:

- for a USB Edge TPU, the node's ``/dev/bus/usb`` directory (the stick's node changes when its
  firmware loads, and libusb opens the node sysfs names: the directory keeps the new one visible);
- for a PCIe Edge TPU, its ``/dev/apex_N`` node;
- the node's libedgetpu (the suite's patched build) over the image's, at
  ``/usr/lib/<multiarch>/libedgetpu.so.1``, where Coral's Debian package puts it;
- for a Hailo card, its ``/dev/hailoN`` (found from ``SLURM_TPU_HAILO_DEVICES``, its PCI address,
  through sysfs; the host's libhailort is not bound: the image brings the one matching the
  node's driver);
- ``EDGETPU_VISIBLE_DEVICES`` and the job's ``SLURM_TPU_*`` variables.

Isolation stays ownership: a rootless container opens a node with its user's own uid, and only
the job's nodes are the job user's (the Prolog chowns them); this hook gives nothing the user
could not bind himself. It runs as the job's user with the job's environment, which the user
controls: every variable is hostile. It reads the job's devices only from the environment file
the root Prolog wrote (``<state_dir>/jobs/<job>.env``, protocol/envfile.py, under the state
directory of the config install named: a regular file not writable by group or others, owned by
root, which shows as the overflow uid inside enroot's user namespace, and never by the caller;
opened without following links), keeps only paths of the forms the suite itself
writes (``jobenv.libedgetpu_path``; a PCIe node ``<dev>/apex_N`` that is a character device), and
takes its config, the node's libedgetpu and device root from what ``slurm-tpu install`` (or the
test cluster) wrote into the hook file, never from the environment. Bad input: one line on
stderr and a non-zero exit, which makes enroot refuse to start the container (fail closed).
"""

from __future__ import annotations

import os
import re
import stat
import sys

from ..defaults import CONFIG_PATH
from ..protocol import envfile, jobenv

TYPE_CHECKING = False  # annotations only: importing typing costs the hook milliseconds per container
if TYPE_CHECKING:
    from collections.abc import Mapping

# What ``slurm-tpu install`` writes into the installed hook (its ``_SETTINGS =`` line): the node's
# config, the node's libedgetpu ("" when none is installed) and where its device nodes are.
CONFIG, LIBEDGETPU, DEV, SYS = "config", "libedgetpu", "dev", "sys"
HAILO_DEVICES = "SLURM_TPU_HAILO_DEVICES"  # = families.hailo.DEVICES_VARIABLE (not imported: the hook stays small)
_PCI_ADDRESS = re.compile(r"[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]")
_HAILO = re.compile(r"hailo[0-9]{1,3}")
HOOK_NAME = "98-slurm-tpu.sh"  # enroot runs hooks.d/*.sh in name order; 98-nvidia.sh's neighbour
ENVIRON_NAMES = re.compile(r"(SLURM_TPU_[A-Z0-9_]+|EDGETPU_VISIBLE_DEVICES)")
_APEX = re.compile(r"apex_[0-9]{1,4}")


class HookError(Exception):
    """Input the hook refuses: its one line."""


def container_libedgetpu(multiarch: str | None = None) -> str:
    """Where the container's loader finds ``libedgetpu.so.1``: Coral's Debian package's path."""
    if multiarch is None:  # the interpreter's own triplet (sysconfig's MULTIARCH, without importing sysconfig)
        multiarch = getattr(sys.implementation, "_multiarch", "") or ""
    return os.path.join("/usr/lib", multiarch, "libedgetpu.so.1") if multiarch else "/usr/lib/libedgetpu.so.1"


def _root_uids() -> tuple[int, ...]:
    """The uids root's files show here: 0, and inside enroot's user namespace (where hooks run and
    root is not mapped) the kernel's overflow uid, unless that is the caller's own (a user's own
    files are the ones she could have written)."""
    try:
        with open("/proc/sys/kernel/overflowuid", encoding="ascii") as handle:
            overflow = int(handle.read())
    except (OSError, ValueError):
        overflow = 65534
    caller = os.getuid()
    return tuple(uid for uid in (0, overflow) if uid == 0 or uid != caller)


def read_job_env(state_dir: str, job: str) -> tuple[dict[str, str], list[str]]:
    """The job's exported variables and unset names from its root-written environment file
    (``no-devices.env`` for a job with no device here, or a job id that is not one)."""
    name = envfile.file_name(int(job)) if job.isdigit() and len(job) < 20 else None
    candidates = [os.path.join(state_dir, envfile.DIR, name)] if name else []
    candidates.append(os.path.join(state_dir, envfile.NO_DEVICES))
    for path in candidates:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
        except OSError:
            continue
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_uid not in _root_uids() or info.st_mode & 0o022:
                raise HookError(f"{path} is not a regular file written by root: refusing its devices")
            text = os.read(fd, 1 << 16).decode("utf-8", "replace")
        finally:
            os.close(fd)
        exported: dict[str, str] = {}
        unset: list[str] = []
        for line in text.splitlines():
            if not line.startswith(envfile.PRINTED):
                continue
            verb, _, rest = line.partition(" ")
            key, sep, value = rest.partition("=")
            if not ENVIRON_NAMES.fullmatch(key) or not value.isprintable():
                continue
            if verb == "export" and sep:
                exported[key] = value
            elif verb == "unset":
                unset.append(key)
        return exported, unset
    # No file at all (a node whose hooks never ran): the job has nothing here; the library sees none.
    return {jobenv.EDGETPU_VISIBLE: ""}, []


def hailo_nodes(addresses: str, dev: str, sys_root: str) -> list[str]:
    """The ``<dev>/hailoN`` node of each PCI address in ``addresses`` (the job's
    SLURM_TPU_HAILO_DEVICES): the ``hailo_chardev`` class device whose ``board_location`` names it
    (the only link on Raspberry Pi OS's driver, families/hailo.py). HookError for an address of
    another form, or one with no character device."""
    found = []
    for address in [a for a in addresses.split(",") if a]:
        if not _PCI_ADDRESS.fullmatch(address):
            raise HookError(f"{HAILO_DEVICES} entry {address!r} is not a PCI address")
        classes = os.path.join(sys_root, "class", "hailo_chardev")
        names = sorted(os.listdir(classes)) if os.path.isdir(classes) else []
        for name in names:
            try:
                with open(os.path.join(classes, name, "board_location"), encoding="ascii") as handle:
                    location = handle.read().strip()
            except (OSError, ValueError):
                continue
            if location == address and _HAILO.fullmatch(name):
                node = os.path.join(dev, name)
                try:
                    if stat.S_ISCHR(os.lstat(node).st_mode):
                        found.append(node)
                        break
                except OSError:
                    pass
        else:
            raise HookError(f"Hailo device {address}: no {dev}/hailoN node for it")
    return found


def plan(
    exported: Mapping[str, str], dev: str, library: str, multiarch: str | None = None, sys_root: str = "/sys"
) -> tuple[list[str], dict]:
    """(fstab lines for ``$ENROOT_MOUNTS``, variables for ``$ENROOT_ENVIRON``) for the job's
    devices in ``exported``. PCIe paths are the container's (``/dev/apex_N``); HookError for a
    device path that is not one the suite writes."""
    dev = os.path.normpath(dev)
    handles = jobenv.parse_environment(exported)
    mounts: list[str] = []
    renamed: dict[str, str] = {}
    usb = False
    for handle in handles:
        if handle.device_type == "usb":
            if (handle.device_type, handle.path) != jobenv.libedgetpu_path(handle.identity, None):
                raise HookError(f"{handle.identity}: {handle.path} is not its sysfs directory")
            usb = True
            continue
        directory, base = os.path.split(handle.path)
        if directory != dev or not _APEX.fullmatch(base):
            raise HookError(f"{handle.identity}: {handle.path} is not a {dev}/apex_N node")
        try:
            mode = os.lstat(handle.path).st_mode
        except OSError as exc:
            raise HookError(f"{handle.identity}: {handle.path}: {exc.strerror}") from None
        if not stat.S_ISCHR(mode):
            raise HookError(f"{handle.identity}: {handle.path} is not a character device")
        inside = "/dev/" + base
        renamed[handle.path] = inside
        mounts.append(f"{handle.path} {inside} none x-create=file,bind,nosuid,noexec,private")
    if usb:
        bus = os.path.join(dev, "bus", "usb")
        if os.path.isdir(bus) and not os.path.islink(bus):
            mounts.append(f"{bus} /dev/bus/usb none x-create=dir,rbind,nosuid,noexec,private")
    for node in hailo_nodes(exported.get(HAILO_DEVICES, ""), dev, sys_root):
        mounts.append(f"{node} /dev/{os.path.basename(node)} none x-create=file,bind,nosuid,noexec,private")
    if library:  # with or without a device: the image's own (Coral's ignores EDGETPU_VISIBLE_DEVICES) never runs
        mounts.append(f"{library} {container_libedgetpu(multiarch)} none x-create=file,bind,ro,nosuid,nodev,private")
    variables = dict(exported)
    for name in (jobenv.EDGETPU_VISIBLE, jobenv.EDGETPU_PATHS):
        if name in variables:
            variables[name] = ",".join(_rename(entry, renamed) for entry in variables[name].split(",") if entry)
    return mounts, variables


def _rename(entry: str, renamed: Mapping[str, str]) -> str:
    """A ``[type:]path`` entry with a host PCIe node replaced by the container's."""
    kind, sep, path = entry.rpartition(":")
    return f"{kind}{sep}{renamed.get(path, path)}"


def _append(path: str, lines: list[str]) -> None:
    """Append ``lines`` to enroot's file ``path`` (its own, never a link)."""
    if not lines:
        return
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.write(fd, ("\n".join(lines) + "\n").encode())
    finally:
        os.close(fd)


def rewrite_environ(path: str, variables: Mapping[str, str], unset: list[str]) -> None:
    """Replace enroot's environment file's lines for our variables (ones copied from the submitting
    shell included) by the job's; an unset variable is written empty (Pyxis imports the container's
    environment over the task's: a line it does not get would leave the shell's value)."""
    ours = {**dict.fromkeys(unset, ""), **variables}
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        chunks = []
        while True:
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                break
            chunks.append(chunk)
        kept = [
            line
            for line in b"".join(chunks).decode("utf-8", "replace").splitlines()
            if line.split("=", 1)[0] not in ours
        ]
        text = "\n".join([*kept, *(f"{name}={value}" for name, value in ours.items())]) + "\n"
        os.lseek(fd, 0, os.SEEK_SET)
        os.ftruncate(fd, 0)
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def run(settings: Mapping[str, str], environ: Mapping[str, str]) -> None:
    """The hook's work (HookError: its one line)."""
    from .settings import scan_state_dir

    for name in ("ENROOT_MOUNTS", "ENROOT_ENVIRON"):
        if not os.path.isabs(environ.get(name, "")):
            raise HookError(f"${name} is not set to an absolute path: not run by enroot?")
    config = settings.get(CONFIG) or CONFIG_PATH
    state_dir = scan_state_dir(config)
    exported, unset = read_job_env(state_dir, environ.get("SLURM_JOB_ID", ""))
    library = settings.get(LIBEDGETPU) or ""
    if library:
        library = os.path.realpath(library)
        if not os.path.isfile(library):
            library = ""  # none installed on this node: the image's own is what the job gets
    try:
        mounts, variables = plan(exported, settings.get(DEV) or "/dev", library, sys_root=settings.get(SYS) or "/sys")
    except ValueError as exc:
        raise HookError(str(exc)) from None
    _append(environ["ENROOT_MOUNTS"], mounts)
    rewrite_environ(environ["ENROOT_ENVIRON"], variables, unset)


def main(settings: Mapping[str, str], environ: Mapping[str, str] | None = None) -> int:
    """Entry point (enroot/98-slurm-tpu.sh): 0, or 1 with one line on stderr (enroot then stops)."""
    try:
        run(settings, os.environ if environ is None else environ)
    except (HookError, OSError) as exc:
        print(f"slurm-tpu enroot hook: {exc}", file=sys.stderr)
        return 1
    return 0
