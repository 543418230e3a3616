"""The client of ``slurm-tpu serve``: ``slurm-tpu infer --server JOBID|HOST:PORT ...`` (docs/user-guide.md).

Each input file's bytes go to the model's task endpoint, several requests in flight over
keep-alive connections (one per thread). The token leaves this process only for a job
Slurm says runs, on a :class:`ProvenConnection`. Anything unexpected from a listener is
one line (:class:`ServerError`), never a traceback.
"""

from __future__ import annotations

import http.client
import json
import os
import socket
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import quote, urlencode, urlsplit

import numpy as np

from ...errors import SlurmTpuError
from ..errors import InputError
from ..modelinfo import TensorSpec
from ..tasks import Task, choose_task
from .auth import PROOF_PATH, TOKEN_ENV, Address, address_path, find_address, new_nonce, proof_matches, read_address
from .codec import DTYPES
from .models import default_name

RETRIES = 5  # answers 503 (overloaded) before giving up on an input
PROOF_TIMEOUT = 30.0  # seconds a listener has to answer the proof challenge
MAX_PROOF_ANSWER = 4096  # bytes read of an answer to the challenge (the listener is not trusted yet)
SQUEUE_TIMEOUT = 15.0


class ServerError(SlurmTpuError):
    """The server cannot be reached, refuses us, or does not serve the model."""

    def __init__(self, message: str, url: str):
        super().__init__(message)
        self.url = url


class ProofError(ServerError):
    """The listener did not prove that it holds the token: it is not (or no longer) our server."""


def resolve_target(target: str, environ: Mapping[str, str] = os.environ) -> Address:
    """``JOBID`` or ``HOST:PORT`` -> the address and token to use."""
    if target.replace("_", "").isdigit():
        address = read_address(target, environ)
        check_job_runs(target, environ)
        return address
    host, sep, port = target.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ServerError(f"--server {target}: give a job id or HOST:PORT", target)
    found = find_address(target, environ)
    if found is not None:
        return found
    token = environ.get(TOKEN_ENV, "")
    if not token:
        raise ServerError(
            f"no token for {target}: none of your address files (~/.slurm-tpu/serve/) names it; "
            f"use --server JOBID, or set {TOKEN_ENV}",
            target,
        )
    return Address("", f"http://{target}", token)


def check_job_runs(job_id: str, environ: Mapping[str, str] = os.environ) -> None:
    """ServerError unless Slurm says job ``job_id`` is running: an address file of a job that
    ended is left from a server that could not clean up, and its port may be anyone's now.

    When Slurm cannot be asked (no squeue, no controller in reach: serve outside Slurm),
    the proof every connection makes (:class:`ProvenConnection`) guards the token alone."""
    from ...slurm.commands import Slurm

    try:
        state = Slurm(environ=environ, timeout=SQUEUE_TIMEOUT).job_state(job_id)
    except SlurmTpuError:
        return
    if state != "RUNNING":
        path = address_path(job_id, environ)
        raise ServerError(
            f"job {job_id} is not running ({state or 'Slurm no longer knows it'}): {path} was left "
            "by a server that did not stop cleanly; not connecting (remove the file, start a new "
            "server)",
            path,
        )


class ProvenConnection(http.client.HTTPConnection):
    """An HTTP connection that sends nothing with the token before its listener proved it holds it.

    The proof is made in :meth:`connect`, so every socket is proven, including those
    http.client opens by itself after the server closed a kept-alive connection."""

    def __init__(self, host: str, port: int, token: str, url: str, timeout: float):
        super().__init__(host, port, timeout=timeout)
        self._token = token
        self._url = url

    def connect(self) -> None:
        super().connect()
        try:
            self._prove()
        except BaseException:
            self.close()
            raise

    def _prove(self) -> None:
        nonce = new_nonce()
        challenge = f"GET {PROOF_PATH}?nonce={nonce} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n\r\n"
        assert self.sock is not None
        try:
            self.sock.settimeout(min(PROOF_TIMEOUT, self.timeout or PROOF_TIMEOUT))
            self.sock.sendall(challenge.encode())
            response = http.client.HTTPResponse(self.sock, method="GET")
            try:
                response.begin()
                data = response.read(MAX_PROOF_ANSWER + 1)
                # Read to its end and the connection kept: anything else leaves it unusable.
                whole = response.isclosed() and not response.will_close and len(data) <= MAX_PROOF_ANSWER
                status = response.status
            finally:
                response.close()
            self.sock.settimeout(self.timeout)
        except (OSError, http.client.HTTPException) as exc:
            raise ProofError(
                f"the listener at {self._url} did not answer the proof challenge "
                f"({type(exc).__name__}: {_one_line(str(exc))}): {_NOT_OURS}",
                self._url,
            ) from None
        try:
            answer = json.loads(data) if status == 200 and whole else None
        except ValueError:
            answer = None
        if not isinstance(answer, dict) or not proof_matches(self._token, nonce, answer.get("proof")):
            raise ProofError(
                f"the listener at {self._url} did not prove it holds the server's token (HTTP {status}): {_NOT_OURS}",
                self._url,
            )


def _one_line(text: str, limit: int = 200) -> str:
    """Text a listener chose, fit for our one-line error: printable, one line, short."""
    printable = "".join(c if c.isprintable() else " " for c in text)
    return " ".join(printable.split())[:limit]


_NOT_OURS = (
    "it is not your server, so the token was not sent (did the server die and another program take "
    "its port? check squeue)"
)


class ServeClient:
    """Requests to one server; each thread keeps its own keep-alive connection."""

    def __init__(self, address: Address, timeout: float = 120.0):
        self.address = address
        self.url = address.url
        parts = urlsplit(address.url)
        if parts.scheme != "http" or not parts.hostname:
            raise ServerError(f"server URL {address.url} is not http://HOST:PORT", address.url)
        self._host, self._port = parts.hostname, parts.port or 80
        self._timeout = timeout
        self._local = threading.local()

    def close(self) -> None:
        """Close this thread's connection (its next request opens a new one)."""
        connection = getattr(self._local, "connection", None)
        if connection is not None:
            connection.close()
            self._local.connection = None

    def request(
        self, method: str, path: str, body: bytes = b"", content_type: str = "application/octet-stream"
    ) -> tuple[int, bytes, Mapping[str, str]]:
        """Status, body and headers; reconnects once when a kept-alive connection was closed, and
        waits out 503s (at most RETRIES times)."""
        headers = {"Authorization": f"Bearer {self.address.token}"}
        if method == "POST":
            headers["Content-Type"] = content_type
        for _ in range(RETRIES):
            status, data, answer = self._once(method, path, body, headers)
            if status != 503:
                return status, data, answer
            time.sleep(min(30.0, float(answer.get("Retry-After", "1") or 1)))
        return self._once(method, path, body, headers)

    def _once(self, method: str, path: str, body: bytes, headers: dict[str, str]):
        for retry in (False, True):
            connection = getattr(self._local, "connection", None)
            if connection is None:
                connection = ProvenConnection(self._host, self._port, self.address.token, self.url, self._timeout)
                self._local.connection = connection
            try:
                connection.request(method, path, body=body if method == "POST" else None, headers=headers)
                response = connection.getresponse()
                data = response.read()
                answer = dict(response.getheaders())
                if response.will_close:
                    self.close()
                return response.status, data, answer
            except (ConnectionError, http.client.HTTPException, OSError) as exc:
                self.close()
                # A keep-alive connection the server closed meanwhile fails on first use: retry once.
                if retry or isinstance(exc, (ConnectionRefusedError, TimeoutError, socket.gaierror)):
                    raise ServerError(
                        f"cannot reach the server at {self.url} ({exc.__class__.__name__}: {exc}): "
                        "has its job ended? (squeue)",
                        self.url,
                    ) from None
        raise AssertionError("unreachable")

    def json(self, method: str, path: str, body: bytes = b"", content_type: str = "application/json") -> Any:
        """A JSON answer; a refusal of the whole request (401, 404, 5xx) is a ServerError."""
        status, data, _ = self.request(method, path, body, content_type)
        payload = _decode(data, self.url)
        if status != 200:
            raise ServerError(f"the server at {self.url} answered {status}: {_message(payload)}", self.url)
        return payload


def _decode(data: bytes, url: str) -> Any:
    try:
        return json.loads(data)
    except ValueError:
        raise ServerError(f"the server at {url} did not answer JSON: is that a slurm-tpu server?", url) from None


def _message(payload: Any) -> str:
    return _one_line(str(payload.get("error", payload)) if isinstance(payload, dict) else str(payload), 500)


def _specs(signature: Mapping[str, Any]) -> list[TensorSpec]:
    """Output specs from TF Serving metadata (names, shapes, dtypes: what choosing a task needs)."""
    dtypes = {tf: name for name, tf in DTYPES.items()}
    return [
        TensorSpec(
            name,
            tuple(int(d["size"]) for d in info["tensor_shape"]["dim"]),
            np.dtype(dtypes.get(info["dtype"], "float32")),
        )
        for name, info in signature.items()
    ]


class RemoteModel:
    """A served model as the client sees it: its name and task."""

    def __init__(self, client: ServeClient, model: str, task: str):
        """``model``: MODEL as given to ``infer``, a served name or a .tflite path (its default name)."""
        self.client = client
        self.name = name = default_name(model) if model.endswith(".tflite") else model
        metadata = client.json("GET", f"/v1/models/{quote(name, safe='')}/metadata")
        try:
            extra = metadata.get("metadata", {}).get("slurm_tpu", {})
            signature = metadata["metadata"]["signature_def"]["signature_def"]["serving_default"]
            served_task = str(extra.get("task", "raw"))
            outputs = _specs(signature["outputs"])
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise ServerError(
                f"the server at {client.url} answered model {name}'s metadata without "
                f"TF Serving's signature ({type(exc).__name__}: {_one_line(str(exc), 100)})",
                client.url,
            ) from None
        self.task: Task = choose_task(served_task if task == "auto" else task, outputs, frozenset(), name)[0]

    def infer(self, path: str, options: Mapping[str, Any]) -> dict[str, Any]:
        """The record for one input file (without its ``input`` field) from the task endpoint; a
        refusal of the input itself is an InputError."""
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except FileNotFoundError:
            raise InputError(f"input {path} does not exist", path) from None
        except OSError as exc:
            raise InputError(f"input {path} cannot be read ({exc.strerror})", path) from None
        url, query = self.client.url, urlencode({k: v for k, v in options.items() if v is not None})
        endpoint = f"/v1/models/{quote(self.name, safe='')}:{self.task.name}" + (f"?{query}" if query else "")
        status, body, _ = self.client.request("POST", endpoint, data)
        payload = _decode(body, url)
        if status in (400, 413):
            raise InputError(f"input {path}: the server refused it ({_message(payload)})", path)
        if status != 200:
            raise ServerError(f"the server at {url} answered {status} for {path}: {_message(payload)}", url)
        lines = payload.get("lines", []) if isinstance(payload, dict) else None
        if not isinstance(lines, list) or not all(isinstance(line, str) for line in lines):
            raise ServerError(f"the server at {url} answered {path} with something not a task's record", url)
        return payload


def remote_records(
    model: RemoteModel, keys: Sequence[str], options: Mapping[str, Any], in_flight: int
) -> Iterator[dict[str, Any]]:
    """Every input's record, in input order, ``in_flight`` requests at a time. An input the
    server refuses gets an ``error`` record; a server that fails altogether raises ServerError."""
    from ..pipeline import decode_ordered

    def load(key: str) -> tuple[list[np.ndarray], dict[str, Any] | ServerError]:
        try:
            return [], model.infer(key, options)
        except ServerError as exc:  # past the pipeline's per-input errors (InputError) to the consumer
            return [], exc

    for item in decode_ordered(keys, load, threads=in_flight, lookahead=2 * in_flight):
        if isinstance(item.meta, ServerError):
            raise item.meta
        yield {"input": item.key, "error": item.error} if item.error is not None else {"input": item.key, **item.meta}


# Per-request details the server adds to a task's record, not part of the result itself.
SERVER_FIELDS = ("task", "devices", "runtime", "times_ms", "lines")


def result_fields(record: Mapping[str, Any]) -> dict[str, Any]:
    """A served record without the per-request details: what ``slurm-tpu infer`` writes per input."""
    return {k: v for k, v in record.items() if k not in SERVER_FIELDS}
