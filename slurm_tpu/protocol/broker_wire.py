"""The TPU broker's files and wire format: shares of one Edge TPU for many jobs (docs/architecture.md).

**Where** (all under ``<state_dir>/broker/``, :data:`BROKER_DIR`, root's 0755):

- ``control.sock`` (:data:`CONTROL_SOCKET`, root 0600): the Prolog and Epilog (through the node
  agent, root), ``metrics`` and ``doctor`` ask the broker (root) to open or close a job's endpoint,
  or for its figures. The broker serves only peers of uid 0 (``SO_PEERCRED``).
- ``grants/<job>`` (:data:`GRANTS`, root 0700 directory, files 0600): the truth of which job holds
  how many shares of this node, written by the Prolog before it asks the broker and removed by the
  Epilog after (:func:`encode_grant` / :func:`decode_grant`). A broker that (re)starts opens an
  endpoint for every grant it finds, so a restart loses no job.
- ``jobs/<job>.sock`` (:data:`ENDPOINTS`, root 0755 directory; :func:`endpoint_path`): the job's
  private endpoint, made by the broker, owned by the job's user, mode 0600. The task prolog
  announces it as :data:`ENDPOINT_ENV`.
- ``stats/<job>`` (:data:`STATS`, root 0700): the broker's running figures of a job, rewritten
  atomically every few seconds and at close, so a broker crash loses seconds of them, not the job's.

**Frames** (both sockets; SOCK_STREAM): a 12-byte head ``>4sII`` = :data:`MAGIC`, the length of a
JSON object (at most :data:`MAX_HEADER`), the length of a binary payload that follows it (at most
:data:`MAX_PAYLOAD`); then the JSON, then the payload. Every request has ``"op"``; every answer
has ``"ok"`` (true, or false with ``"error"``: one line for the user).

Job endpoint ops (the job's user, hostile input):

- ``load``: payload = a .tflite model's bytes -> ``{"ok", "model": <sha256 hex>, "inputs": [spec],
  "outputs": [spec]}`` (spec: ``{"name", "shape", "dtype", "quantization": [scale, zero_point]}``).
  ``{"op": "load", "kind": "executable", "inputs": [spec], "outputs": [spec]}``, payload = one
  Edge TPU custom op's executable (its ``custom_initial_data``), sent by the node's libedgetpu
  (scripts/libedgetpu-broker.patch) for a job's unmodified pycoral/tflite code: the broker runs it
  as a one-op model with exactly those tensors (broker/oneop.py), same answer (``"model"`` is the
  sha256 of that one-op model); ``"kind": "model"`` (the default) is the form above. The op's
  ``invoke`` is the ordinary one; the answer's ``outputs`` sizes equal the op's output tensors'.
  A load that fails (not a model, over a bound: tensors, names, bytes) gets one error frame and the
  connection closes.
- ``invoke``: ``{"op", "id", "model", "tensors": [nbytes...]}``, payload = the input tensors' bytes in
  order -> ``{"ok", "id", "outputs": [{"shape", "dtype", "bytes"}], "busy_ms", "wait_ms"}``, payload
  = the output tensors' bytes. Answers on one connection may come back in another order than their
  requests (match by ``id``); a job's requests in flight and the bytes of its queued inputs are
  bounded, beyond either the broker stops reading the connection (back-pressure, not an error).
- ``stats``: ``{"ok", "stats": {figures}, "in_flight_peak": n}``: the job's own figures
  (:data:`FIGURES`), and the most invokes it ever had at once between reading one's head and its
  answer going to the socket (a client that waits for each answer shows 1; one that pipelines, or
  shares its engine between threads, shows more).

Control ops (root): ``open`` ``{"job"}`` (endpoint from the grant file), ``close`` ``{"job"}`` ->
``{"ok", "stats": {figures}}``, ``stats`` -> ``{"ok", "jobs": {job: figures}, "devices":
{identity: {"busy_s", "utilization", "model_swaps", "inferences"}}, "in_flight_peak": {job: n}}``,
``ping`` -> ``{"ok", "pid", "devices_alive"}`` (false once a device's thread died: doctor's broker
check fails). The broker also follows the grant files by itself every few seconds: a grant with no
endpoint gets one, an endpoint whose grant is gone is closed, a stats file of neither goes.

Both ends send a frame with one gathering ``sendmsg`` (head and JSON, then the payload's buffers,
not copied together) and read it with :class:`FrameReader` (usually one ``recv`` for a small
frame); that is how they are read and written, not part of the format.
"""

from __future__ import annotations

import struct

from . import FormatError, json_object

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Union

    Buffer = Union[bytes, bytearray, memoryview]

BROKER_DIR = "broker"  # under the state directory
CONTROL_SOCKET = "control.sock"
GRANTS = "grants"
ENDPOINTS = "jobs"
STATS = "stats"
PIDFILE = "broker.pid"  # in BROKER_DIR: the broker's pid, written once its control socket listens

ENDPOINT_ENV = "SLURM_TPU_BROKER"  # the job's endpoint, set by the task prolog
SHARDS_ENV = "SLURM_TPU_SHARDS"  # how many shares the job holds on this node

MAGIC = b"STB1"
HEAD = struct.Struct(">4sII")
MAX_HEADER = 64 << 10
MAX_PAYLOAD = 64 << 20  # a model (Edge TPU models are < 20 MB) or one request's tensors
READ_BUFFER = HEAD.size + MAX_HEADER  # FrameReader's buffer: any head and JSON fit in it
READ_AHEAD = 8 << 10  # what FrameReader asks one recv for beyond the bytes it needs
_IOV_MAX = 512  # buffers per sendmsg (Linux takes 1024)
GRANT_VERSION = 1
MAX_SHARES = 1024

# A job's figures (the broker's, trusted; the Epilog spools them with the job's record).
BUSY_MS, INFERENCES, SWAPS, WAIT_MS, LOADS = "busy_ms", "inferences", "model_swaps", "queue_wait_ms", "model_loads"
FIGURES = (BUSY_MS, INFERENCES, SWAPS, WAIT_MS, LOADS)


def decode_figures(data: object, source: str) -> dict[str, float]:
    """A job's figures (:data:`FIGURES`) in ``data`` (a ``stats`` answer's or ``stats/<job>``'s object):
    a figure missing, or not a number in [0, 1e15), counts 0; the two times stay floats, the counts
    are ints. FormatError naming ``source`` when ``data`` is not an object at all."""
    if not isinstance(data, dict):
        raise FormatError(f"{source}: the job's figures are not an object", source)
    found: dict[str, float] = {}
    for name in FIGURES:
        value = data.get(name, 0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < 1e15:
            value = 0
        found[name] = value if name in (BUSY_MS, WAIT_MS) else int(value)
    return found


def endpoint_path(state_dir: str, job_id: int) -> str:
    """The job's endpoint socket."""
    return f"{state_dir.rstrip('/')}/{BROKER_DIR}/{ENDPOINTS}/{int(job_id)}.sock"


def grant_path(state_dir: str, job_id: int) -> str:
    """The job's grant file (the Epilog only stats it; hooks/shards.py reads it through the ledger's fd)."""
    return f"{state_dir.rstrip('/')}/{BROKER_DIR}/{GRANTS}/{int(job_id)}"


def control_path(state_dir: str) -> str:
    """The broker's control socket."""
    return f"{state_dir.rstrip('/')}/{BROKER_DIR}/{CONTROL_SOCKET}"


def encode_frame(header: dict, payload: Buffer = b"") -> bytes:
    """One frame (head, JSON, payload) as bytes."""
    import json

    text = json.dumps(header, separators=(",", ":")).encode()
    if len(text) > MAX_HEADER:
        raise ValueError(f"frame header of {len(text)} bytes (at most {MAX_HEADER})")
    return HEAD.pack(MAGIC, len(text), len(payload)) + text + bytes(payload)


def parse_head(head: bytes | memoryview, max_payload: int = MAX_PAYLOAD) -> tuple[int, int]:
    """(JSON length, payload length) from a frame's 12 bytes; FormatError for a foreign or oversized frame."""
    magic, header_len, payload_len = HEAD.unpack(head)
    if magic != MAGIC:
        raise FormatError("not a slurm-tpu broker frame (wrong magic)")
    if not 0 < header_len <= MAX_HEADER:
        raise FormatError(f"frame header of {header_len} bytes (at most {MAX_HEADER})")
    if payload_len > max_payload:
        raise FormatError(f"frame payload of {payload_len} bytes (at most {max_payload})")
    return header_len, payload_len


def parse_header(raw: bytes) -> dict:
    """The JSON object of a frame; FormatError unless it is one with a string ``op`` or a bool ``ok``."""
    data = json_object(raw, "broker frame")
    if not isinstance(data.get("op"), str) and not isinstance(data.get("ok"), bool):
        raise FormatError("broker frame without 'op' or 'ok'")
    return data


def encode_grant(job_id: int, uid: int, gid: int, shares: int) -> bytes:
    """A grant file's bytes."""
    import json

    return json.dumps(
        {"version": GRANT_VERSION, "job_id": job_id, "uid": uid, "gid": gid, "shares": shares}, sort_keys=True
    ).encode()


def decode_grant(raw: bytes, source: str) -> tuple[int, int, int, int]:
    """(job_id, uid, gid, shares) of a grant file; FormatError naming ``source`` for anything else."""
    data = json_object(raw, source)
    if data.get("version") != GRANT_VERSION:
        raise FormatError(f"{source}: grant version {data.get('version')!r} (this slurm-tpu reads {GRANT_VERSION})")
    values = []
    for key, low, high in (("job_id", 1, 2**32), ("uid", 0, 2**32), ("gid", 0, 2**32), ("shares", 1, MAX_SHARES)):
        value = data.get(key)
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise FormatError(f"{source}: '{key}' is not an integer in [{low}, {high}]", source)
        values.append(value)
    return values[0], values[1], values[2], values[3]


def recv_exact(sock, count: int) -> bytes:
    """Exactly ``count`` bytes from a socket; EOFError when the peer closes first."""
    if count == 0:
        return b""
    buffer = bytearray(count)
    view = memoryview(buffer)
    got = 0
    while got < count:
        n = sock.recv_into(view[got:], count - got)
        if n == 0:
            raise EOFError("the other end closed the connection")
        got += n
    return bytes(buffer)


def recv_frame(sock, max_payload: int = MAX_PAYLOAD) -> tuple[dict, bytes]:
    """One frame from a socket: (JSON object, payload). FormatError for a foreign or oversized frame
    (nothing past its head is read then), EOFError when the peer closes."""
    header_len, payload_len = parse_head(recv_exact(sock, HEAD.size), max_payload)
    header = parse_header(recv_exact(sock, header_len))
    return header, recv_exact(sock, payload_len)


class FrameReader:
    """Frames from one stream socket with as few ``recv`` calls as the data allows.

    One ``recv`` of up to :data:`READ_AHEAD` bytes usually brings a request's head, JSON and
    (small) payload at once, where reading them exactly takes three calls; a large payload's
    remainder is received straight into its own buffer (copying through this one would cost
    the device's thread the GIL for longer). What is read ahead is bounded (a buffer of
    :data:`READ_BUFFER`), so back-pressure (not reading) still holds. The head is checked before
    anything past it is parsed, so a foreign or oversized frame is refused on its 12 bytes.
    """

    def __init__(self, sock):
        import json

        self._sock = sock
        self._buffer = bytearray(READ_BUFFER)
        self._view = memoryview(self._buffer)
        self._start = self._end = 0  # unparsed bytes: self._buffer[start:end]
        self._loads = json.loads

    def _fill(self, count: int) -> None:
        """At least ``count`` (<= READ_BUFFER) unparsed bytes in the buffer; EOFError when the peer closes."""
        if self._end - self._start >= count:
            return
        if self._start + count > READ_BUFFER:  # move what is left to the front to make room
            left = self._end - self._start
            self._buffer[:left] = self._view[self._start : self._end]
            self._start, self._end = 0, left
        while self._end - self._start < count:
            wanted = max(READ_AHEAD, count - (self._end - self._start))
            n = self._sock.recv_into(self._view[self._end :], min(wanted, READ_BUFFER - self._end))
            if n == 0:
                raise EOFError("the other end closed the connection")
            self._end += n

    def head(self, max_payload: int = MAX_PAYLOAD) -> tuple[dict, int]:
        """The next frame's JSON object and its payload's length (read next with :meth:`payload`)."""
        self._fill(HEAD.size)
        header_len, payload_len = parse_head(self._view[self._start : self._start + HEAD.size], max_payload)
        self._start += HEAD.size
        self._fill(header_len)
        raw = self._buffer[self._start : self._start + header_len]  # json reads bytearray, not memoryview
        self._start += header_len
        try:
            data = self._loads(raw)
        except (ValueError, RecursionError):  # RecursionError: "[[[[..." nested past the stack
            raise FormatError("broker frame: not a JSON object (not JSON, or a torn line)") from None
        if not isinstance(data, dict):
            raise FormatError("broker frame: not a JSON object")
        if not isinstance(data.get("op"), str) and not isinstance(data.get("ok"), bool):
            raise FormatError("broker frame without 'op' or 'ok'")
        return data, payload_len

    def payload(self, count: int) -> bytearray:
        """The frame's payload (``count`` bytes from :meth:`head`), in a buffer of its own (writable)."""
        out = bytearray(count)
        have = min(count, self._end - self._start)
        out[:have] = self._view[self._start : self._start + have]
        self._start += have
        if self._start == self._end:
            self._start = self._end = 0
        if have < count:
            view = memoryview(out)
            while have < count:
                n = self._sock.recv_into(view[have:], count - have)
                if n == 0:
                    raise EOFError("the other end closed the connection")
                have += n
        return out


def frame_parts(header: dict | bytes, payload: Sequence[Buffer] = ()) -> list[Buffer]:
    """One frame as buffers for a gathering send: the head and JSON, then each payload buffer (not
    copied). ``header``: the JSON object, or its text already encoded (a hot path's own)."""
    import json

    text = header if isinstance(header, bytes) else json.dumps(header, separators=(",", ":")).encode()
    if len(text) > MAX_HEADER:
        raise ValueError(f"frame header of {len(text)} bytes (at most {MAX_HEADER})")
    size = 0
    for part in payload:
        size += memoryview(part).nbytes
    return [HEAD.pack(MAGIC, len(text), size) + text, *payload]


def _rest(parts: Sequence[Buffer], sent: int) -> list[memoryview]:
    """What is left of ``parts`` once their first ``sent`` bytes went out."""
    rest = []
    for part in parts:
        view = memoryview(part).cast("B")
        if sent >= view.nbytes:
            sent -= view.nbytes
            continue
        rest.append(view[sent:])
        sent = 0
    return rest


def send_parts(sock, parts: Sequence[Buffer]) -> None:
    """Send buffers as one stream (``sendmsg``, gathering: no copy into one buffer), blocking until all went."""
    views = [memoryview(p).cast("B") for p in parts]
    total = sum(v.nbytes for v in views)
    while views:
        sent = sock.sendmsg(views[:_IOV_MAX])
        if sent == total:
            return
        total -= sent
        views = _rest(views, sent)


def try_send(sock, parts: Sequence[Buffer]) -> list[memoryview] | None:
    """Send as much of ``parts`` as the socket takes now, without blocking: None when it took all,
    else what is left (all of it when it took nothing)."""
    import socket  # here, not at the top: every Epilog imports this module for grant_path

    views = [memoryview(p).cast("B") for p in parts]
    if len(views) > _IOV_MAX:
        return views
    try:
        sent = sock.sendmsg(views, (), socket.MSG_DONTWAIT)
    except (BlockingIOError, InterruptedError):
        return views
    if sent == sum(v.nbytes for v in views):
        return None
    return _rest(views, sent)


def send_frame(sock, header: dict, payload: Buffer = b"") -> None:
    """Send one frame (the head and JSON, then the payload, in one gathering write: no copy)."""
    send_parts(sock, frame_parts(header, (payload,) if len(payload) else ()))
