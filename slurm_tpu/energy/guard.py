"""Device reads with a hard deadline, in a forked child: a hung or crashing vendor library costs the
figures, never the root hook that asked for them.

NVML's ``nvmlInit`` can hang (a GPU that fell off the bus, a driver mid-reload), a hwmon read can
block in its driver, and a crash in the vendor library would kill the Prolog or Epilog with it. So
the hooks make their device reads through :func:`call`: the reads run in a child process forked for
them, which sends its result back over a pipe (``marshal``: plain values, from our own process image)
and exits; a child that has not answered within the deadline is killed (SIGKILL) and reaped. Only
jobs with a device that needs NVML or hwmon pay the fork (about a millisecond); an Edge TPU's figure
is a model and never gets here.

The hooks are single-threaded (the node agent's workers too: hooks/agent.py keeps the sampler out
of the agent's process for that reason), so forking them is safe. The child closes every inherited
descriptor but the standard ones and its pipe: one stuck in the kernel, which even SIGKILL cannot end
at once, holds no lock file, socket or lease of the hook's.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

# The most the device reads of one hook may take (NVML's init on a GPU without persistence mode takes
# about a second); past it the reads are killed and those devices' figures are ``unavailable``.
READ_DEADLINE_S = 2.0
# After SIGKILL, how long the child is waited for (it ends at once unless stuck in the kernel).
REAP_S = 1.0
# The most a child may send back (a few lines per device).
MAX_ANSWER = 1 << 20


def call(read: Callable[[], object], what: str, deadline_s: float = READ_DEADLINE_S) -> tuple[object, str]:
    """``read()``'s value, from a child process given ``deadline_s`` seconds, and ''; or None and why
    not (one line naming ``what``): the child timed out (killed), crashed, or raised. Never raises."""
    import marshal
    import select
    import time

    try:
        rfd, wfd = os.pipe()
    except OSError as exc:
        return None, f"{what}: cannot make a pipe ({exc})"
    try:
        pid = os.fork()
    except OSError as exc:
        os.close(rfd)
        os.close(wfd)
        return None, f"{what}: cannot fork ({exc})"
    if pid == 0:  # the child: read, answer, exit (never back into the hook's code)
        code = 1
        try:
            os.close(rfd)
            # Nothing of the hook's stays open here (its lock file, the agent's sockets): see the module doc.
            os.closerange(3, wfd)
            os.closerange(wfd + 1, os.sysconf("SC_OPEN_MAX"))
            try:
                value: Any = read()  # plain values (marshal's): the reads' own contract
                answer = marshal.dumps((True, value))
            except Exception as exc:  # noqa: BLE001 - said to the parent, which decides
                answer = marshal.dumps((False, f"{type(exc).__name__}: {exc}"))
            view = memoryview(answer)
            while view:
                view = view[os.write(wfd, view) :]
            code = 0
        finally:
            os._exit(code)
    os.close(wfd)
    chunks: list[bytes] = []
    size = 0
    ended = False
    try:
        end = time.monotonic() + deadline_s
        while True:
            left = end - time.monotonic()
            if left <= 0 or not select.select([rfd], [], [], left)[0]:
                break  # the deadline: the child is killed below
            chunk = os.read(rfd, 65536)
            if not chunk:
                ended = True
                break
            size += len(chunk)
            if size > MAX_ANSWER:
                break
            chunks.append(chunk)
    except OSError as exc:  # select/read on our own pipe: not expected; the child goes below
        chunks, why = [], f"{what}: {exc}"
    else:
        why = ""
    finally:
        os.close(rfd)
    if not ended:
        _kill(pid)
        return None, why or f"{what} did not answer within {deadline_s:g} s: killed"
    status = _reap(pid, REAP_S + deadline_s)
    if status is not None and os.WIFSIGNALED(status):
        return None, f"{what} crashed (signal {os.WTERMSIG(status)})"
    try:
        done, value = marshal.loads(b"".join(chunks))
    except (EOFError, ValueError, TypeError):
        return None, f"{what} ended without an answer (exit status {_exit_code(status)})"
    if not done:
        return None, f"{what} failed: {' '.join(str(value).split())[:300]}"
    return value, ""


def _exit_code(status: int | None) -> str:
    return "unknown" if status is None or not os.WIFEXITED(status) else str(os.WEXITSTATUS(status))


def _kill(pid: int) -> None:
    """SIGKILL the child and reap it, waiting at most :data:`REAP_S` (a child stuck in the kernel is left
    to end on its own: init reaps it once the hook's process is gone)."""
    try:
        os.kill(pid, 9)
    except ProcessLookupError:
        pass
    _reap(pid, REAP_S)


def _reap(pid: int, wait_s: float) -> int | None:
    """The child's wait status, waiting at most ``wait_s``; None if it has not ended (or was reaped elsewhere)."""
    import select

    try:
        watch = os.pidfd_open(pid)
    except (AttributeError, OSError):
        watch = None
    try:
        if watch is not None:
            select.select([watch], [], [], wait_s)
            done, status = os.waitpid(pid, os.WNOHANG)
            return status if done == pid else None
        import time  # a kernel without pidfd (before 5.3): look a few times

        end = time.monotonic() + wait_s
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done == pid or time.monotonic() >= end:
                return status if done == pid else None
            time.sleep(0.01)
    except ChildProcessError:
        return None
    finally:
        if watch is not None:
            os.close(watch)
