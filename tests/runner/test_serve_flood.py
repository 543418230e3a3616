"""A slow-header flood without the token must not lock out the token's holder.

FLOOD connections (more than the server's connection cap) each trickle one header line
per TRICKLE seconds, under the per-read timeout, and reconnect a second after the
server closes them; meanwhile the owner sends requests, on fresh connections (as curl
does) and on a kept-alive one, through and past the idle timeout. The server
guarantees: every owner request made while the flood goes on is answered 200 (a new
connection evicts the oldest pending one; the owner's is never the one refused), and no flood
connection lives much past its head deadline. The flood runs in its own process (so
the test's threads do not compete with the server for the GIL), against 127.0.0.1
only, until the test closes its stdin.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

from serve_support import Client, start_server

from slurm_tpu.runner.serve.app import Limits

FLOOD = 128
IO_TIMEOUT = 6.0  # the server's idle/per-read timeout (30 s by default), and here its head deadline too
TRICKLE = 1.5  # seconds between header lines: under the per-read timeout
FLOOD_SECONDS = 2.5 * IO_TIMEOUT  # through and past the idle timeout
SLACK = 4.0  # seconds a flood connection may outlive its head deadline (accept, scheduling under load)

FLOODER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "serve_flooder.py")


def test_a_slow_header_flood_never_locks_out_the_token_holder(models, clean_env):
    server = start_server([(str(models["classifier"]), "c")], {}, clean_env, limits=Limits(io_timeout=IO_TIMEOUT))
    flood = subprocess.Popen(
        [sys.executable, FLOODER, str(server.port), str(FLOOD), str(TRICKLE), str(FLOOD_SECONDS)],
        stdin=subprocess.PIPE,  # it floods until this closes (and FLOOD_SECONDS have passed)
        stdout=subprocess.PIPE,
        text=True,
    )
    owner = Client(server, timeout=30)
    results: list[tuple[str, float, int]] = []
    try:
        assert json.loads(flood.stdout.readline()) == {"started": FLOOD}  # all open: now the owner comes
        started = time.monotonic()
        while time.monotonic() - started < FLOOD_SECONDS - 1:
            for kind in ("fresh", "kept-alive"):
                began = time.monotonic()
                if kind == "fresh":
                    with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
                        sock.sendall(
                            f"GET /v1/models/c HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {server.token}"
                            "\r\nConnection: close\r\n\r\n".encode()
                        )
                        answer = b""
                        while chunk := sock.recv(65536):
                            answer += chunk
                    status = int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0
                else:
                    try:
                        status = owner.request("GET", "/v1/models/c")[0]
                    except (ConnectionError, OSError):
                        status = 0
                        owner = Client(server, timeout=30)
                results.append((kind, time.monotonic() - began, status))
            time.sleep(0.2)
        assert flood.poll() is None  # every owner request came while the flood went on
        report = json.loads(flood.communicate(timeout=FLOOD_SECONDS + 30)[0])
    finally:
        if flood.poll() is None:
            flood.kill()
            flood.wait(10)
        owner.close()
        server.stop(5)
    assert results  # (how fast they are answered under a flood is for a benchmark to say, not a test)
    failed = [r for r in results if r[2] != 200]
    assert not failed, f"{len(failed)} of {len(results)} owner requests failed, e.g. {failed[:5]}"
    assert report["opened"] > FLOOD and not report["answers"], report["answers"][:5]  # closed, never answered
    longest = max(report["lifetimes"] + report["still_open"])
    assert longest <= IO_TIMEOUT + SLACK, f"a flood connection stayed {longest:.1f} s (head deadline {IO_TIMEOUT} s)"


def test_a_head_without_the_token_stops_at_max_head(models, clean_env):
    """60 header lines of 2 KiB (each and all within http.server's own limits) and no token: the
    server stops reading at Limits.max_head and closes without an answer."""
    server = start_server([(str(models["classifier"]), "c")], {}, clean_env)
    try:
        with socket.create_connection(("127.0.0.1", server.port), timeout=30) as sock:
            head = (
                b"GET /v1/models/c HTTP/1.1\r\n"
                + b"".join(b"X-Pad-%d: %s\r\n" % (i, b"a" * 2048) for i in range(60))
                + b"\r\n"
            )
            try:
                sock.sendall(head)
            except OSError:
                pass  # reset once the server closed: that is the point
            try:
                answer = sock.recv(65536)
            except ConnectionResetError:
                answer = b""
        assert answer == b"", answer[:80]
        assert server.app.limits.max_head < len(head)
    finally:
        server.stop(5)
