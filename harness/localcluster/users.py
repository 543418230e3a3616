"""Real unix users for local clusters' jobs (the test suite's ``users`` fixture, the scale benchmark).

Jobs must run as real, distinct users: the hooks hand devices to the job's uid
and a hostile user is another uid. A user that already exists is used as it is
and left in place; only the users made here are removed afterwards.
"""

from __future__ import annotations

import contextlib
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


@contextlib.contextmanager
def real_users(names: Sequence[str]) -> Iterator[dict[str, int]]:
    """The users, for the block's duration (name -> uid); those made here are removed afterwards."""
    uids, made = ensure(names)
    try:
        yield uids
    finally:
        remove(made)
