"""Changing who owns an accelerator's device node, safely.

Only character device nodes are touched, never through a symlink: the node is opened
``O_PATH | O_NOFOLLOW`` (neither opens the device nor follows a link), checked with
``fstat`` and changed through ``/proc/self/fd/N``, so the file checked is the file changed.

Every ownership change also strips the node's extended POSIX ACL: chmod only rewrites an
ACL's mask entry (fs/posix_acl.c ``posix_acl_chmod``), so a job owner's ``setfacl -m
u:OTHER:rw`` would outlive her lease and live again under any mode with group bits. Only
the owner (or root) can set an ACL, so stripping it whenever the owner changes leaves none.

Who should own a node is decided in one place, :func:`owner_for`, from its device's lease.
"""

from __future__ import annotations

import errno
import os
import stat

from ..errors import DeviceError
from ..protocol.leases import HELD, Lease

TYPE_CHECKING = False
if TYPE_CHECKING:
    from ..protocol.hooks_snapshot import HookSnapshot
    from ..protocol.leases import BadLease

_O_PATH = getattr(os, "O_PATH", 0o10000000)
# The xattrs that hold POSIX ACLs (include/uapi/linux/xattr.h XATTR_NAME_POSIX_ACL_*);
# a default ACL exists only on directories, which new files under them inherit.
ACL_XATTRS = ("system.posix_acl_access", "system.posix_acl_default")


def acl_xattrs(path: str) -> list[str]:
    """The POSIX ACL xattrs ``path`` carries (followed if a link: give it a /proc/self/fd path)."""
    try:
        return [name for name in os.listxattr(path) if name in ACL_XATTRS]
    except OSError as exc:
        if exc.errno in (errno.ENOTSUP, errno.ENODATA):
            return []  # a filesystem without xattrs has no ACLs
        raise


def strip_acl(path: str) -> bool:
    """Remove ``path``'s extended POSIX ACLs (access and default); True when one was there.
    ``path`` is followed: pass a ``/proc/self/fd/N`` of a node opened ``O_PATH |
    O_NOFOLLOW`` (or a name only root controls), never a name a user could swap."""
    names = acl_xattrs(path)
    for name in names:
        try:
            os.removexattr(path, name)
        except OSError as exc:
            if exc.errno != errno.ENODATA:  # gone meanwhile: what we wanted
                raise
    return bool(names)


# Nobody but root may open the node: a device being taken from a job, or kept out of use.
ROOT_ONLY = (0, 0, 0o600)


def owner_for(lease: Lease | BadLease | None, settings: HookSnapshot) -> tuple[int, int, int]:
    """(uid, gid, mode) for a device's nodes while ``lease`` is its lease (-1: keep that id).

    No lease: the idle owner, group and mode. A lease its job holds: the job's user with the
    lease mode, the group kept. Any other (kept, being revoked, unreadable): root only, so
    neither the job that had it nor the next one can open it.
    """
    if lease is None:
        return settings.idle_uid, settings.idle_gid, settings.idle_mode
    if isinstance(lease, Lease) and lease.phase == HELD:
        return lease.uid, -1, settings.lease_mode
    return ROOT_ONLY


class NodeState:
    """A device node's current owner and mode (for tests and `leases`)."""

    __slots__ = ("path", "uid", "gid", "mode", "rdev")

    def __init__(self, path: str, uid: int, gid: int, mode: int, rdev: int):
        self.path, self.uid, self.gid, self.mode, self.rdev = path, uid, gid, mode, rdev


def _open_char_device(path: str, identity: str) -> int:
    if not os.path.isabs(path):
        raise DeviceError(
            f"{identity}: device node '{path}' is not an absolute path; "
            "fix the inventory (slurm-tpu gres-conf --output)",
            identity,
        )
    try:
        fd = os.open(path, _O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        raise DeviceError(
            f"{identity}: device node {path} is missing (device unplugged or re-enumerated?)", identity
        ) from None
    except OSError as exc:
        raise DeviceError(f"{identity}: cannot open device node {path}: {exc.strerror}", identity) from exc
    info = os.fstat(fd)
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISCHR(info.st_mode):
        os.close(fd)
        raise DeviceError(
            f"{identity}: {path} is not a character device node; refusing to change "
            "its ownership (check the inventory file)",
            identity,
        )
    return fd


def set_owner(path: str, identity: str, uid: int, gid: int, mode: int) -> bool:
    """Make ``path`` (a char device) ``uid:gid`` with ``mode`` and no extended ACL; -1 keeps uid/gid.
    True when something changed; DeviceError when the node is missing or not a character device."""
    fd = _open_char_device(path, identity)
    try:
        info = os.fstat(fd)
        target_uid = info.st_uid if uid < 0 else uid
        target_gid = info.st_gid if gid < 0 else gid
        proc = f"/proc/self/fd/{fd}"  # the magic link is the opened node itself, not a path lookup
        current = (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode))
        if current == (target_uid, target_gid, mode) and not acl_xattrs(proc):
            return False
        # Narrow the mode and drop any ACL before handing the node to the new owner,
        # so no moment exists where the new owner has it with the old (maybe wider)
        # mode, or where an ACL the old owner set applies under the new one.
        os.chmod(proc, mode & stat.S_IMODE(info.st_mode))
        strip_acl(proc)
        os.chown(proc, target_uid, target_gid)
        os.chmod(proc, mode)
        return True
    except OSError as exc:
        raise DeviceError(
            f"{identity}: cannot change ownership of {path}: {exc.strerror} (the hooks must run as root)", identity
        ) from exc
    finally:
        os.close(fd)


def node_state(path: str) -> NodeState | None:
    """The node's owner/mode, or None when missing or not a char device."""
    try:
        info = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISCHR(info.st_mode):
        return None
    return NodeState(path, info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode), info.st_rdev)


def resolve_ids(owner: str, group: str) -> tuple[int, int]:
    """Numeric uid/gid for the idle owner and group (names or numbers)."""
    import grp
    import pwd

    uid = int(owner) if owner.isdigit() else pwd.getpwnam(owner).pw_uid
    gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
    return uid, gid
