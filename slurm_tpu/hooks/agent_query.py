"""The agent's Slurm query: one resident ``scontrol -d`` per node instead of one per job.

Run per job, ``scontrol show job -d`` loads libslurm, reads slurm.conf and connects: 4 ms on a
quiet machine, 15 ms and more under load; asked of one ``scontrol`` in interactive mode, the
same RPC costs about 1 ms (docs/architecture.md, "The node agent", says why the prolog asks).

The query helper is a process the agent forks at start (before it has any thread, so it shares
nothing with the workers but one socket). A worker sends it the job selector (``123``,
``123_4``) in one SOCK_SEQPACKET message carrying, over SCM_RIGHTS, the end of a fresh
socketpair to answer on; the helper writes ``<scontrol>\\n<SLURM_CONF>\\n`` and the ``show
job`` text, then closes (protocol/agent_wire.py). Each answer ends at a line only this query
can produce: ``show hostnames q<random>[1-2]`` expands to two lines that neither scontrol's
echo nor any job string can contain, so a forged job name never shifts one job's answer into
the next one's. The worker uses the text only when its own environment names the same
scontrol and slurm.conf, and it goes through the same parser (slurm.jobdetail: forgeries
detected, then ``squeue --json``). Anything else (no helper, a timeout, an empty answer): the
worker asks Slurm itself, as the Python prolog does.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import time

from ..protocol.agent_wire import MAX_ANSWER, encode_query_answer, parse_query_answer, valid_selector

# Annotations only: subprocess is imported when the helper first starts.
TYPE_CHECKING = False
if TYPE_CHECKING:
    import subprocess

ANSWER_TIMEOUT_S = 5.0
_PROMPT = "scontrol: "


class ScontrolSession:
    """One interactive ``scontrol -d --local`` (restarted when it fails or stalls; ``--local``: no
    REQUEST_FED_INFO RPC before each query, see slurm.commands.Slurm.job_detail)."""

    def __init__(self, scontrol: str):
        self.scontrol = scontrol
        self.process: subprocess.Popen[bytes] | None = None
        self.buffer = b""

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.process = None

    def show_job(self, selector: str) -> str:
        """``show job`` text for the selector ('' when scontrol fails, stalls or knows no such job)."""
        if self.process is None or self.process.poll() is not None:
            import subprocess

            self.buffer = b""
            self.process = subprocess.Popen(
                [self.scontrol, "-d", "--local"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                bufsize=0,
                close_fds=True,
            )
        assert self.process is not None and self.process.stdin is not None and self.process.stdout is not None
        nonce = "q" + os.urandom(8).hex()
        end = f"{nonce}1\n{nonce}2\n".encode()
        try:
            self.process.stdin.write(f"show job {selector}\nshow hostnames {nonce}[1-2]\n".encode())
        except OSError:
            self.stop()
            return ""
        deadline = time.monotonic() + ANSWER_TIMEOUT_S
        out = self.process.stdout.fileno()
        while end not in self.buffer:
            left = deadline - time.monotonic()
            ready = left > 0 and len(self.buffer) <= MAX_ANSWER and select.select([out], [], [], left)[0]
            chunk = os.read(out, 1 << 16) if ready else b""
            if not chunk:  # stalled, too long, or scontrol is gone
                self.stop()
                return ""
            self.buffer += chunk
        text, _, self.buffer = self.buffer.partition(end)
        return _record(text.decode("utf-8", "replace"))


def received_fds(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    """The descriptors that came with a message over SCM_RIGHTS (``recvmsg``'s ancillary data)."""
    return [
        fd
        for level, kind, data in ancillary
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS
        for fd in struct.unpack(f"{len(data) // 4}i", data[: len(data) // 4 * 4])
    ]


def _record(text: str) -> str:
    """The job records of one answer: scontrol's prompt and echo before the first ``JobId=`` line
    and after the last record go (a job string can only add lines, which the parser judges)."""
    lines = text.split("\n")
    first = next((i for i, line in enumerate(lines) if line.startswith("JobId=")), None)
    if first is None:
        return ""
    lines = lines[first:]
    while lines and (lines[-1].startswith(_PROMPT) or not lines[-1].strip()):
        lines.pop()
    return "\n".join(lines) + "\n"


def serve(requests: socket.socket, scontrol: str, slurm_conf: str, parent: int) -> None:
    """The helper's loop: answer job queries until the agent (``parent``) is gone."""
    session = ScontrolSession(scontrol)
    try:
        while os.getppid() == parent:
            if not select.select([requests], [], [], 1.0)[0]:
                continue
            message, ancillary, _, _ = requests.recvmsg(32, socket.CMSG_SPACE(4))
            fds = received_fds(ancillary)
            if not message and not fds:
                return
            try:
                selector = message.decode("ascii", "replace")
                if len(fds) == 1 and valid_selector(selector):
                    text = session.show_job(selector)
                    with socket.socket(fileno=os.dup(fds[0])) as reply:
                        reply.settimeout(ANSWER_TIMEOUT_S)
                        reply.sendall(encode_query_answer(scontrol, slurm_conf, text) if text else b"")
            except OSError:
                pass
            finally:
                for fd in fds:
                    os.close(fd)
    finally:
        session.stop()


def start(environ, settings) -> socket.socket | None:
    """Fork the query helper; returns the socket workers ask it on (None: no scontrol, no helper)."""
    from ..errors import SlurmCommandError
    from .slurm_files import conf_paths

    try:
        scontrol = settings.slurm(environ).program("scontrol")
    except SlurmCommandError:
        return None
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    parent = os.getpid()
    if os.fork() == 0:
        code = 0
        try:
            ours.close()
            serve(theirs, scontrol, conf_paths(environ)[0], parent)
        except BaseException:  # noqa: BLE001 - the workers fall back to asking Slurm themselves
            code = 1
        os._exit(code)
    theirs.close()
    return ours


def ask(requests: socket.socket, selector: str, environ) -> tuple[str, str] | None:
    """(scontrol, text) of the helper's answer for a job selector, if it answered for this hook's Slurm."""
    from .slurm_files import conf_paths

    if not valid_selector(selector):
        return None
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with theirs:
            requests.sendmsg(
                [selector.encode()], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("i", theirs.fileno()))]
            )
        mine.settimeout(ANSWER_TIMEOUT_S + 1)
        data = bytearray()
        while chunk := mine.recv(1 << 16):
            data += chunk
            if len(data) > MAX_ANSWER:
                return None
    except OSError:
        return None
    finally:
        mine.close()
    scontrol, conf, text = parse_query_answer(bytes(data))
    if not text.strip() or conf != conf_paths(environ)[0]:
        return None
    return scontrol, text
