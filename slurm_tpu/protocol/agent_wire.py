"""The node agent's wire formats: hook client -> agent, and agent worker -> its scontrol helper.

**Hook requests** (``<state_dir>/agent.sock``, :data:`SOCKET`, a SOCK_STREAM Unix socket;
host byte order). The client (hook_client/slurm-tpu-hook-client.c, root, a hook's native
entry) sends a 4-byte length N (0 < N <= :data:`MAX_REQUEST`), then N bytes:
``STPU1\\0<hook>\\0`` and ``NAME=value\\0`` per environment variable (``<hook>``: one of
:data:`HOOKS`). The agent (slurm_tpu/hooks/agent.py, root) answers with a 4-byte length M
(at most :data:`MAX_OUTPUT`), M bytes of the hook's messages, and one byte of exit status.
The C client repeats :data:`MAGIC`, :data:`MAX_OUTPUT` and its own smaller request limit
(tests/protocol checks that they agree). :data:`PIDFILE` (the agent's pid and a newline,
written once the socket listens) tells whoever started the agent that it serves.

**Job queries** (the agent's workers -> the query helper it forks at start,
slurm_tpu/hooks/agent_query.py; a SOCK_SEQPACKET pair). A worker sends a job selector
(:func:`valid_selector`) with, over SCM_RIGHTS, one end of a fresh socketpair; the helper
writes ``<scontrol>\\n<SLURM_CONF>\\n`` and ``scontrol show job``'s text (at most
:data:`MAX_ANSWER` bytes in all) there and closes it. No answer means "ask Slurm yourself".
How the bytes move (SO_PEERCRED, time limits, descriptors closed unread) is the agent's.
"""

from __future__ import annotations

import struct

from . import FormatError

SOCKET = "agent.sock"  # under the state directory
PIDFILE = "agent.pid"  # under the state directory
MAGIC = b"STPU1"
MAX_REQUEST = 64 << 10
MAX_OUTPUT = 64 << 10  # the hook's messages sent back (hook_client/slurm-tpu-hook-client.c MAX_OUTPUT)
HOOKS = ("prolog", "epilog", "udev")
LENGTH = struct.Struct("=I")  # the length before a request or an answer
MAX_ANSWER = 4 << 20  # a job query's answer


def encode_request(hook: str, environ: dict[str, str]) -> bytes:
    """A whole request, length first (what the C client sends; for tests and tools)."""
    import os

    body = b"\0".join([MAGIC, hook.encode(), *(os.fsencode(f"{name}={value}") for name, value in environ.items())])
    body += b"\0"
    return LENGTH.pack(len(body)) + body


def request_length(head: bytes) -> int:
    """The body length a request's first 4 bytes announce; FormatError unless 0 < N <= MAX_REQUEST."""
    (length,) = LENGTH.unpack(head)
    if not 0 < length <= MAX_REQUEST:
        raise FormatError(f"request of {length} bytes (at most {MAX_REQUEST})")
    return length


def parse_request(body: bytes) -> tuple[str, dict[str, str]]:
    """(hook, environment) of a request's body; FormatError for anything else (an entry without
    ``=`` or with an empty name is skipped, as the hook's own process would never see it)."""
    import os

    parts = body.split(b"\0")
    if len(parts) < 3 or parts[0] != MAGIC or parts[-1] != b"":
        raise FormatError("not a slurm-tpu hook request")
    hook = parts[1].decode("ascii", "replace")
    if hook not in HOOKS:
        raise FormatError(f"unknown hook {hook[:20]!r}")
    environ: dict[str, str] = {}
    for entry in parts[2:-1]:
        name, sep, value = entry.partition(b"=")
        if sep and name:
            environ[os.fsdecode(name)] = os.fsdecode(value)
    return hook, environ


def encode_answer(status: int, output: bytes) -> bytes:
    """The reply: the hook's messages (its stdout and stderr, at most MAX_OUTPUT) and its exit status."""
    output = output[:MAX_OUTPUT]
    return LENGTH.pack(len(output)) + output + bytes([status & 0xFF])


def valid_selector(selector: str) -> bool:
    """A job (``123``), an array task (``123_4``) or a het component (``123+1``): digits, one ``_`` or ``+``."""
    head, sep, tail = selector.partition("_") if "_" in selector else selector.partition("+")
    return 0 < len(selector) <= 24 and head.isdigit() and (not sep or tail.isdigit())


def encode_query_answer(scontrol: str, slurm_conf: str, text: str) -> bytes:
    """The helper's answer: which scontrol and slurm.conf answered, then ``show job``'s text."""
    return f"{scontrol}\n{slurm_conf}\n".encode() + text.encode()


def parse_query_answer(data: bytes) -> tuple[str, str, str]:
    """(scontrol, slurm.conf, text) of a helper's answer (the text may be empty)."""
    scontrol, _, rest = data.decode("utf-8", "replace").partition("\n")
    conf, _, text = rest.partition("\n")
    return scontrol, conf, text
