"""HTTP/1.1 for the server: the standard library's ThreadingHTTPServer, kept on a short leash.

The standard library was chosen by measurement against aiohttp (docs/benchmarks.md,
``bench/bench_serve_http.py``); a thread per connection is fine as connections are capped and
time out. Anyone can connect, so whoever lacks the token must never use up what its
holder gets: a connection is *pending* from accept until a request head carrying the
token arrived, then *authenticated*, and the two are counted apart. A pending one has
:attr:`Limits.head_deadline` seconds from accept (not per read) and :attr:`Limits.max_head`
bytes to send that head; over :attr:`Limits.max_pending_per_peer` of one peer or
:attr:`Limits.max_pending` in all, a new connection closes the oldest pending one rather
than being refused, so a flood of slow connections churns only itself. Only
authenticated connections count against :attr:`Limits.max_connections`.

Before the application sees a request this layer checks the token (before the body is
read), the body's size and the bytes of bodies held at once (the statuses: docs/user-guide.md).
The one request answered without the token is the proof challenge (:data:`~.auth.PROOF_PATH`),
once per pending connection. A handler bug is a JSON 500 for that request only.
"""

from __future__ import annotations

import contextlib
import io
import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

from .app import JSON_TYPE, Response, Route, ServeApp, json_response
from .auth import PROOF_PATH, SCHEME, proof, token_matches, valid_nonce
from .codec import RequestError

_SHUTTING_DOWN = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\n"
    b"Connection: close\r\nContent-Length: 39\r\n\r\n"
    b'{"error":"the server is shutting down"}'
)


class ServeHTTPServer(ThreadingHTTPServer):
    """A thread per connection; pending and authenticated connections counted apart (module docstring)."""

    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128

    def __init__(self, address: tuple[str, int], app: ServeApp):
        self.app = app
        # Connections that have not shown the token yet, oldest first: (peer address, time.monotonic()
        # by which their request head with the token must be in).
        self._pending: dict[socket.socket, tuple[str, float]] = {}
        self._authenticated: set[socket.socket] = set()
        self._lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request, client_address) -> None:
        limits = self.app.limits
        peer = str(client_address[0]) if isinstance(client_address, tuple) else ""
        with self._lock:
            refuse = self.app.draining
            if not refuse:
                same_peer = [s for s, (p, _) in self._pending.items() if p == peer]
                if len(same_peer) >= limits.max_pending_per_peer:
                    self._evict(same_peer[0])
                elif len(self._pending) >= limits.max_pending:
                    self._evict(next(iter(self._pending)))
                self._pending[request] = (peer, time.monotonic() + limits.head_deadline)
                self._count()
        if refuse:  # draining; answered from the accepting thread: never block it on a slow client
            with contextlib.suppress(OSError):
                request.setblocking(False)
                request.send(_SHUTTING_DOWN)
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def _evict(self, sock: socket.socket) -> None:
        """Forget a pending connection and wake its thread (its read returns EOF; the thread closes it)."""
        del self._pending[sock]
        _wake(sock)

    def _count(self) -> None:
        self.app.connections = len(self._authenticated)
        self.app.pending_connections = len(self._pending)

    def deadline(self, sock: socket.socket) -> float:
        """When a new connection's time to authenticate ends (already passed if it was evicted)."""
        with self._lock:
            pending = self._pending.get(sock)
            return pending[1] if pending is not None else 0.0

    def authenticate(self, sock: socket.socket) -> bool | None:
        """Move a pending connection to the authenticated ones: True; False when those are at
        :attr:`Limits.max_connections` (the holder's own load: 503); None when it was evicted."""
        with self._lock:  # called once per connection, on its first request with the token
            if self._pending.pop(sock, None) is None:
                return None
            admitted = len(self._authenticated) < self.app.limits.max_connections
            if admitted:
                self._authenticated.add(sock)
            self._count()
            return admitted

    def shutdown_request(self, request) -> None:
        # The connection forgotten before it is closed: an eviction never shuts down a socket
        # object its thread has already closed.
        with self._lock:
            self._pending.pop(request, None)
            self._authenticated.discard(request)
            self._count()
        super().shutdown_request(request)

    def handle_error(self, request, client_address) -> None:
        pass  # a client that vanished mid-answer, or one closed at its deadline; nothing to tell anyone

    def close_connections(self) -> None:
        """Wake every connection thread (idle keep-alives block in a read) so it ends."""
        with self._lock:
            sockets = [*self._pending, *self._authenticated]
        for sock in sockets:
            _wake(sock)


def _wake(sock: socket.socket) -> None:
    """Shut a connection's socket down: its thread's read returns EOF and the thread closes it."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class _HeadLimitedReader(socket.SocketIO):
    """A connection's reads: until it is authenticated, each read waits only for what is left of
    the head deadline, and the bytes read are capped; afterwards plain reads (``io_timeout`` each)."""

    def __init__(self, sock: socket.socket, deadline: float | None, max_bytes: int, io_timeout: float):
        super().__init__(sock, "rb")
        self._socket = sock  # SocketIO keeps it as the private, untyped _sock
        self.deadline = deadline
        self._left = max_bytes
        self._io_timeout = io_timeout

    def authenticated(self) -> None:
        self.deadline = None
        self._socket.settimeout(self._io_timeout)

    def readinto(self, buffer) -> int | None:
        if self.deadline is None:
            return super().readinto(buffer)
        left = self.deadline - time.monotonic()
        if left <= 0 or self._left <= 0:
            raise TimeoutError("no request head with the token in time")  # http.server closes the connection
        self._socket.settimeout(min(left, self._io_timeout))
        count = super().readinto(memoryview(buffer)[: self._left])
        self._left -= count or 0
        return count


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: one connection carries many requests
    default_request_version = "HTTP/1.1"  # errors about unparsable request lines get a status line too
    disable_nagle_algorithm = True  # headers and body go out at once, no 40 ms delayed-ACK stall
    server_version = "slurm-tpu-serve"
    server: ServeHTTPServer

    def version_string(self) -> str:
        return self.server_version  # not the Python version: nothing for a prober to learn

    def setup(self) -> None:
        limits = self.server.app.limits
        # Per connection (typeshed declares the class's default a ClassVar): idle keep-alives and stalled bodies end.
        self.timeout = limits.io_timeout  # type: ignore[misc]
        super().setup()
        self.rfile.close()  # replaced: reads before the token keep to the head deadline
        self._reader = _HeadLimitedReader(
            self.connection, self.server.deadline(self.connection), limits.max_head, limits.io_timeout
        )
        self.rfile = io.BufferedReader(self._reader)
        self._challenged = False

    def do_GET(self) -> None:  # POST's too (do_POST below): self.command tells them apart
        app, method = self.server.app, self.command
        started = time.perf_counter()
        path, _, query = self.path.partition("?")
        route: Route | None = None
        held = 0
        consumed = method != "POST"  # whether the connection is past this request's body
        if not app.begin():
            self._refuse(RequestError(503, "the server is shutting down", retry_after=1), close=True)
            return
        try:
            if path == PROOF_PATH and method == "GET":  # the one request answered without the token
                route = Route("proof")
                response = self._prove(query)
            else:
                if not token_matches(self.headers.get("Authorization"), app.token):
                    raise RequestError(
                        401,
                        "missing or wrong token: send 'Authorization: Bearer <token>' with the "
                        "token from ~/.slurm-tpu/serve/<jobid>.json",
                    )
                if self._reader.deadline is not None:
                    self._admit()
                route = app.route(method, path)
                body = b""
                if method == "POST":
                    held = self._content_length()
                    if not app.hold(held):
                        held = 0
                        raise RequestError(503, "the server holds too many request bodies: retry later", retry_after=1)
                    body = self.rfile.read(held)
                    if len(body) != held:
                        raise ConnectionError("the client closed the connection mid-body")
                    consumed = True
                response = app.dispatch(route, body, self.headers.get("Content-Type", ""), query)
            self._send(response)
        except RequestError as exc:
            # A body left unread would be taken for the next request: close the connection then.
            self._refuse(exc, close=not consumed or exc.status == 401 or self.close_connection)
        except (ConnectionError, TimeoutError):
            self.close_connection = True
        except Exception as exc:  # noqa: BLE001 - a bug must cost one request, not the server
            self._refuse(RequestError(500, f"internal error ({type(exc).__name__}: {str(exc)[:200]})"), close=True)
        finally:
            if held:
                app.release(held)
            app.end()
        model = route.model.name if route is not None and route.model is not None else ""
        # The status _send sent (when none was sent: the connection's previous one, or 0).
        app.metrics.observe(
            model, route.endpoint if route is not None else "other", self._status, time.perf_counter() - started
        )

    do_POST = do_GET  # noqa: N815 - http.server's name

    def _admit(self) -> None:
        """A pending connection just showed the token: count it with the authenticated ones."""
        admitted = self.server.authenticate(self.connection)
        if admitted is None:  # closed as the oldest pending connection meanwhile
            raise ConnectionError("evicted")
        if not admitted:  # counted as neither pending nor authenticated now: close it
            self.close_connection = True
            raise RequestError(503, "too many connections: retry in a few seconds", retry_after=1)
        self._reader.authenticated()

    def _prove(self, query: str) -> Response:
        """The answer to the proof challenge (auth's module docstring): once per pending connection."""
        if self._challenged and self._reader.deadline is not None:
            raise RequestError(401, "one proof per connection: send the token next")
        self._challenged = True
        nonce = parse_qs(query).get("nonce", [""])[0]
        if not valid_nonce(nonce):
            raise RequestError(400, "the proof challenge needs ?nonce= with 64 to 128 lowercase hex digits")
        return json_response(200, {"proof": proof(self.server.app.token, nonce), "scheme": "hmac-sha256"})

    def _content_length(self) -> int:
        if self.headers.get("Transfer-Encoding"):
            raise RequestError(411, "chunked bodies are not accepted: send a Content-Length")
        value = self.headers.get("Content-Length")
        if value is None or not value.strip().isdigit():
            raise RequestError(411, "a POST needs a Content-Length header with the body's size")
        length = int(value)
        limit = self.server.app.limits.max_body
        if length > limit:
            raise RequestError(
                413,
                f"the body is {length} bytes, more than {limit} allowed: send smaller "
                "requests (or start the server with a larger --max-body)",
            )
        return length

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
            self._send(Response(error.status, json.dumps({"error": str(error)}).encode(), JSON_TYPE), extra)
        except OSError:
            self.close_connection = True

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Malformed requests (bad request line, too many headers...) get a JSON line too."""
        self._refuse(RequestError(code, message or self.responses.get(code, ("error",))[0]), close=True)

    def log_message(self, format: str, *args) -> None:
        pass  # one line per request would flood the job's log; /metrics counts them
