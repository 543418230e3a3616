"""Safe file operations inside the root-owned state directory (/run/slurm-tpu).

Everything works relative to an open directory descriptor with ``O_NOFOLLOW``: a planted
symlink is refused, never followed. Writes are atomic (temp file + rename, or + ``link()``
for an exclusive create): a crash leaves the old or the new file, never half of one.
"""

from __future__ import annotations

import errno
import os
import stat

from ..errors import SlurmTpuError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class StateDirError(SlurmTpuError):
    """The state directory (or a file in it) is unsafe or unreadable."""

    def __init__(self, message: str, path: str):
        super().__init__(message)
        self.path = path


def _check_dir(fd: int, path: str) -> None:
    info = os.fstat(fd)
    if not stat.S_ISDIR(info.st_mode):
        raise StateDirError(f"{path} is not a directory; remove it (slurm-tpu recreates it)", path)
    # Only root may write here: anyone else could plant leases or links.
    if info.st_uid != 0 or info.st_mode & 0o022:
        raise StateDirError(
            f"{path} must be owned by root and not group/world-writable "
            f"(uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):04o}); "
            "fix its ownership or remove it",
            path,
        )


def open_dir(path: str, create: bool = False, parent_fd: int | None = None, mode: int | None = None) -> int:
    """Open a directory (a descriptor the caller closes) without following a symlink at its last
    component, relative to ``parent_fd`` if given; ``create`` makes it (0755) when missing.
    ``mode``: the directory's permission bits, made so (never wider on the way) when it is
    created, and set on an existing one with other bits when ``create``; without ``create`` one
    with other bits is refused (a root-only directory others could read is not used).
    Raises :class:`StateDirError` for symlinks, files, unsafe owners or (``mode``) other bits."""
    for attempt in range(2):
        try:
            fd = os.open(path, _DIR_FLAGS, dir_fd=parent_fd)
            break
        except FileNotFoundError:
            if not create or attempt:
                raise StateDirError(f"{path} does not exist", path) from None
            try:
                if parent_fd is None:
                    os.makedirs(path, mode=0o755 if mode is None else mode, exist_ok=True)
                else:
                    os.mkdir(path, mode=0o755 if mode is None else mode, dir_fd=parent_fd)
            except FileExistsError:
                pass
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise StateDirError(
                    f"{path} is a symlink or not a directory; refusing to use it (remove it, slurm-tpu recreates it)",
                    path,
                ) from exc
            raise StateDirError(f"cannot open {path}: {exc.strerror}", path) from exc
    try:
        _check_dir(fd, path)
        if mode is not None and (found := os.fstat(fd).st_mode & 0o777) != mode:
            if not create:
                raise StateDirError(f"{path} is mode {found:04o}, not {mode:04o}", path)
            os.fchmod(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def check_name(name: str) -> str:
    """``name`` if it is a plain file name (no '/', not '.' or '..'), else StateDirError."""
    if not name or "/" in name or "\0" in name or name in (".", ".."):
        raise StateDirError(f"'{name}' is not a plain file name in the state directory", name)
    return name


def read_file(dir_fd: int, name: str, limit: int = 1 << 20, owner: int | None = None) -> bytes | None:
    """A regular file's bytes, or None when it does not exist. Symlinks are refused, and with ``owner``
    a file of any other uid."""
    check_name(name)
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise StateDirError(f"{name} in the state directory is a symlink; refusing to read it", name) from exc
        raise StateDirError(f"cannot read {name} in the state directory: {exc.strerror}", name) from exc
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise StateDirError(f"{name} in the state directory is not a regular file", name)
        if owner is not None and info.st_uid != owner:
            raise StateDirError(f"{name} in the state directory belongs to uid {info.st_uid}, not {owner}", name)
        data = bytearray()
        while chunk := os.read(fd, 65536):
            data += chunk
            if len(data) > limit:
                raise StateDirError(f"{name} in the state directory is larger than {limit} bytes", name)
        return bytes(data)
    finally:
        os.close(fd)


def _write_temp(dir_fd: int, name: str, data: bytes, mode: int) -> str:
    tmp = f".{check_name(name)}.{os.getpid()}.tmp"
    try:
        os.unlink(tmp, dir_fd=dir_fd)  # left by an earlier process with our pid
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode, dir_fd=dir_fd)
    try:
        os.fchmod(fd, mode)  # umask must not narrow what readers (task-prolog) need
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    except BaseException:
        os.close(fd)
        os.unlink(tmp, dir_fd=dir_fd)
        raise
    os.close(fd)
    return tmp


def write_atomic(dir_fd: int, name: str, data: bytes, mode: int = 0o644) -> None:
    """Replace ``name`` with ``data`` atomically (rename never follows a link at ``name``)."""
    tmp = _write_temp(dir_fd, name, data, mode)
    try:
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        os.unlink(tmp, dir_fd=dir_fd)
        raise


def create_exclusive(dir_fd: int, name: str, data: bytes, mode: int = 0o644) -> bool:
    """Create ``name`` holding ``data`` only if nothing (not even a symlink) is there; False when
    something is. The content is complete before the name appears (``link()`` of a temp file)."""
    tmp = _write_temp(dir_fd, name, data, mode)
    try:
        os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp, dir_fd=dir_fd)


def remove(dir_fd: int, name: str) -> bool:
    """Unlink ``name`` (a link itself, never its target); False if it was gone."""
    check_name(name)
    try:
        os.unlink(name, dir_fd=dir_fd)
        return True
    except FileNotFoundError:
        return False


def append_line(dir_fd: int, name: str, line: bytes, mode: int = 0o644) -> None:
    """Append one line with a single O_APPEND write (atomic between writers)."""
    check_name(name)
    fd = os.open(
        name, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK, mode, dir_fd=dir_fd
    )
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise StateDirError(f"{name} in the state directory is not a regular file", name)
        os.write(fd, line)
    finally:
        os.close(fd)
