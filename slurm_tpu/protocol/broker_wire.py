"""The TPU broker's files and wire format: shares of one Edge TPU for many jobs (docs/shards.md).

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
- ``invoke``: ``{"op", "id", "model", "tensors": [nbytes...]}``, payload = the input tensors' bytes in
  order -> ``{"ok", "id", "outputs": [{"shape", "dtype", "bytes"}], "busy_ms", "wait_ms"}``, payload
  = the output tensors' bytes. Answers on one connection may come back in another order than their
  requests (match by ``id``); a job's requests in flight are bounded, beyond that the broker stops
  reading the connection (back-pressure, not an error).
- ``stats``: the job's own figures (:data:`FIGURES`).

Control ops (root): ``open`` ``{"job"}`` (endpoint from the grant file), ``close`` ``{"job"}`` ->
``{"ok", "stats": {figures}}``, ``stats`` -> ``{"ok", "jobs": {job: figures}, "devices":
{identity: {"busy_s", "utilization", "model_swaps", "inferences"}}}``, ``ping``.
"""

from __future__ import annotations

import struct

from . import FormatError, json_object

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
GRANT_VERSION = 1
MAX_SHARES = 1024

# A job's figures (the broker's, trusted; the Epilog spools them with the job's record).
BUSY_MS, INFERENCES, SWAPS, WAIT_MS, LOADS = "busy_ms", "inferences", "model_swaps", "queue_wait_ms", "model_loads"
FIGURES = (BUSY_MS, INFERENCES, SWAPS, WAIT_MS, LOADS)


def endpoint_path(state_dir: str, job_id: int) -> str:
    """The job's endpoint socket."""
    return f"{state_dir.rstrip('/')}/{BROKER_DIR}/{ENDPOINTS}/{int(job_id)}.sock"


def control_path(state_dir: str) -> str:
    """The broker's control socket."""
    return f"{state_dir.rstrip('/')}/{BROKER_DIR}/{CONTROL_SOCKET}"


def encode_frame(header: dict, payload: bytes | bytearray | memoryview = b"") -> bytes:
    """One frame (head, JSON, payload) as bytes."""
    import json

    text = json.dumps(header, separators=(",", ":")).encode()
    if len(text) > MAX_HEADER:
        raise ValueError(f"frame header of {len(text)} bytes (at most {MAX_HEADER})")
    return HEAD.pack(MAGIC, len(text), len(payload)) + text + bytes(payload)


def parse_head(head: bytes, max_payload: int = MAX_PAYLOAD) -> tuple[int, int]:
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


def send_frame(sock, header: dict, payload: bytes | bytearray | memoryview = b"") -> None:
    """Send one frame (the head and JSON in one write, the payload without a copy)."""
    import json

    text = json.dumps(header, separators=(",", ":")).encode()
    if len(text) > MAX_HEADER:
        raise ValueError(f"frame header of {len(text)} bytes (at most {MAX_HEADER})")
    head = HEAD.pack(MAGIC, len(text), len(payload)) + text
    if len(payload) < 65536:
        sock.sendall(head + bytes(payload))
    else:
        sock.sendall(head)
        sock.sendall(payload)
