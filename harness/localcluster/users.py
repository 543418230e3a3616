"""Real unix users for local clusters' jobs (the test suite's ``users`` fixture, the scale benchmark).

Jobs must run as real, distinct users: the hooks hand devices to the job's uid
and a hostile user is another uid. A user that already exists is used as it is
and left in place; only the users made here are removed afterwards, and only by the
last process still using them: two test sessions at once (a developer's and a
helper's) share the users, and the one that ends first must not delete them under
the other's jobs. Two lock files in /run say who is in (see :func:`real_users`).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
from collections.abc import Iterator, Sequence


def uid_of(name: str) -> int | None:
    """The user's uid, None when there is no such user."""
    done = subprocess.run(["id", "-u", name], capture_output=True, text=True, check=False)
    return int(done.stdout) if done.returncode == 0 else None


def ensure(names: Sequence[str]) -> tuple[dict[str, int], list[str]]:
    """Create the users that do not exist yet (no home, /bin/sh, a group of their own).

    Returns name -> uid for all of them, and the names that were made here.
    """
    made = []
    for name in names:
        if uid_of(name) is None:
            subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", "--user-group", name], check=True)
            made.append(name)
    uids = {}
    for name in names:
        uid = uid_of(name)
        if uid is None:
            raise RuntimeError(f"user {name} vanished right after it was made (another process removed it)")
        uids[name] = uid
    return uids, made


def remove(names: Sequence[str]) -> None:
    """Remove users made by :func:`ensure` (errors ignored: one may be gone already)."""
    for name in names:
        subprocess.run(["userdel", name], capture_output=True, check=False)


# MUTEX (exclusive while a process makes, registers or removes users) holds the names
# made so far; PRESENCE is held shared by every process using them.
MUTEX = "/run/slurm-tpu-test-users.lock"
PRESENCE = "/run/slurm-tpu-test-users.presence"


def _open_lock(path: str) -> int:
    return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)


@contextlib.contextmanager
def real_users(names: Sequence[str]) -> Iterator[dict[str, int]]:
    """The users, for the block's duration (name -> uid).

    Those made here (by any process using this) are removed when the last such
    process leaves the block.
    """
    mutex, presence = _open_lock(MUTEX), _open_lock(PRESENCE)
    try:
        fcntl.flock(mutex, fcntl.LOCK_EX)
        try:
            fcntl.flock(presence, fcntl.LOCK_SH)
            uids, made = ensure(names)
            if made:
                os.lseek(mutex, 0, os.SEEK_END)
                os.write(mutex, "".join(f"{name}\n" for name in made).encode())
        finally:
            fcntl.flock(mutex, fcntl.LOCK_UN)
        yield uids
    finally:
        fcntl.flock(mutex, fcntl.LOCK_EX)
        fcntl.flock(presence, fcntl.LOCK_UN)
        try:
            fcntl.flock(presence, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            pass  # another process still uses them: the last one out removes them
        else:
            registered = os.pread(mutex, 1 << 16, 0).decode().split()
            remove(sorted(set(registered)))
            os.ftruncate(mutex, 0)
        os.close(presence)
        os.close(mutex)
