#!/usr/bin/env python3
"""Which HTTP stack for `slurm-tpu serve`: the standard library's ThreadingHTTPServer
(as the server configures it: HTTP/1.1 keep-alive, TCP_NODELAY) vs aiohttp, and the
server's own HTTP layer (``serve``: ServeHTTPServer with its token check, connection
limits and head deadline, behind an app that answers at once).

Each server runs in its own process and answers a POST of a ~8 KB body (a small JPEG's
size) with a small JSON record after no work at all, so only the HTTP stack is timed.
Clients are threads in this process, each with one keep-alive connection
(http.client), 1 and 8 at a time, a fixed number of requests each; every request
carries the token. Rounds alternate the stacks; medians are reported: microseconds
per request at 1 client (latency), requests/s at 8 clients (throughput), and
microseconds per request on a fresh connection each (what curl pays: the accept path).
aiohttp is measured only if importable (``PYTHONPATH=/tmp/aiohttp-lib`` after
``pip install --target /tmp/aiohttp-lib aiohttp``).

    .venv/bin/python bench/bench_serve_http.py [--requests 2000] [--rounds 3]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time

BODY = os.urandom(8192)
TOKEN = "bench-token"
ANSWER = json.dumps({"task": "classify", "classes": [{"index": 1, "label": "top", "score": 0.99}]}).encode()


def serve_stdlib() -> None:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(ANSWER)))
            self.end_headers()
            self.wfile.write(ANSWER)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    print(server.server_address[1], flush=True)
    server.serve_forever()


def serve_ours() -> None:
    from slurm_tpu.runner.serve.app import Limits, Response, Route, ServeApp
    from slurm_tpu.runner.serve.devicequeue import DeviceQueue
    from slurm_tpu.runner.serve.httpserver import ServeHTTPServer

    class App(ServeApp):
        """Every path is one endpoint answered at once: only the HTTP layer is timed."""

        def route(self, method: str, path: str) -> Route:
            return Route("classify")

        def dispatch(self, route, body, content_type, query) -> Response:
            return Response(200, ANSWER)

    server = ServeHTTPServer(("127.0.0.1", 0), App([], DeviceQueue([], 1), Limits(), TOKEN))
    print(server.server_address[1], flush=True)
    server.serve_forever()


def serve_aiohttp() -> None:
    import asyncio
    import socket

    from aiohttp import web

    async def handle(request):
        await request.read()
        return web.Response(body=ANSWER, content_type="application/json")

    async def main() -> None:
        app = web.Application()
        app.router.add_post("/v1/models/m:classify", handle)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        site = web.SockSite(runner, sock)
        await site.start()
        print(sock.getsockname()[1], flush=True)
        await asyncio.Event().wait()

    asyncio.run(main())


def clients(port: int, count: int, requests: int) -> tuple[float, float]:
    """(requests/s over all clients, median seconds per request)."""
    times: list[float] = []
    lock = threading.Lock()

    def one() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port)
        mine = []
        for _ in range(requests):
            started = time.perf_counter()
            connection.request("POST", "/v1/models/m:classify", body=BODY, headers=HEADERS)
            response = connection.getresponse()
            response.read()
            mine.append(time.perf_counter() - started)
        connection.close()
        with lock:
            times.extend(mine)

    threads = [threading.Thread(target=one) for _ in range(count)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return count * requests / (time.perf_counter() - started), statistics.median(times)


HEADERS = {"Authorization": f"Bearer {TOKEN}"}


def fresh_connections(port: int, requests: int) -> float:
    """Median seconds per request, each on a new connection (connect, request, close)."""
    times = []
    for _ in range(requests):
        started = time.perf_counter()
        connection = http.client.HTTPConnection("127.0.0.1", port)
        connection.request("POST", "/v1/models/m:classify", body=BODY, headers=HEADERS)
        connection.getresponse().read()
        connection.close()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", choices=("stdlib", "serve", "aiohttp"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        {"stdlib": serve_stdlib, "serve": serve_ours, "aiohttp": serve_aiohttp}[args.serve]()
        return 0
    stacks = ["stdlib", "serve"]
    try:
        import aiohttp  # noqa: F401

        stacks.append("aiohttp")
    except ImportError:
        print("aiohttp not importable: measuring the standard library only", file=sys.stderr)
    servers, ports = {}, {}
    for stack in stacks:
        servers[stack] = subprocess.Popen(
            [sys.executable, __file__, "--serve", stack], stdout=subprocess.PIPE, text=True
        )
        ports[stack] = int(servers[stack].stdout.readline())
    results: dict[str, dict[str, list[float]]] = {
        s: {"latency_us_1": [], "per_s_1": [], "per_s_8": [], "fresh_connection_us": []} for s in stacks
    }
    try:
        for stack in stacks:  # warm-up
            clients(ports[stack], 8, 50)
        for r in range(args.rounds):
            for stack in stacks if r % 2 == 0 else stacks[::-1]:
                rate1, latency = clients(ports[stack], 1, args.requests)
                rate8, _ = clients(ports[stack], 8, args.requests // 8)
                results[stack]["latency_us_1"].append(latency * 1e6)
                results[stack]["per_s_1"].append(rate1)
                results[stack]["per_s_8"].append(rate8)
                results[stack]["fresh_connection_us"].append(fresh_connections(ports[stack], args.requests // 4) * 1e6)
    finally:
        for server in servers.values():
            server.kill()
            server.wait()
    summary = {s: {k: round(statistics.median(v), 1) for k, v in m.items()} for s, m in results.items()}
    print(json.dumps({"requests": args.requests, "rounds": args.rounds, "cpus": os.cpu_count(), **summary}, indent=2))
    if "aiohttp" in summary:
        a, s = summary["aiohttp"], summary["stdlib"]
        print(
            f"stdlib/aiohttp: latency at 1 client {s['latency_us_1'] / a['latency_us_1']:.2f}x, "
            f"throughput at 8 clients {s['per_s_8'] / a['per_s_8']:.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
