"""HTTP/1.1 for the server: the standard library's ThreadingHTTPServer, kept on a short leash.

Why the standard library, measured on loopback (``bench/bench_serve_http.py``, 2 cores,
an 8 KB POST answered with a small JSON record): 118 us per keep-alive request at 1
client (aiohttp 132 us) and 8,400 requests/s at 8 clients (aiohttp 11,400). aiohttp
scales better under many clients, but 8,400/s is some 20x what an Edge TPU infers
(2.6 ms each), lower latency is what an interactive user feels, and the standard
library needs nothing a fresh install might lack. A thread per connection is fine
because connections are capped (:attr:`Limits.max_connections`) and time out when idle.

What this layer enforces, before the application sees a request: the token (every
request, checked before the body is read; 401 and the connection closed), the body
size (``Content-Length`` required, at most :attr:`Limits.max_body`: 411/413), the
bytes of bodies held at once (503), stalled clients (:attr:`Limits.io_timeout`), and
while draining, 503 with ``Connection: close``. Malformed requests get JSON errors
too, never a traceback; a handler bug is a 500 for that request only.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .app import JSON_TYPE, Response, Route, ServeApp
from .auth import SCHEME, token_matches
from .codec import RequestError, error_body

_OVERLOADED = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
               b"Connection: close\r\nContent-Length: 56\r\n\r\n"
               b'{"error":"too many connections: retry in a few seconds"}')


class ServeHTTPServer(ThreadingHTTPServer):
    """Threads per connection, at most ``max_connections`` of them; tracks them to close idle ones."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], app: ServeApp):
        self.app = app
        self._open: set[socket.socket] = set()
        self._lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request, client_address) -> None:
        with self._lock:
            refuse = len(self._open) >= self.app.limits.max_connections or self.app.draining
            if not refuse:
                self._open.add(request)
                self.app.connections = len(self._open)
        if refuse:  # answered from the accepting thread: never block it on a slow client
            try:
                request.setblocking(False)
                request.send(_OVERLOADED)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._lock:
                self._open.discard(request)
                self.app.connections = len(self._open)

    def handle_error(self, request, client_address) -> None:
        pass  # a client that vanished mid-answer; nothing to tell anyone

    def close_connections(self) -> None:
        """Wake every connection thread (idle keep-alives block in a read) so it ends."""
        with self._lock:
            sockets = list(self._open)
        for sock in sockets:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: one connection carries many requests
    default_request_version = "HTTP/1.1"  # errors about unparsable request lines get a status line too
    disable_nagle_algorithm = True  # headers and body go out at once, no 40 ms delayed-ACK stall
    server_version = "slurm-tpu-serve"
    server: ServeHTTPServer

    def version_string(self) -> str:
        return self.server_version  # not the Python version: nothing for a prober to learn

    def setup(self) -> None:
        self.timeout = self.server.app.limits.io_timeout  # idle keep-alives and stalled bodies end
        super().setup()

    def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
        self._handle("GET")

    def do_POST(self) -> None:  # noqa: N802
        self._handle("POST")

    def _handle(self, method: str) -> None:
        app = self.server.app
        started = time.perf_counter()
        path, _, query = self.path.partition("?")
        route: Route | None = None
        held = 0
        consumed = method != "POST"  # whether the connection is past this request's body
        if not app.begin():
            self._refuse(RequestError(503, "the server is shutting down", retry_after=1), close=True)
            return
        try:
            if not token_matches(self.headers.get("Authorization"), app.token):
                raise RequestError(401, "missing or wrong token: send 'Authorization: Bearer <token>' with the "
                                   "token from ~/.slurm-tpu/serve/<jobid>.json")
            route = app.route(method, path)
            body = b""
            if method == "POST":
                held = self._content_length()
                if not app.budget.take(held):
                    held = 0
                    raise RequestError(503, "the server holds too many request bodies: retry later", retry_after=1)
                body = self._read_body(held)
                consumed = True
            response = app.dispatch(route, body, self.headers.get("Content-Type", ""), query)
            self._send(response)
        except RequestError as exc:
            # A body left unread would be taken for the next request: close the connection then.
            self._refuse(exc, close=not consumed or exc.status == 401 or self.close_connection)
            response = None
        except (ConnectionError, TimeoutError):
            self.close_connection = True
            response = None
        except Exception as exc:  # a bug must cost one request, not the server
            self._refuse(RequestError(500, f"internal error ({type(exc).__name__}: {str(exc)[:200]})"), close=True)
            response = None
        finally:
            if held:
                app.budget.give(held)
            app.end()
        status = response.status if response is not None else self._status
        model = route.model.name if route is not None and route.model is not None else ""
        app.metrics.observe(model, route.endpoint if route is not None else "other", status,
                            time.perf_counter() - started)

    def _content_length(self) -> int:
        if self.headers.get("Transfer-Encoding"):
            raise RequestError(411, "chunked bodies are not accepted: send a Content-Length")
        value = self.headers.get("Content-Length")
        if value is None or not value.strip().isdigit():
            raise RequestError(411, "a POST needs a Content-Length header with the body's size")
        length = int(value)
        limit = self.server.app.limits.max_body
        if length > limit:
            raise RequestError(413, f"the body is {length} bytes, more than {limit} allowed: send smaller "
                               "requests (or start the server with a larger --max-body)")
        return length

    def _read_body(self, length: int) -> bytes:
        body = self.rfile.read(length)
        if len(body) != length:
            raise ConnectionError("the client closed the connection mid-body")
        return body

    _status = 0

    def _send(self, response: Response, extra: dict[str, str] | None = None) -> None:
        self._status = response.status
        self.send_response(response.status)
        self.send_header("Content-Type", response.content_type)
        self.send_header("Content-Length", str(len(response.body)))
        for key, value in (extra or {}).items():
            self.send_header(key, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(response.body)

    def _refuse(self, error: RequestError, close: bool) -> None:
        extra = {}
        if error.retry_after is not None:
            extra["Retry-After"] = str(error.retry_after)
        if error.status == 401:
            extra["WWW-Authenticate"] = f'{SCHEME} realm="slurm-tpu serve"'
        if close:
            self.close_connection = True
        try:
            self._send(Response(error.status, json.dumps(error_body(error.message)).encode(), JSON_TYPE), extra)
        except OSError:
            self.close_connection = True

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Malformed requests (bad request line, too many headers...) get a JSON line too."""
        self.close_connection = True
        self._refuse(RequestError(code, message or self.responses.get(code, ("error",))[0]), close=True)

    def log_message(self, format: str, *args) -> None:  # noqa: A002
        pass  # one line per request would flood the job's log; /metrics counts them
