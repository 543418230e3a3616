"""Helpers for the serve tests (``from serve_support import ...``): a server on loopback, requests."""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from slurm_tpu.runner.request import Preprocessing
from slurm_tpu.runner.serve.app import Limits
from slurm_tpu.runner.serve.models import ModelArg, open_served
from slurm_tpu.runner.serve.server import Listen, Server
from slurm_tpu.runner.session import OpenOptions


def start_server(
    models: Sequence[tuple[str, str]],
    labels: Mapping[str, str],
    environ: Mapping[str, str],
    limits: Limits = Limits(),
    wrap=None,
) -> Server:
    """Open (path, name) models on the environment's devices and serve them on 127.0.0.1.

    ``wrap(engine) -> engine`` wraps every engine (to gate or observe the devices)."""
    engine_set, served = open_served(
        [ModelArg(p, n) for p, n in models], labels, OpenOptions(), Preprocessing(), environ, lambda message: None
    )
    if wrap is not None:
        for model in served:
            model.engines = [wrap(e) for e in model.engines]
    server = Server(served, Listen("127.0.0.1", 0), limits, runtime=engine_set.runtime, engine_set=engine_set)
    server.start()
    return server


class Client:
    """One keep-alive connection with the server's token (or another)."""

    def __init__(self, server: Server, token: str | None = "", timeout: float = 60):
        self.port = server.port
        self.token = server.token if token == "" else token
        self.connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)

    def request(
        self, method: str, path: str, body: bytes | None = None, headers: Mapping[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        sent = dict(headers or {})
        if self.token is not None:
            sent.setdefault("Authorization", f"Bearer {self.token}")
        try:
            self.connection.request(method, path, body=body, headers=sent)
            response = self.connection.getresponse()
            data = response.read()
        except (ConnectionError, http.client.HTTPException):
            self.connection.close()
            raise
        if response.will_close:
            self.connection.close()
        return response.status, dict(response.getheaders()), data

    def json(
        self,
        method: str,
        path: str,
        payload: Any = None,
        body: bytes | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> tuple[int, Any]:
        if payload is not None:
            body = json.dumps(payload).encode()
            headers = {"Content-Type": "application/json", **(headers or {})}
        status, _, data = self.request(method, path, body, headers)
        return status, json.loads(data)

    def close(self) -> None:
        self.connection.close()


def raw_exchange(port: int, data: bytes, timeout: float = 30) -> bytes:
    """Send bytes on a fresh connection and read until the server closes it."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(data)
        chunks = []
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return b"".join(chunks)
            chunks.append(chunk)


class GatedEngine:
    """An engine that holds each inference until released: a device kept busy on purpose, to
    observe queueing deterministically. Counts inferences running at once (must stay <= 1)."""

    def __init__(self, engine):
        self._engine = engine
        self.label, self.inputs, self.outputs = engine.label, engine.inputs, engine.outputs
        self.entered = threading.Semaphore(0)  # released once per inference that started
        self.gate = threading.Semaphore(0)  # one release lets one inference finish
        self.running = 0
        self.most_at_once = 0
        self._lock = threading.Lock()

    def run(self, inputs):
        with self._lock:
            self.running += 1
            self.most_at_once = max(self.most_at_once, self.running)
        self.entered.release()
        self.gate.acquire()
        try:
            return self._engine.run(inputs)
        finally:
            with self._lock:
                self.running -= 1

    def __getattr__(self, name):
        return getattr(self._engine, name)


class Listener:
    """A listener on 127.0.0.1 that is not the server (a squatter on its port, in tests): it
    records every byte each connection sends and answers each request with ``answer(number,
    request_head) -> bytes`` (number: the connection's, from 0; b"" closes the connection)."""

    def __init__(self, answer, port: int = 0):
        self.answer = answer
        self.received: list[bytearray] = []
        self._sock = socket.create_server(("127.0.0.1", port), reuse_port=False)
        self.port = self._sock.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    @property
    def everything(self) -> bytes:
        return b"".join(bytes(r) for r in self.received)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            record = bytearray()
            self.received.append(record)
            threading.Thread(target=self._serve, args=(conn, len(self.received) - 1, record), daemon=True).start()

    def _serve(self, conn: socket.socket, number: int, record: bytearray) -> None:
        conn.settimeout(30)
        with conn:
            pending = b""
            while True:
                try:
                    chunk = conn.recv(65536)
                except OSError:
                    return
                if not chunk:
                    return
                record.extend(chunk)
                pending += chunk
                while b"\r\n\r\n" in pending:
                    head, _, pending = pending.partition(b"\r\n\r\n")
                    length = next(
                        (
                            int(line.split(b":", 1)[1])
                            for line in head.split(b"\r\n")
                            if line.lower().startswith(b"content-length:")
                        ),
                        0,
                    )
                    while len(pending) < length:
                        chunk = conn.recv(65536)
                        if not chunk:
                            return
                        record.extend(chunk)
                        pending += chunk
                    pending = pending[length:]
                    reply = self.answer(number, head)
                    if not reply:
                        return
                    conn.sendall(reply)

    def close(self) -> None:
        self._sock.close()


def http_answer(body: bytes, status: str = "200 OK", extra: str = "") -> bytes:
    """A whole HTTP/1.1 response with ``body`` (JSON)."""
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n".encode()
        + body
    )
