"""The hooks' C client (``hook_client/slurm-tpu-hook-client.c``): built with the system cc, and its native entries.

The client is C so that a hook starts no interpreter (see slurm_tpu/hooks/agent.py). It is built
beside its shipped source (``python -m slurm_tpu.ops.hook_client``: scripts/setup.sh, LocalCluster),
with the native entries (hard links to it) beside the shipped hooks; ``slurm-tpu install`` installs
the bytes (:func:`compiled`). Without a C compiler slurm.conf names the hooks themselves.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys

from .node_files import node_file

SOURCE = "slurm-tpu-hook-client.c"
PROGRAM = "slurm-tpu-hook-client"
# The hooks the client also is, without an interpreter, under the hook's name and this suffix (its
# "native entries", hard links to it beside the hook: the client's source says what each does).
NATIVE_SUFFIX = "-native"
# Each hook that has a native entry, and where it is shipped (NODE_DIRS' prolog/ and epilog/).
HOOK_DIRS = {"slurm-tpu-prolog": "prolog", "slurm-tpu-epilog": "epilog", "slurm-tpu-task-prolog": "prolog"}
NATIVE_HOOKS = tuple(HOOK_DIRS)


def compiler() -> str | None:
    """The system C compiler (``$CC``, cc, gcc), or None."""
    found = (shutil.which(name) for name in (os.environ.get("CC"), "cc", "gcc") if name)
    return next((path for path in found if path), None)


def build(directory: str | None = None) -> str | None:
    """Build the client from its shipped source into ``directory`` (None: beside the source) unless it
    is current; its path, or None (no compiler, or the build failed, said on stderr).

    Written to a temp file and renamed: several clusters starting at once never run half a program.
    """
    source = node_file("hook_client", SOURCE)
    target = os.path.join(directory or os.path.dirname(source), PROGRAM)
    with contextlib.suppress(FileNotFoundError):
        if os.stat(target).st_mtime_ns >= os.stat(source).st_mtime_ns:
            return target
    cc = compiler()
    if cc is None:
        return None
    temporary = f"{target}.{os.getpid()}.tmp"
    # Static where the C library allows it (Debian's libc6-dev ships libc.a): no dynamic loader
    # at each start, about 0.3 ms less per hook than the same program linked dynamically.
    for flags in (["-static"], []):
        done = subprocess.run([cc, "-O2", "-Wall", *flags, "-o", temporary, source], capture_output=True, text=True)
        if done.returncode == 0:
            os.chmod(temporary, 0o755)
            os.replace(temporary, target)
            return target
    sys.stderr.write(
        f"slurm-tpu: cannot build {PROGRAM} ({done.stderr.strip()[:500]}); the hooks run the Python hooks\n"
    )
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temporary)
    return None


def native_entry(hook: str) -> str:
    """The path of the native entry of the hook at ``hook`` (beside it, see :data:`NATIVE_SUFFIX`)."""
    return hook + NATIVE_SUFFIX


def link_native_entries(client: str, hooks: list[str]) -> list[str]:
    """Make each hook's native entry a hard link to the built ``client`` (on the same file system);
    their paths. A temp link renamed over it: a hook starting meanwhile runs the old or the new one."""
    client_inode = os.stat(client).st_ino
    made = []
    for hook in hooks:
        entry = native_entry(hook)
        current = False
        with contextlib.suppress(FileNotFoundError):
            current = os.stat(entry, follow_symlinks=False).st_ino == client_inode
        if not current:
            temporary = f"{entry}.{os.getpid()}.tmp"
            os.link(client, temporary)
            os.replace(temporary, entry)
        made.append(entry)
    return made


def shipped_hook(name: str) -> str:
    """The shipped hook ``name`` (one of NATIVE_HOOKS)."""
    return node_file(HOOK_DIRS[name], name)


def build_native() -> dict[str, str]:
    """Build the client beside its shipped source, and each shipped hook's native entry beside the
    hook; {hook name: native entry}, {} when the client cannot be built (the hooks then run themselves)."""
    client = build()
    if client is None:
        return {}
    return dict(zip(NATIVE_HOOKS, link_native_entries(client, [shipped_hook(name) for name in NATIVE_HOOKS])))


def compiled() -> bytes | None:
    """The client built from the shipped source, as bytes (``slurm-tpu install`` installs and
    records it, so ``uninstall`` removes it); None without a compiler or when the build failed."""
    import pathlib
    import tempfile

    with tempfile.TemporaryDirectory(prefix="slurm-tpu-hook-client-") as directory:
        path = build(directory)
        return None if path is None else pathlib.Path(path).read_bytes()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        path = build(sys.argv[1])
    else:  # the shipped client, and the shipped hooks' native entries
        path = build()
        entries = build_native() if path else {}
        print("\n".join(entries.values()))
    print(path or "not built")
    sys.exit(0 if path else 1)
