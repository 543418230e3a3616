"""Building the hooks' thin client of the node agent (prolog/slurm-tpu-hook-client.c) with the system cc.

The client is C so that a hook starts no interpreter (see slurm_tpu/hooks/agent.py).
It is built next to the hooks whose native entries it is (``<dir>/slurm-tpu-hook-client``): by
scripts/setup.sh for a checkout, by LocalCluster before it starts a cluster (both through
slurm_tpu/ops/hook_client.py, which knows where the shipped source is), and by the
agent itself when it starts from a hooks directory that has the source but no current
client (``slurm-tpu install`` installs the source and a client built from it there; see
:func:`build_beside`). Without a C compiler nothing is built
and slurm.conf names the Python hooks (and the sh task prolog). Not on the hooks' fast path:
only the agent imports this, once, at its start.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

SOURCE = "slurm-tpu-hook-client.c"
PROGRAM = "slurm-tpu-hook-client"
# The hooks the client also is, without an interpreter, under the hook's name and this suffix (its
# "native entries", hard links to it beside the hook: the client's source says what each does).
NATIVE_SUFFIX = "-native"
NATIVE_HOOKS = ("slurm-tpu-prolog", "slurm-tpu-epilog", "slurm-tpu-task-prolog")


def compiler() -> str | None:
    """The system C compiler (``$CC``, cc, gcc), or None."""
    for name in (os.environ.get("CC") or "", "cc", "gcc"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def build(directory: str | None, source: str) -> str | None:
    """Build the client into ``directory`` (None: beside its source) from ``source`` unless it is current.

    Returns its path, or None when there is no compiler or the build failed (said
    on stderr): the hooks then run the Python hooks. Written to a temp file and
    renamed, so several clusters starting at once never run a half-written program.
    """
    target = os.path.join(directory or os.path.dirname(source), PROGRAM)
    try:
        if os.stat(target).st_mtime_ns >= os.stat(source).st_mtime_ns:
            return target
    except FileNotFoundError:
        pass
    cc = compiler()
    if cc is None:
        return None
    temporary = f"{target}.{os.getpid()}.tmp"
    # Static where the C library allows it (Debian's libc6-dev ships libc.a): no dynamic loader
    # at each start, about 0.3 ms less per hook than the same program linked dynamically.
    for flags in (["-static"], []):
        done = subprocess.run(
            [cc, "-O2", "-Wall", *flags, "-o", temporary, source], capture_output=True, text=True, check=False
        )
        if done.returncode == 0:
            break
    if done.returncode != 0:
        sys.stderr.write(
            f"slurm-tpu: cannot build {PROGRAM} ({done.stderr.strip()[:500]}); the hooks run the Python hooks\n"
        )
        try:
            os.unlink(temporary)
        except FileNotFoundError:
            pass
        return None
    os.chmod(temporary, 0o755)
    os.replace(temporary, target)
    return target


def native_entry(hook: str) -> str:
    """The path of the native entry of the hook at ``hook`` (beside it, see :data:`NATIVE_SUFFIX`)."""
    return hook + NATIVE_SUFFIX


def link_native_entries(client: str, hooks: list[str]) -> list[str]:
    """Make each hook's native entry a hard link to the built ``client``; their paths.

    Done by a temp link and a rename, so a hook starting meanwhile runs the old program or the
    new one, whole; a link that already is the client is left alone. The hooks' directories
    must be on the client's file system (a checkout's prolog/ and epilog/, an install's one
    directory)."""
    client_inode = os.stat(client).st_ino
    made = []
    for hook in hooks:
        entry = native_entry(hook)
        try:
            current = os.stat(entry, follow_symlinks=False).st_ino == client_inode
        except FileNotFoundError:
            current = False
        if not current:
            temporary = f"{entry}.{os.getpid()}.tmp"
            os.link(client, temporary)
            os.replace(temporary, entry)
        made.append(entry)
    return made


def build_beside(entry_script: str) -> str | None:
    """Build the client beside its source in the agent's hooks directory (the entry script's own, or
    the ``prolog/`` beside it), if that is a root-owned directory nobody else may write (an installed one,
    or a checkout's prolog/); None otherwise or without a compiler. Installed, ``slurm-tpu install`` has
    built it already (then this finds it current)."""
    import stat

    directory = os.path.dirname(os.path.realpath(entry_script))
    if not os.path.isfile(os.path.join(directory, SOURCE)):
        # As shipped (a checkout, or the wheel's node_files) the agent is in systemd/, and the client's
        # source and the hooks that run the client in prolog/ beside it; installed, all share one directory.
        directory = os.path.realpath(os.path.join(os.path.dirname(directory), "prolog"))
    source = os.path.join(directory, SOURCE)
    try:
        info = os.stat(directory)
    except OSError:
        return None
    if info.st_uid != 0 or info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or not os.path.isfile(source):
        return None
    return build(directory, source)
