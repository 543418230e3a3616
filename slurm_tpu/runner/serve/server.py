"""A server's life: open the devices, listen, publish the address, stop gracefully.

:func:`serve_job` is ``slurm-tpu serve``: it blocks SIGTERM and SIGINT first, so a ``scancel``
during start-up still ends in the graceful stop docs/user-guide.md describes (devices
released in the runner's order: interpreters, delegates, locks).
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Callable

from ..errors import UsageError
from ..request import OpenOptions, Preprocessing
from ..session import EngineSet
from .app import Limits, ServeApp
from .auth import Address, address_path, new_token, remove_address, write_address
from .devicequeue import DeviceQueue
from .httpserver import ServeHTTPServer
from .models import ModelArg, ServedModel, open_served

_ANY_ADDRESS = ("", "0.0.0.0", "::")


@dataclass(frozen=True)
class Listen:
    """Where to listen, and the host name to advertise (default: this node's name)."""

    host: str = "0.0.0.0"
    port: int = 0  # 0: a free port chosen by the kernel (several servers per node never clash)
    advertise: str | None = None

    def url(self, port: int) -> str:
        host = self.advertise or (socket.gethostname() if self.host in _ANY_ADDRESS else self.host)
        return f"http://{host}:{port}"


class Server:
    """Served models behind HTTP: ``start``, then ``stop`` (graceful) exactly once."""

    def __init__(
        self,
        models: Sequence[ServedModel],
        listen: Listen = Listen(),
        limits: Limits = Limits(),
        token: str | None = None,
        runtime: str = "",
        engine_set: EngineSet | None = None,
    ):
        devices = len(models[0].engines)
        # engines[d][m]: model m on device d (a device's worker runs whichever model comes next)
        self.queue = DeviceQueue([[m.engines[d] for m in models] for d in range(devices)], limits.queue)
        self.token = token or new_token()
        self.app = ServeApp(models, self.queue, limits, self.token, runtime)
        self.engine_set = engine_set
        try:
            self.http = ServeHTTPServer((listen.host, listen.port), self.app)
        except OSError as exc:
            raise UsageError(
                f"cannot listen on {listen.host or '*'}:{listen.port} ({exc.strerror}): choose "
                "another --port (0 picks a free one)"
            ) from None
        self._thread = threading.Thread(
            target=self.http.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True, name="http-accept"
        )
        self.stopped = False
        self.port: int = self.http.server_address[1]
        self.url = listen.url(self.port)

    def start(self) -> None:
        self.queue.start()
        self._thread.start()

    def stop(self, drain_timeout: float = 20.0) -> bool:
        """Stop accepting, finish requests in flight (at most ``drain_timeout`` s), close idle
        connections, stop the device workers and release the devices. True when nothing
        in flight was cut off."""
        if self.stopped:
            return True
        self.stopped = True
        self.app.draining = True  # requests on open connections now get 503 + Connection: close
        if self._thread.is_alive():
            self.http.shutdown()  # the accept loop ends...
        self.http.socket.close()  # ...and new connections are refused by the kernel
        drained = self.app.drain(drain_timeout)
        self.http.close_connections()
        self.queue.close(timeout=max(1.0, drain_timeout / 2))
        if self.engine_set is not None:
            self.engine_set.close()  # interpreters, delegates, locks; the usage record
        return drained


_SIGNALS = {signal.SIGTERM, signal.SIGINT}


def serve_job(
    args: Sequence[ModelArg],
    labels: Mapping[str, str],
    open_options: OpenOptions,
    preprocessing: Preprocessing,
    listen: Listen,
    limits: Limits,
    drain_timeout: float,
    say: Callable[[str], None],
    warn: Callable[[str], None],
    task: str = "auto",
    environ: Mapping[str, str] = os.environ,
) -> int:
    """``slurm-tpu serve``: serve until SIGTERM/SIGINT, then stop gracefully; the exit status."""
    job = environ.get("SLURM_JOB_ID", "")
    if not job.isdigit():
        raise UsageError(
            "slurm-tpu serve runs inside a Slurm job (sbatch/srun): SLURM_JOB_ID names its address "
            "file; outside Slurm set SLURM_JOB_ID to any number"
        )
    # Blocked in this thread before any other starts, so every thread inherits the mask and
    # the signal waits for sigwait below, even one sent while the devices are opening.
    signal.pthread_sigmask(signal.SIG_BLOCK, _SIGNALS)
    engine_set, models = open_served(args, labels, open_options, preprocessing, environ, warn, task)
    try:  # binds the port (not yet serving)
        server = Server(models, listen, limits, runtime=engine_set.runtime, engine_set=engine_set)
    except BaseException:
        engine_set.close()
        raise
    address = Address(job, server.url, server.token, environ.get("SLURMD_NODENAME", socket.gethostname()), os.getpid())
    try:
        server.start()
        write_address(address, environ)
    except BaseException:
        server.stop(0)
        raise
    for model in server.app.models.values():
        say(f"model {model.name}: {model.info.path}, task {model.task.name}, on {', '.join(model.device_labels)}")
    say(
        f"listening on {server.url} (job {job}; token and address in {address_path(job, environ)}, "
        "readable only by you)"
    )
    received = signal.sigwait(_SIGNALS)
    say(f"{signal.Signals(received).name}: stopping (no new connections; finishing requests in flight)")
    remove_address(address, environ)
    drained = server.stop(drain_timeout)
    cut = "" if drained else f" ({drain_timeout:g} s drain timeout reached: requests still in flight were cut off)"
    say(f"stopped after {server.app.answered} requests; devices released{cut}")
    return 0
