"""A slow-header flood against 127.0.0.1:PORT for the serve tests (standard library only).

    python serve_flooder.py PORT COUNT TRICKLE SECONDS

COUNT connections each send a request line, then one header line every TRICKLE seconds
and never finish the head; one the server closes is opened again a second later. It stops
once its stdin is closed and SECONDS have passed. It prints a line of JSON once all COUNT are
open, and one at the end: connections opened, the lifetimes of those the server closed, the
ages of those still open, and the first bytes of any answer received.
"""

import json
import selectors
import socket
import sys
import time

port, count, trickle, seconds = int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4])
start = time.monotonic()
end = start + seconds
selector = selectors.DefaultSelector()
conns = {}  # socket -> [opened, next line due, lines sent]
reopen = []  # times at which a closed connection is opened again
lifetimes, answers, opened = [], [], 0


def open_one():
    global opened
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    sock.setblocking(False)
    sock.send(b"GET /v1/models/c HTTP/1.1\r\n")
    now = time.monotonic()
    conns[sock] = [now, now + trickle, 0]
    selector.register(sock, selectors.EVENT_READ)
    opened += 1


def closed(sock, data=b""):
    opened_at = conns.pop(sock)[0]
    selector.unregister(sock)
    sock.close()
    lifetimes.append(time.monotonic() - opened_at)
    if data:
        answers.append(data[:40].decode("latin-1"))
    reopen.append(time.monotonic() + 1.0)


for _ in range(count):
    open_one()
print(json.dumps({"started": opened}), flush=True)
told_to_stop = False
selector.register(sys.stdin, selectors.EVENT_READ)
while not (told_to_stop and time.monotonic() >= end):
    for key, _ in selector.select(0.1):
        if key.fileobj is sys.stdin:
            told_to_stop = told_to_stop or not sys.stdin.readline()
            if told_to_stop:
                selector.unregister(sys.stdin)
            continue
        try:
            data = key.fileobj.recv(4096)
        except OSError:
            data = b""
        closed(key.fileobj, data)
    now = time.monotonic()
    for sock, state in list(conns.items()):
        if now >= state[1]:
            try:
                sock.send(b"X-Trickle-%d: %d\r\n" % (state[2], state[2]))
            except OSError:
                closed(sock)
                continue
            state[1], state[2] = now + trickle, state[2] + 1
    due = [t for t in reopen if t <= now]
    reopen[:] = [t for t in reopen if t > now]
    for _ in due:
        try:
            open_one()
        except OSError:
            reopen.append(now + 1.0)
now = time.monotonic()
still_open = [now - state[0] for state in conns.values()]
print(json.dumps({"opened": opened, "lifetimes": lifetimes, "still_open": still_open, "answers": answers}))
