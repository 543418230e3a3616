"""A model run by the node's TPU broker, for a job holding TPU shards (``SLURM_TPU_BROKER``).

:class:`BrokerEngine` has the Engine interface (modelinfo.Engine): it connects to the job's
endpoint, sends the model's bytes once (``load``), then one ``invoke`` per :meth:`run`, so
``infer``, ``serve`` and the Runner API run through the broker unchanged.

An engine may be shared by up to :attr:`BrokerEngine.in_flight` threads at once, each in its
own :meth:`run`: their requests are in flight together on the one connection, so the broker's
device runs the next while this process sends, receives and decodes (the runner's pipeline and
``serve``'s device queue give a broker engine that many threads; in process an engine runs one
inference at a time). :meth:`run_many` does the same from one thread, for a caller with a stream.
Anything that stops the broker from answering is one line (:class:`BrokerError`), never
another job's results: answers are matched by the request's id.
"""

from __future__ import annotations

import errno
import itertools
import json
import socket
import struct
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from ..errors import DeviceError
from ..protocol import FormatError, broker_wire as wire
from .modelinfo import TensorSpec

CONNECT_TIMEOUT_S = 10.0
ANSWER_TIMEOUT_S = 300.0  # a request may wait behind other jobs' work; a dead broker closes the socket
IN_FLIGHT = 4  # requests one engine keeps at the broker when shared by that many threads (the job may have 16)


class BrokerError(DeviceError):
    """The node's broker cannot be reached, refused this process, or failed a request."""


def _spec(data: dict) -> TensorSpec:
    scale, zero = data.get("quantization") or (0.0, 0)
    return TensorSpec(
        str(data["name"]), tuple(int(x) for x in data["shape"]), np.dtype(data["dtype"]), float(scale), int(zero)
    )


class BrokerEngine:
    """One model on the job's TPU shares, through the broker's endpoint ``endpoint`` (thread-safe)."""

    in_flight = IN_FLIGHT  # threads that may share this engine, each with one request in flight

    def __init__(self, model_path: str, endpoint: str, label: str = "edgetpu shard"):
        self.label = label
        self.endpoint = endpoint
        self._ids = itertools.count(1)  # next() is atomic: threads draw distinct ids
        self._send_lock = threading.Lock()  # one frame on the socket at a time
        # Answers: one thread at a time reads the socket; it keeps the others' answers here for them.
        self._cond = threading.Condition(threading.Lock())
        self._answers: dict[int, tuple[dict, bytearray]] = {}
        self._waiting: set[int] = set()  # ids sent and not yet answered
        self._reading = False
        self._failure: BrokerError | None = None  # the connection is lost: every caller gets this line
        self._busy_s = 0.0  # the broker's device time of this engine's requests (its answers' busy_ms)
        try:
            with open(model_path, "rb") as handle:
                data = handle.read()
        except OSError as exc:
            raise BrokerError(f"cannot read model {model_path}: {exc.strerror}", "broker") from None
        self._sock: socket.socket | None = self._connect(endpoint)
        self._frames = wire.FrameReader(self._sock)
        try:
            self._send({"op": "load"}, (data,))
            answer, _ = self._receive()
        except BaseException:
            self.close()
            raise
        if not answer.get("ok"):
            self.close()
            if answer.get("refused"):
                raise BrokerError(f"the TPU broker refused this process: {answer.get('error')}", "broker")
            raise BrokerError(f"the TPU broker refused model {model_path}: {answer.get('error')}", "broker")
        self.model = str(answer["model"])
        self.inputs: Sequence[TensorSpec] = [_spec(d) for d in answer["inputs"]]
        self.outputs: Sequence[TensorSpec] = [_spec(d) for d in answer["outputs"]]
        self._sizes = [int(np.prod(s.shape, dtype=np.int64)) * s.dtype.itemsize for s in self.inputs]
        # An invoke's JSON but its id, written once (the inputs' sizes are the model's: _submit checks
        # every shape), so a request costs no json.dumps.
        fixed = json.dumps({"op": "invoke", "model": self.model, "tensors": self._sizes}, separators=(",", ":"))
        self._invoke_json = (fixed[:-1] + ',"id":').encode()

    @staticmethod
    def _connect(endpoint: str) -> socket.socket:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(CONNECT_TIMEOUT_S)
        try:
            sock.connect(endpoint)
        except OSError as exc:
            sock.close()
            if exc.errno in (errno.ENOENT, errno.ECONNREFUSED):
                why = (
                    f"the node's TPU broker is not running (nothing listens at {endpoint}): the job's shares "
                    "cannot be used; tell the node's admin (systemctl status slurm-tpu-broker)"
                )
            elif exc.errno in (errno.EACCES, errno.EPERM):
                why = f"permission denied on {endpoint}: this TPU broker endpoint belongs to another user's job"
            else:
                why = f"cannot connect to the TPU broker at {endpoint}: {exc.strerror or exc}"
            raise BrokerError(why, "broker") from None
        # Blocking, with the kernel's own timeouts: a Python socket timeout costs a poll() before
        # every send and recv; SO_RCVTIMEO/SO_SNDTIMEO make a stalled call fail with EAGAIN instead.
        sock.settimeout(None)
        timeval = struct.pack("ll", int(ANSWER_TIMEOUT_S), 0)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, timeval)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, timeval)
        return sock

    def _send(self, header: dict | bytes, payload: Sequence = ()) -> None:
        sock = self._sock
        if sock is None:
            raise self._failure or BrokerError("the TPU broker connection is closed", "broker")
        try:
            with self._send_lock:
                wire.send_parts(sock, wire.frame_parts(header, payload))
        except OSError as exc:
            # A refused connection gets one error frame before the broker closes it. Only one thread
            # reads the socket: if another one does, it gets that frame (or the close) and says why.
            with self._cond:
                someone_reads = self._reading
                self._reading = True
                while someone_reads and self._reading and self._failure is None:
                    self._cond.wait()
            if someone_reads:
                failure = self._failure
                self.close()
                raise failure or BrokerError(f"the TPU broker connection failed ({exc})", "broker") from None
            try:
                sock.settimeout(1.0)
                answer, _ = wire.recv_frame(sock)
            except (EOFError, OSError, FormatError):
                self._lost(exc)
            finally:
                with self._cond:
                    self._reading = False
                    self._cond.notify_all()
            self.close()
            raise BrokerError(f"the TPU broker refused this process: {answer.get('error')}", "broker") from None

    def _receive(self) -> tuple[dict, bytearray]:
        if self._sock is None:
            raise self._failure or BrokerError("the TPU broker connection is closed", "broker")
        try:
            header, length = self._frames.head()
            return header, self._frames.payload(length)
        except (EOFError, OSError, FormatError) as exc:
            self._lost(exc)
            raise  # unreachable: _lost raises

    def _lost(self, exc: BaseException) -> None:
        # The broker answers a refused connection with one frame, then closes: say its line.
        self.close()
        if isinstance(exc, (socket.timeout, BlockingIOError)):  # SO_RCVTIMEO ran out: EAGAIN
            raise BrokerError(f"the TPU broker at {self.endpoint} did not answer in {ANSWER_TIMEOUT_S:.0f} s", "broker")
        raise BrokerError(
            f"the TPU broker at {self.endpoint} closed the connection ({exc}): it stopped or restarted; run again",
            "broker",
        ) from None

    # ---- inference ----

    def _submit(self, inputs: Sequence[np.ndarray]) -> int:
        """Send one request (its tensors straight from their arrays); its id."""
        if len(inputs) != len(self.inputs):
            raise BrokerError(f"the model takes {len(self.inputs)} input tensors, not {len(inputs)}", "broker")
        buffers = []
        for spec, value in zip(self.inputs, inputs):
            array = np.ascontiguousarray(value, dtype=spec.dtype)
            if array.shape != spec.shape:
                raise BrokerError(f"input {spec.name} has shape {array.shape}, the model's is {spec.shape}", "broker")
            buffers.append(array.data.cast("B"))
        request_id = next(self._ids)
        with self._cond:
            self._waiting.add(request_id)
        try:
            self._send(self._invoke_json + b"%d}" % request_id, buffers)
        except BaseException:
            with self._cond:
                self._waiting.discard(request_id)
            raise
        return request_id

    def _answer(self, wanted: int) -> tuple[dict, bytearray]:
        """The answer to request ``wanted``: read by this thread, or by the one reading for all."""
        with self._cond:
            while True:
                if wanted in self._answers:
                    self._waiting.discard(wanted)
                    return self._answers.pop(wanted)
                if self._failure is not None:
                    self._waiting.discard(wanted)
                    raise self._failure
                if not self._reading:
                    self._reading = True
                    break
                self._cond.wait()
        try:
            while True:
                header, payload = self._receive()
                answer_id = header.get("id")
                if answer_id == wanted:
                    with self._cond:
                        self._waiting.discard(wanted)
                    return header, payload
                if answer_id not in self._waiting or answer_id in self._answers:
                    self.close()  # a frame for no request of ours: the connection cannot be trusted
                    if not header.get("ok") and answer_id is None:
                        raise BrokerError(f"the TPU broker refused the request: {header.get('error')}", "broker")
                    raise BrokerError(f"the TPU broker answered request {answer_id}, not one it was sent", "broker")
                with self._cond:
                    self._answers[answer_id] = (header, payload)
                    self._cond.notify_all()
        except BrokerError as exc:
            with self._cond:
                self._failure = exc
            raise
        finally:
            with self._cond:
                self._reading = False
                self._cond.notify_all()

    def _outputs(self, header: dict, payload: bytearray) -> list[np.ndarray]:
        if not header.get("ok"):
            raise BrokerError(f"the TPU broker refused the request: {header.get('error')}", "broker")
        busy = header.get("busy_ms")
        if isinstance(busy, (int, float)):
            with self._cond:
                self._busy_s += busy / 1000
        outputs, offset = [], 0
        for item in header.get("outputs", []):
            size = int(item["bytes"])
            dtype = np.dtype(item["dtype"])
            # Views of the answer's own (writable) buffer: no copy, unless one would be misaligned.
            array = np.frombuffer(payload, dtype, size // dtype.itemsize, offset).reshape(item["shape"])
            outputs.append(array.copy() if offset % dtype.alignment else array)
            offset += size
        return outputs

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """One inference: the outputs, bit for bit what the model gives on the broker's device."""
        return self._outputs(*self._answer(self._submit(inputs)))

    def run_many(self, batches: Iterable[Sequence[np.ndarray]], depth: int = 4) -> Iterator[list[np.ndarray]]:
        """Outputs of each input set, in order, with up to ``depth`` requests in flight."""
        pending: deque[int] = deque()
        for inputs in batches:
            pending.append(self._submit(inputs))
            while len(pending) >= depth:
                yield self._outputs(*self._answer(pending.popleft()))
        while pending:
            yield self._outputs(*self._answer(pending.popleft()))

    def device_seconds(self) -> float:
        """Seconds the broker's device spent on this engine's requests (runs overlap, and wait
        behind other jobs': their wall time is not the device's)."""
        return self._busy_s

    def stats(self) -> dict:
        """The job's figures as the broker counts them (the figures only; see :meth:`stats_answer`)."""
        return dict(self.stats_answer().get("stats") or {})

    def stats_answer(self) -> dict:
        """The broker's whole ``stats`` answer: the figures and the job's ``in_flight_peak``."""
        with self._cond:  # the reader: no answer of another thread's may be waiting behind this one
            if self._waiting or self._reading:
                raise BrokerError("stats while requests are in flight on this engine", "broker")
            self._reading = True
        try:
            self._send({"op": "stats"})
            answer, _ = self._receive()
        finally:
            with self._cond:
                self._reading = False
                self._cond.notify_all()
        return answer

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            try:  # wakes a thread blocked in recv on it (close alone would not)
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
