"""A model run by the node's TPU broker, for a job holding TPU shards (``SLURM_TPU_BROKER``).

:class:`BrokerEngine` has the Engine interface (modelinfo.Engine): it connects to the job's
endpoint, sends the model's bytes once (``load``), then one ``invoke`` per :meth:`run`, so
``infer``, ``serve`` and the Runner API run through the broker unchanged. :meth:`run_many`
keeps several requests in flight on the one connection (pipelining) for callers with a stream.
Anything that stops the broker from answering is one line (:class:`BrokerError`), never
another job's results: answers are matched by the request's id.
"""

from __future__ import annotations

import errno
import itertools
import socket
from collections import deque
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from ..errors import DeviceError
from ..protocol import FormatError, broker_wire as wire
from .modelinfo import TensorSpec

CONNECT_TIMEOUT_S = 10.0
ANSWER_TIMEOUT_S = 300.0  # a request may wait behind other jobs' work; a dead broker closes the socket


class BrokerError(DeviceError):
    """The node's broker cannot be reached, refused this process, or failed a request."""


def _spec(data: dict) -> TensorSpec:
    scale, zero = data.get("quantization") or (0.0, 0)
    return TensorSpec(
        str(data["name"]), tuple(int(x) for x in data["shape"]), np.dtype(data["dtype"]), float(scale), int(zero)
    )


class BrokerEngine:
    """One model on the job's TPU shares, through the broker's endpoint ``endpoint``."""

    def __init__(self, model_path: str, endpoint: str, label: str = "edgetpu shard"):
        self.label = label
        self.endpoint = endpoint
        self._ids = itertools.count(1)
        try:
            with open(model_path, "rb") as handle:
                data = handle.read()
        except OSError as exc:
            raise BrokerError(f"cannot read model {model_path}: {exc.strerror}", "broker") from None
        self._sock: socket.socket | None = self._connect(endpoint)
        try:
            answer, _ = self._ask({"op": "load"}, data)
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
        sock.settimeout(ANSWER_TIMEOUT_S)
        return sock

    def _ask(self, header: dict, payload: bytes | bytearray | memoryview = b"") -> tuple[dict, bytes]:
        self._send(header, payload)
        return self._receive()

    def _send(self, header: dict, payload: bytes | bytearray | memoryview = b"") -> None:
        if self._sock is None:
            raise BrokerError("the TPU broker connection is closed", "broker")
        try:
            wire.send_frame(self._sock, header, payload)
        except OSError as exc:
            # A refused connection gets one error frame before the broker closes it: read it if it came.
            try:
                self._sock.settimeout(1.0)
                answer, _ = wire.recv_frame(self._sock)
            except (EOFError, OSError, FormatError):
                self._lost(exc)
            self.close()
            raise BrokerError(f"the TPU broker refused this process: {answer.get('error')}", "broker") from None

    def _receive(self) -> tuple[dict, bytes]:
        if self._sock is None:
            raise BrokerError("the TPU broker connection is closed", "broker")
        try:
            return wire.recv_frame(self._sock)
        except (EOFError, OSError, FormatError) as exc:
            self._lost(exc)
            raise  # unreachable: _lost raises

    def _lost(self, exc: BaseException) -> None:
        # The broker answers a refused connection with one frame, then closes: say its line.
        self.close()
        if isinstance(exc, socket.timeout):
            raise BrokerError(f"the TPU broker at {self.endpoint} did not answer in {ANSWER_TIMEOUT_S:.0f} s", "broker")
        raise BrokerError(
            f"the TPU broker at {self.endpoint} closed the connection ({exc}): it stopped or restarted; run again",
            "broker",
        ) from None

    # ---- inference ----

    def _request(self, inputs: Sequence[np.ndarray]) -> tuple[int, list, list[int]]:
        request_id = next(self._ids)
        if len(inputs) != len(self.inputs):
            raise BrokerError(f"the model takes {len(self.inputs)} input tensors, not {len(inputs)}", "broker")
        arrays = []
        for spec, value in zip(self.inputs, inputs):
            array = np.ascontiguousarray(value, dtype=spec.dtype)
            if array.shape != spec.shape:
                raise BrokerError(f"input {spec.name} has shape {array.shape}, the model's is {spec.shape}", "broker")
            arrays.append(array)
        return request_id, arrays, [a.nbytes for a in arrays]

    def _submit(self, inputs: Sequence[np.ndarray]) -> int:
        request_id, arrays, sizes = self._request(inputs)
        payload = memoryview(arrays[0]).cast("B") if len(arrays) == 1 else b"".join(a.tobytes() for a in arrays)
        self._send({"op": "invoke", "id": request_id, "model": self.model, "tensors": sizes}, payload)
        return request_id

    def _collect(self) -> tuple[int, list[np.ndarray]]:
        header, payload = self._receive()
        if not header.get("ok"):
            if "id" not in header:
                self.close()
            raise BrokerError(f"the TPU broker refused the request: {header.get('error')}", "broker")
        outputs, offset = [], 0
        for item in header.get("outputs", []):
            size = int(item["bytes"])
            dtype = np.dtype(item["dtype"])
            array = np.frombuffer(payload, dtype, size // dtype.itemsize, offset)
            outputs.append(array.reshape(item["shape"]).copy())
            offset += size
        return int(header["id"]), outputs

    def run(self, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """One inference: the outputs, bit for bit what the model gives on the broker's device."""
        request_id = self._submit(inputs)
        answer_id, outputs = self._collect()
        if answer_id != request_id:
            self.close()
            raise BrokerError(f"the TPU broker answered request {answer_id}, not {request_id}", "broker")
        return outputs

    def run_many(self, batches: Iterable[Sequence[np.ndarray]], depth: int = 4) -> Iterator[list[np.ndarray]]:
        """Outputs of each input set, in order, with up to ``depth`` requests in flight."""
        pending: deque[int] = deque()
        done: dict[int, list[np.ndarray]] = {}
        for inputs in batches:
            pending.append(self._submit(inputs))
            while len(pending) >= depth:
                yield self._next(pending, done)
        while pending:
            yield self._next(pending, done)

    def _next(self, pending: deque[int], done: dict[int, list[np.ndarray]]) -> list[np.ndarray]:
        wanted = pending[0]
        while wanted not in done:
            answer_id, outputs = self._collect()
            done[answer_id] = outputs
        pending.popleft()
        return done.pop(wanted)

    def stats(self) -> dict:
        """The job's figures as the broker counts them."""
        answer, _ = self._ask({"op": "stats"})
        return dict(answer.get("stats") or {})

    def close(self) -> None:
        if self._sock is not None:
            try:
                self._sock.close()
            finally:
                self._sock = None
