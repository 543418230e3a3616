"""A minimal /metrics HTTP endpoint (stdlib http.server), for sites without node_exporter."""

from __future__ import annotations

from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Callable

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def serve(host: str, port: int, render: Callable[[], str]) -> None:
    """Serve ``render()`` at /metrics until interrupted."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404, "only /metrics is served")
                return
            body = render().encode()
            self.send_response(200)
            self.send_header("Content-Type", CONTENT_TYPE)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:  # scrapes every 15 s would flood the journal
            pass

    server = ThreadingHTTPServer((host, port), Handler)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
