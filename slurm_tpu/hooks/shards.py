"""A job's shares of the node's shared Edge TPUs at its Prolog and Epilog: its grant and the broker.

Imported only on a node whose config shares devices (``HookSettings.shards``), or by an Epilog that
finds a grant left from such a config. The Prolog writes ``<state_dir>/broker/grants/<job>``
(protocol/broker_wire.py: the truth of who holds how many shares here) and then asks the broker
(root, ``python -m slurm_tpu.broker``) over ``control.sock`` to ``open`` the job's endpoint; the
Epilog asks it to ``close`` it, takes the job's figures from the answer (or, the broker down, from
the last ``stats/<job>`` the broker wrote), and removes the grant.

The broker is never trusted to be there: each question is bounded (:data:`ASK_S`), and a broker
that is down or does not answer costs one line (on the hook's stderr, and a ``broker-unavailable``
record in the audit log: slurmd logs a successful hook's output only at debug2), never the job or
the node (a broker that starts later opens an endpoint for every grant it finds). The figures come from the
broker (root), never from anything the job wrote.
"""

from __future__ import annotations

import os

from ..access import statedir
from ..protocol import broker_wire

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

    from ..access.ledger import Ledger
    from ..slurm.jobdetail import GresAlloc

ASK_S = 2.0  # connect + answer, per question: a Prolog never waits longer for the broker
MAX_STATS_BYTES = 64 << 10


class BrokerUnavailable(Exception):
    """The broker did not answer (down, stuck, or refused): the message says what happened."""


def shares_of(allocs: Sequence[GresAlloc], gres_name: str) -> int:
    """How many shares of this node the job holds: its ``gres_name`` count here (0: none)."""
    count = sum(alloc.count for alloc in allocs if alloc.name == gres_name)
    return min(count, broker_wire.MAX_SHARES)


def _open_dirs(ledger: Ledger, name: str, create: bool) -> int:
    """``broker/<name>`` under the state directory as a directory fd (root's, never through a link);
    ``create`` makes ``broker`` (0755) and ``<name>`` (0700) when missing. StateDirError otherwise."""
    broker = statedir.open_dir(broker_wire.BROKER_DIR, create=create, parent_fd=ledger.dir_fd)
    try:  # who holds shares here, and their figures, are root's business
        return statedir.open_dir(name, create, broker, mode=0o700)
    finally:
        os.close(broker)


def write_grant(ledger: Ledger, job_id: int, uid: int, gid: int, shares: int) -> None:
    """Write the job's grant file atomically (0600); OSError or StateDirError when the state filesystem fails."""
    fd = _open_dirs(ledger, broker_wire.GRANTS, create=True)
    try:
        statedir.write_atomic(fd, str(job_id), broker_wire.encode_grant(job_id, uid, gid, shares), mode=0o600)
    finally:
        os.close(fd)


def read_grant(ledger: Ledger, job_id: int) -> tuple[int, int, int, int] | None:
    """(job_id, uid, gid, shares) of the job's grant here, or None when it has none (or it is unreadable)."""
    from ..protocol import FormatError

    try:
        fd = _open_dirs(ledger, broker_wire.GRANTS, create=False)
    except statedir.StateDirError:
        return None
    try:
        raw = statedir.read_file(fd, str(job_id), limit=4096)
        return None if raw is None else broker_wire.decode_grant(raw, f"grant of job {job_id}")
    except (statedir.StateDirError, FormatError):
        return None
    finally:
        os.close(fd)


def _remove(ledger: Ledger, directory: str, job_id: int) -> None:
    """Remove the job's file in the broker's ``directory`` (a second run changes nothing)."""
    try:
        fd = _open_dirs(ledger, directory, create=False)
    except statedir.StateDirError:
        return
    try:
        statedir.remove(fd, str(job_id))
    finally:
        os.close(fd)


def remove_grant(ledger: Ledger, job_id: int) -> None:
    """Remove the job's grant (a second run changes nothing)."""
    _remove(ledger, broker_wire.GRANTS, job_id)


def ask(state_dir: str, request: dict, timeout: float = ASK_S) -> dict:
    """The broker's answer to one control ``request`` (``{"ok": true, ...}``) within ``timeout``
    seconds in all; BrokerUnavailable saying why otherwise (no socket, refused, silent, garbled,
    or an answer with ``"ok": false``)."""
    import socket
    import time

    from ..protocol import FormatError

    path = broker_wire.control_path(state_dir)
    deadline = time.monotonic() + timeout

    def left() -> float:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise TimeoutError
        return remaining

    def receive(sock: socket.socket, size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            sock.settimeout(left())
            chunk = sock.recv(size - len(data))
            if not chunk:
                raise BrokerUnavailable("the broker closed the connection before it answered")
            data += chunk
        return bytes(data)

    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.settimeout(left())
        sock.connect(path)
        sock.settimeout(left())
        sock.sendall(broker_wire.encode_frame(request))
        header_len, _ = broker_wire.parse_head(receive(sock, broker_wire.HEAD.size), max_payload=0)
        answer = broker_wire.parse_header(receive(sock, header_len))
    except TimeoutError:
        raise BrokerUnavailable(f"no answer from {path} within {timeout:g} s") from None
    except (FileNotFoundError, ConnectionRefusedError):
        raise BrokerUnavailable(f"nothing listens on {path}") from None
    except OSError as exc:
        raise BrokerUnavailable(f"cannot reach {path}: {exc.strerror or exc}") from None
    except FormatError as exc:
        raise BrokerUnavailable(f"the broker's answer is garbled ({exc})") from None
    finally:
        sock.close()
    if answer.get("ok") is not True:
        error = answer.get("error")
        raise BrokerUnavailable(f"the broker refused: {error if isinstance(error, str) else 'no reason given'}")
    return answer


def read_stats(ledger: Ledger, job_id: int) -> dict[str, float] | None:
    """The job's figures as the broker last wrote them (``stats/<job>``), or None when there is no such file."""
    from ..protocol import FormatError, json_object

    try:
        fd = _open_dirs(ledger, broker_wire.STATS, create=False)
    except statedir.StateDirError:
        return None
    try:
        raw = statedir.read_file(fd, str(job_id), limit=MAX_STATS_BYTES)
        if raw is None:
            return None
        source = f"stats of job {job_id}"
        data = json_object(raw, source)
        return broker_wire.decode_figures(
            data.get("stats", data), source
        )  # the file holds the figures, or a close answer's shape
    except (statedir.StateDirError, FormatError):
        return None
    finally:
        os.close(fd)


def remove_stats(ledger: Ledger, job_id: int) -> None:
    """Remove the job's stats file once the Epilog took its figures (from it or from the broker's answer)."""
    _remove(ledger, broker_wire.STATS, job_id)


def open_job(ledger: Ledger, job_id: int, uid: int, gid: int, shares: int) -> str | None:
    """The Prolog's part: the grant, then the broker's ``open``. None when the broker opened the job's
    endpoint; else the one line to say (the job still starts; the node serves on).
    OSError or StateDirError: the grant could not be written (a broken state filesystem)."""
    from ..protocol.audit import BROKER_UNAVAILABLE

    write_grant(ledger, job_id, uid, gid, shares)
    try:
        ask(ledger.state_dir, {"op": "open", "job": job_id})
    except BrokerUnavailable as exc:
        # slurmd drops a successful Prolog's output (debug2): the audit log keeps the node's trail of it.
        ledger.audit(BROKER_UNAVAILABLE, job_id=job_id, uid=uid, reason=f"open: {exc}")
        return (
            f"job {job_id}: its {shares} TPU share(s) are granted, but the node's TPU broker did not open its "
            f"endpoint ({exc}); the job runs, its clients cannot reach the broker until it runs: "
            "systemctl restart slurm-tpu-broker (slurm-tpu doctor checks it)"
        )
    return None


def close_job(ledger: Ledger, job_id: int) -> tuple[dict[str, float] | None, str | None]:
    """The Epilog's part: the broker's ``close`` (its figures of the job), else the job's last stats file;
    then the grant goes. (figures or None, the line to say or None)."""
    from ..protocol import FormatError
    from ..protocol.audit import BROKER_UNAVAILABLE

    figures, notice = None, None
    try:
        answer = ask(ledger.state_dir, {"op": "close", "job": job_id})
        figures = broker_wire.decode_figures(answer.get("stats"), f"the broker's close answer for job {job_id}")
        # The broker leaves its final figures in stats/<job> too (for an Epilog whose answer was lost);
        # taken from the answer, the file has served: it goes with the job.
        remove_stats(ledger, job_id)
    except (BrokerUnavailable, FormatError) as exc:
        figures = read_stats(ledger, job_id)
        remove_stats(ledger, job_id)
        grant = read_grant(ledger, job_id)
        ledger.audit(BROKER_UNAVAILABLE, job_id=job_id, uid=grant[1] if grant else None, reason=f"close: {exc}")
        taken = "its last figures the broker wrote" if figures is not None else "no figures"
        notice = (
            f"job {job_id}: the node's TPU broker did not close its endpoint ({exc}); accounted with {taken}: "
            "systemctl restart slurm-tpu-broker (it forgets jobs whose grant is gone)"
        )
    remove_grant(ledger, job_id)
    return figures, notice
