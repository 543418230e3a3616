"""The broker's sockets: the control socket (root's Prolog/Epilog, metrics) and each job's endpoint.

Threads: one accepting on the control socket, one per control connection; per job, one
accepting on its endpoint; per connection, a reader (frames in, requests to the devices) and
a writer (answers out). A device thread never blocks on a socket: it sends an answer itself
only when nothing of that connection waits for its writer and the socket takes the whole frame
at once (``MSG_DONTWAIT``, one gathering ``sendmsg``), which spares a thread hand-off per
request; otherwise (a client that reads slowly, or a partial send) the rest goes to the
connection's writer. So a client that stops reading stalls only its own job (its requests in
flight stay counted until their answers go to the socket, so its reader stops reading: back-pressure).
A request takes its slot once its head is read (an idle reader holds none), and only an invoke;
a job's queued input bytes are bounded too (``Limits.queued_bytes``).

Whatever a reader meets (a hostile frame, a failed load, a bug) ends its connection with one error
frame; a device thread never dies of a request (executor.py). The stats thread reconciles the open
jobs with the grants every few seconds (a grant with no endpoint gets one, an endpoint whose grant
went is closed, a figures file of neither goes).

Hostile input (a job endpoint is the job user's): every frame is bounded before it is read
(broker_wire), a model is bytes (never a path), an invoke names a model this job loaded and
exactly its inputs' byte sizes, else the connection gets one error frame and is closed.
"""

from __future__ import annotations

import logging
import os
import queue
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ..access import statedir
from ..access.processes import pid_in_job
from ..errors import SlurmTpuError
from ..protocol import FormatError, broker_wire as wire
from . import oneop
from .executor import DevicePool, JobFigures, SharedDevice, Work
from .models import LimitError, ModelRegistry, check_model, spec_json
from .peers import job_peer_refusal, peer_credentials
from .state import BrokerState

_log = logging.getLogger("slurm_tpu.broker")

STATS_EVERY_S = 2.0
CONTROL_TIMEOUT_S = 5.0  # a control peer (root) that stalls mid-frame is dropped
MAX_ID = 2**63


@dataclass(frozen=True)
class Limits:
    """Per-job bounds."""

    in_flight: int = 16  # requests read and not yet answered (queued, running, or being sent)
    connections: int = 8
    models: int = 8
    model_bytes: int = 256 << 20
    tensor_bytes: int = (
        512 << 20
    )  # one model's tensors (its interpreter's arena), read from the model before it is built
    queued_bytes: int = 256 << 20  # input bytes of a job's requests read and not yet answered (back-pressure beyond)


class _Refused(FormatError):
    """A request refused with the connection: one error frame (naming the request's id), then close."""

    def __init__(self, message: str, request_id: object = None):
        super().__init__(message)
        self.request_id = request_id


class _Budget:
    """What a job has in flight, bounded: its requests (one each) or their input bytes. At most
    ``limit`` at once, except that one item alone always passes (a request whose inputs alone are
    over the byte limit); ``peak``: the most there ever was at once."""

    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0
        self.peak = 0
        self._cond = threading.Condition(threading.Lock())

    def _take(self, count: int) -> None:
        self.used += count
        self.peak = max(self.peak, self.used)

    def acquire(self, count: int = 1, timeout: float | None = None) -> bool:
        with self._cond:
            room = lambda: not self.used or self.used + count <= self.limit  # noqa: E731
            if not room() and not self._cond.wait_for(room, timeout):
                return False
            self._take(count)
            return True

    def release(self, count: int = 1) -> None:
        with self._cond:
            self.used -= count
            self._cond.notify_all()

    def take_back(self, count: int = 1) -> None:
        """Hold again what was released for an answer the socket did not take whole, until the writer
        sends the rest (never waits: a device thread calls it; the job may be over for a moment)."""
        with self._cond:
            self._take(count)


class _Connection:
    """One client of a job: a reader thread and a writer thread (the writer closes the socket)."""

    def __init__(self, sock: socket.socket, job: _Job, broker: Broker):
        self.sock, self.job, self.broker = sock, job, broker
        self.frames = wire.FrameReader(sock)
        self.outbox: queue.SimpleQueue = queue.SimpleQueue()  # (frame's buffers, holds_slot), None: stop
        self.closed = threading.Event()  # answers are dropped from now on
        self._lock = threading.Lock()
        self._queued = 0  # frames handed to the writer and not yet sent: no direct send meanwhile
        self._described: dict[str, tuple[list, str]] = {}  # model -> its answers' "outputs" JSON

    def start(self) -> None:
        threading.Thread(target=self._write_loop, name=f"job {self.job.job} writer", daemon=True).start()
        threading.Thread(target=self._read_loop, name=f"job {self.job.job} reader", daemon=True).start()

    # ---- out ----

    def send(
        self, header: dict | bytes, payload: Sequence = (), holds_slot: bool = False, direct: bool = False
    ) -> None:
        """Send an answer (``payload``: buffers, sent without a copy), through the writer unless
        ``direct`` and the socket takes it whole now; ``holds_slot``: it frees one of the job's
        in-flight slots as it goes to the socket (or is dropped): before the client can read it, so
        a client that waits for each answer before its next request holds one slot at a time.
        ValueError (nothing sent, the slot still held) when the frame cannot be made."""
        parts = wire.frame_parts(header, payload)
        with self._lock:
            if not self.closed.is_set():
                # Frames never interleave: a direct send only while the writer has nothing of ours,
                # under the lock, and what the socket did not take goes to the writer, first in line.
                rest: Sequence | None = parts
                if direct and not self._queued:
                    if holds_slot:
                        self.job.slots.release()
                    try:
                        rest = wire.try_send(self.sock, parts)
                    except OSError:
                        pass  # the writer meets the same error and closes the connection
                    if rest is None:
                        return
                    if holds_slot:
                        self.job.slots.take_back()
                if rest is not None:
                    self._queued += 1
                    self.outbox.put((rest, holds_slot))
                    return
        if holds_slot:
            self.job.slots.release()

    def _write_loop(self) -> None:
        while True:
            item = self.outbox.get()
            if item is None:
                break
            parts, holds_slot = item
            if holds_slot:  # as it goes to the socket (see send)
                self.job.slots.release()
            try:
                if not self.closed.is_set():
                    wire.send_parts(self.sock, parts)
            except OSError:
                self.closed.set()
                self._shutdown()
            finally:
                with self._lock:
                    self._queued -= 1
        with self._lock:
            self.closed.set()
        while True:  # answers queued after the stop: their slots go back to the job
            try:
                item = self.outbox.get_nowait()
            except queue.Empty:
                break
            if item is not None and item[1]:
                self.job.slots.release()
        self._shutdown()
        self.sock.close()
        self.job.forget(self)

    def _shutdown(self) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass

    def refuse(self, message: str, request_id: object = None) -> None:
        """One error frame, then the connection closes (the writer sends what was queued first)."""
        header: dict = {"ok": False, "error": message}
        if request_id is not None:
            header["id"] = request_id
        self.send(header)
        self.outbox.put(None)

    def close(self) -> None:
        """Stop now: answers not yet sent are dropped, the reader is woken."""
        with self._lock:
            self.closed.set()
        self.outbox.put(None)
        self._shutdown()

    # ---- in ----

    def _read_loop(self) -> None:
        try:
            self._serve()
        except (EOFError, OSError):
            self.close()
        except FormatError as exc:
            self._refuse_safely(str(exc), getattr(exc, "request_id", None))
        except Exception as exc:  # noqa: BLE001 - never a dead reader beside a blocked writer
            _log.warning("broker: job %s: a connection failed: %s: %s", self.job.job, type(exc).__name__, exc)
            self._refuse_safely(f"the broker could not serve this request ({type(exc).__name__})")
        else:
            self.close()

    def _refuse_safely(self, message: str, request_id: object = None) -> None:
        try:
            self.refuse(message[:1000], request_id)
        except Exception:  # noqa: BLE001 - the frame could not even be made: just close
            self.close()

    def _serve(self) -> None:
        job = self.job
        while not job.closed and not self.closed.is_set():
            header, payload_len = self.frames.head()  # an idle reader holds no slot
            op = header.get("op")
            if op == "invoke":
                self._invoke(header, payload_len)  # its slot is freed by its answer
            elif op == "load":
                self._load(header, payload_len)
            elif op == "stats":
                if payload_len:
                    raise FormatError("a stats request carries no payload")
                figures = self.broker.pool.figures(job.job) or JobFigures()
                self.send({"ok": True, "stats": figures.as_dict(), "in_flight_peak": job.slots.peak})
            else:
                raise FormatError(f"unknown op {str(op)[:40]!r} (a job endpoint serves load, invoke, stats)")

    def _load(self, header: dict, payload_len: int) -> None:
        """Load a model for the job; a load that fails ends the connection (_Refused: one error frame)."""
        job = self.job
        try:
            self.broker.registry.check_room(job.job, payload_len)
        except LimitError as exc:
            raise FormatError(str(exc)) from None
        kind = header.get("kind", "model")
        if kind not in ("model", "executable"):
            raise FormatError(f"unknown load kind {str(kind)[:40]!r} (model or executable)")
        # An Edge TPU executable a job's libedgetpu forwards: runs as its one-op model (oneop.py).
        declared = oneop.declared_tensors(header) if kind == "executable" else None
        data = bytes(self.frames.payload(payload_len))
        executable = None
        if declared is not None:
            if not data:
                raise FormatError("an executable load carries the executable as its payload")
            executable, data = data, oneop.build(data, *declared)
        elif len(data) < 8 or data[4:8] != b"TFL3":
            raise FormatError("the model is not a TFLite model (no TFL3 identifier)")
        limit = job.limits.tensor_bytes
        try:
            # Bounded before anything is built: tensors (count, names, bytes), the answer's size.
            check_model(data, limit)
            if executable is not None and self.broker.pool.twin and executable[4:8] == b"TFL3":
                check_model(executable, limit)  # twin mode runs the executable's own bytes
            with job.lock:  # against close_job: a closed job registers nothing
                if job.closed:
                    raise LimitError("this job's shares were closed")
                entry, _ = self.broker.registry.add(job.job, data, executable, declared)
        except LimitError as exc:
            raise FormatError(str(exc)) from None
        if not entry.ready:
            try:
                with job.load_lock:
                    if not entry.ready:
                        self.broker.pool.prepare(entry, job.job)
            except SlurmTpuError as exc:
                if self.broker.registry.discard(job.job, entry.sha256):
                    self.broker.pool.drop_models([entry.sha256])
                raise FormatError(str(exc)) from None
        self.send(
            {
                "ok": True,
                "model": entry.sha256,
                "inputs": [spec_json(s) for s in entry.inputs],
                "outputs": [spec_json(s) for s in entry.outputs],
            }
        )

    def _invoke(self, header: dict, payload_len: int) -> None:
        """Queue one request (_Refused when it is not one this job may make)."""
        request_id = header.get("id")
        if isinstance(request_id, bool) or not isinstance(request_id, int) or not 0 <= request_id < MAX_ID:
            raise _Refused("an invoke needs an integer 'id'")
        model = header.get("model")
        entry = self.broker.registry.get(model) if isinstance(model, str) and len(model) == 64 else None
        if entry is None or self.job.job not in entry.jobs or not entry.ready:
            raise _Refused("invoke names a model this job has not loaded: load it first", request_id)
        sizes = header.get("tensors")
        if sizes != entry.input_sizes or payload_len != sum(entry.input_sizes):
            raise _Refused(
                f"the input tensors' byte sizes {str(sizes)[:80]} are not the model's {entry.input_sizes}", request_id
            )
        # Back-pressure, with one invoke's head in hand: no slot (or no room for its bytes), no more reading.
        job = self.job
        while not job.slots.acquire(timeout=0.5):
            if job.closed or self.closed.is_set():
                raise EOFError("the job or the connection closed")
        while not job.queued.acquire(payload_len, timeout=0.5):
            if job.closed or self.closed.is_set():
                job.slots.release()
                raise EOFError("the job or the connection closed")
        try:
            payload = self.frames.payload(payload_len)
        except BaseException:
            job.queued.release(payload_len)
            job.slots.release()
            raise
        released = False

        def release_bytes() -> None:
            nonlocal released
            if not released:
                released = True
                job.queued.release(payload_len)

        inputs, offset = [], 0
        for spec, size in zip(entry.inputs, entry.input_sizes):
            inputs.append(np.frombuffer(payload, spec.dtype, size // spec.dtype.itemsize, offset).reshape(spec.shape))
            offset += size

        def done(outputs, error, busy_s, wait_s) -> None:
            release_bytes()
            if error is None:
                try:
                    answer(outputs, busy_s, wait_s)
                    return
                except Exception as exc:  # noqa: BLE001 - an answer too large to frame, memory: said instead
                    error = f"the broker could not send the model's answer ({type(exc).__name__}: {exc})"[:300]
            self.send({"ok": False, "id": request_id, "error": error}, holds_slot=True)

        def answer(outputs, busy_s, wait_s) -> None:
            assert outputs is not None
            chunks = [np.ascontiguousarray(o) for o in outputs]  # get_tensor's own copies: no copy here
            # The answer's JSON by hand (what json.dumps writes for these values, in a fraction of
            # its time): the outputs' part is the same for every answer of a model, kept per model.
            described = _describe(self._described, entry.sha256, chunks)
            busy, wait = round(busy_s * 1000, 4), round(wait_s * 1000, 4)
            answer = f'{{"ok":true,"id":{request_id},"outputs":{described},"busy_ms":{busy!r},"wait_ms":{wait!r}}}'
            buffers = [c.data.cast("B") for c in chunks if c.nbytes]
            # Sent from the device's thread only when the device has nothing else to run: then it
            # spares the client a thread hand-off; with work waiting, the writer sends it while the
            # device runs the next request (measured: bench/profile_broker.py --depth 4).
            self.send(answer.encode(), buffers, holds_slot=True, direct=not self.broker.pool.queued())

        if not self.broker.pool.submit(Work(self.job.job, entry.sha256, inputs, done)):
            release_bytes()
            self.send({"ok": False, "id": request_id, "error": "this job's shares were closed"}, holds_slot=True)


def _describe(cache: dict[str, tuple[list, str]], model: str, chunks: list[np.ndarray]) -> str:
    """The answer's ``outputs`` as JSON text; ``cache`` keeps the last one per model (a model's
    outputs rarely change shape), since numpy's ``dtype.name`` alone costs microseconds."""
    key = [(c.shape, c.dtype) for c in chunks]
    cached = cache.get(model)
    if cached is not None and cached[0] == key:
        return cached[1]
    import json

    text = json.dumps(
        [{"shape": list(c.shape), "dtype": c.dtype.name, "bytes": c.nbytes} for c in chunks], separators=(",", ":")
    )
    cache[model] = (key, text)
    return text


class _Job:
    """An open job: its grant, its endpoint, its connections."""

    def __init__(self, job: int, uid: int, gid: int, shares: int, limits: Limits):
        self.job, self.uid, self.gid, self.shares = job, uid, gid, shares
        self.slots = _Budget(limits.in_flight)  # requests: one each
        self.queued = _Budget(limits.queued_bytes)  # their input bytes
        self.limits = limits
        self.connections: set[_Connection] = set()
        self.lock = threading.Lock()
        self.load_lock = threading.Lock()
        self.closed = False
        self.listener: socket.socket | None = None

    def admit(self, connection: _Connection) -> bool:
        with self.lock:
            if self.closed or len(self.connections) >= self.limits.connections:
                return False
            self.connections.add(connection)
            return True

    def forget(self, connection: _Connection) -> None:
        with self.lock:
            self.connections.discard(connection)


class Broker:
    """The broker: its state directory, devices, jobs and sockets."""

    def __init__(
        self,
        state_dir: str,
        devices: Sequence[SharedDevice],
        runtime: str | None = None,
        threads: int = 1,
        libedgetpu: str | None = None,
        limits: Limits | None = None,
        in_job: Callable[[int, int], bool] = pid_in_job,
        twin: bool = False,
    ):
        self.limits = limits or Limits()
        self.state = BrokerState(state_dir)
        self.registry = ModelRegistry(self.limits.models, self.limits.model_bytes)
        self.pool = DevicePool(devices, self.registry, runtime, threads, libedgetpu, twin=twin)
        self.in_job = in_job
        self.jobs: dict[int, _Job] = {}
        self._jobs_lock = threading.Lock()
        self._stop = threading.Event()
        self._control: socket.socket | None = None
        self._saved: dict[int, dict] = {}
        # Serializes stats/<job> writes: the periodic writer never rewrites a job's file after close_job
        # wrote its last one (the Epilog removes that file once it has the figures).
        self._stats_lock = threading.Lock()
        # Opens and closes of jobs one at a time (the control socket's, the start's, the reconciler's).
        self._open_lock = threading.RLock()
        # Jobs the Epilog closed whose grant is still there (it goes right after): not re-opened meanwhile.
        self._closed_jobs: set[int] = set()
        self._not_opened: dict[int, str] = {}  # job -> why its grant did not open (said once)

    # ---- life ----

    def start(self) -> None:
        """Devices running, the control socket listening, endpoints re-opened from the grants, the pid file written.
        The control socket first: a Prolog arriving meanwhile finds it (its open waits for the scan's)."""
        self.pool.start()
        self._control = self.state.listen(self.state.root_fd, wire.CONTROL_SOCKET, 0, 0, 0o600)
        threading.Thread(target=self._accept_control, name="control", daemon=True).start()
        for job in self.state.grant_jobs():
            self._open_from_grant(job)
        threading.Thread(target=self._stats_loop, name="stats", daemon=True).start()
        statedir.write_atomic(self.state.root_fd, wire.PIDFILE, f"{os.getpid()}\n".encode(), 0o644)

    def wait(self) -> None:
        self._stop.wait()

    def stop(self) -> None:
        """Stop serving: the control socket and pid file go; endpoints stay for the next broker to re-open."""
        if self._stop.is_set():
            return
        self._stop.set()
        self.state.unlink(self.state.root_fd, wire.CONTROL_SOCKET)
        self.state.unlink(self.state.root_fd, wire.PIDFILE)
        if self._control is not None:
            self._control.close()
        self._write_all_stats()
        self.pool.stop()

    # ---- jobs ----

    def open_job(self, job: int) -> str:
        """Make (or keep) job ``job``'s endpoint from its grant file; its path."""
        with self._open_lock:
            self._closed_jobs.discard(job)
            return self._open_job(job)

    def _open_from_grant(self, job: int) -> None:
        """Open a job found by its grant (start, reconcile): not one the Epilog closed; a failure said once."""
        with self._open_lock:
            if job in self._closed_jobs:
                return
            with self._jobs_lock:
                if job in self.jobs:
                    return
            try:
                self._open_job(job)
                self._not_opened.pop(job, None)
            except (SlurmTpuError, OSError) as exc:
                if self._not_opened.get(job) != str(exc):
                    _log.warning("broker: job %s not opened from its grant: %s", job, exc)
                self._not_opened[job] = str(exc)

    def _open_job(self, job: int) -> str:
        _, uid, gid, shares = self.state.read_grant(job)
        with self._jobs_lock:
            existing = self.jobs.get(job)
            if existing is not None and (existing.uid, existing.gid) == (uid, gid):
                existing.shares = shares
                self.pool.add_job(job, shares)
                return wire.endpoint_path(self.state.state_dir, job)
        if existing is not None:
            self._close_job(job)
        entry = _Job(job, uid, gid, shares, self.limits)
        saved = JobFigures.from_dict(self.state.read_stats(job))
        self.pool.add_job(job, shares, saved)
        entry.listener = self.state.listen(self.state.jobs_fd, f"{job}.sock", uid, gid, 0o600)
        with self._jobs_lock:
            self.jobs[job] = entry
        threading.Thread(target=self._accept_job, args=(entry,), name=f"job {job}", daemon=True).start()
        return wire.endpoint_path(self.state.state_dir, job)

    def close_job(self, job: int) -> dict:
        """Forget the job: endpoint, connections, queue, models; its final figures (also written to stats/<job>)."""
        with self._open_lock:
            self._closed_jobs.add(job)
            return self._close_job(job)

    def _close_job(self, job: int, keep_stats: bool = True) -> dict:
        """close_job's work; ``keep_stats`` False (a job whose grant went): no stats file is left."""
        with self._jobs_lock:
            entry = self.jobs.pop(job, None)
        if entry is not None:
            with entry.lock:
                entry.closed = True
                connections = list(entry.connections)
            self.state.unlink(self.state.jobs_fd, f"{job}.sock")
            if entry.listener is not None:
                try:
                    entry.listener.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                entry.listener.close()
            for connection in connections:
                connection.close()
        figures, dropped = self.pool.remove_job(job)
        for work in dropped:
            work.done(None, "this job's shares were closed", 0.0, 0.0)
        self.pool.drop_models(self.registry.release_job(job))
        answer = figures.as_dict()
        with self._stats_lock:
            self._saved.pop(job, None)
            if not keep_stats:
                self.state.unlink(self.state.stats_fd, str(int(job)))
            elif entry is not None:
                self.state.write_stats(job, answer)
        return answer

    def reconcile(self) -> None:
        """The open jobs made to follow the grants: a grant with no open job (nor one the Epilog just
        closed) gets its endpoint, an open job whose grant went is closed (no figures file left: nobody
        will ask), and a figures file of no grant and no open job goes."""
        try:
            grants = set(self.state.grant_jobs())
        except OSError as exc:
            _log.warning("broker: cannot list the grants: %s", exc)
            return
        with self._open_lock:
            self._closed_jobs &= grants
            for job in list(self._not_opened):
                if job not in grants:
                    del self._not_opened[job]
            with self._jobs_lock:
                opened = set(self.jobs)
            for job in sorted(grants - opened):
                self._open_from_grant(job)
            for job in sorted(opened - grants):
                _log.warning("broker: job %s closed: its grant is gone", job)
                self._close_job(job, keep_stats=False)
            with self._jobs_lock:
                opened = set(self.jobs)
            with self._stats_lock:
                try:
                    names = os.listdir(self.state.stats_fd)
                except OSError:
                    names = []
                for name in names:
                    if name.isdigit() and len(name) < 11 and int(name) not in grants and int(name) not in opened:
                        self.state.unlink(self.state.stats_fd, name)

    def stats(self) -> dict:
        figures = self.pool.all_figures()
        with self._jobs_lock:
            peaks = {str(job): entry.slots.peak for job, entry in sorted(self.jobs.items())}
        return {
            "ok": True,
            "jobs": {str(job): f.as_dict() for job, f in sorted(figures.items())},
            "devices": self.pool.device_figures(),
            "in_flight_peak": peaks,
        }

    # ---- endpoints ----

    def _accept_job(self, job: _Job) -> None:
        assert job.listener is not None
        while not job.closed and not self._stop.is_set():
            try:
                sock, _ = job.listener.accept()
            except OSError:
                return
            refusal = job_peer_refusal(sock, job.job, job.uid, self.in_job)
            connection = _Connection(sock, job, self)
            if refusal is None and not job.admit(connection):
                refusal = (
                    f"job {job.job} already has {job.limits.connections} connections to the broker, the most it may"
                )
            if refusal is not None:
                _log.warning("broker: job %s: refused a connection: %s", job.job, refusal)
                try:
                    sock.settimeout(1.0)
                    wire.send_frame(sock, {"ok": False, "refused": True, "error": refusal})
                except OSError:
                    pass
                sock.close()
                continue
            connection.start()

    # ---- control ----

    def _accept_control(self) -> None:
        assert self._control is not None
        while not self._stop.is_set():
            try:
                sock, _ = self._control.accept()
            except OSError:
                return
            threading.Thread(target=self._serve_control, args=(sock,), name="control peer", daemon=True).start()

    def _serve_control(self, sock: socket.socket) -> None:
        with sock:
            sock.settimeout(CONTROL_TIMEOUT_S)
            try:
                if peer_credentials(sock)[1] != 0:
                    wire.send_frame(sock, {"ok": False, "error": "the broker's control socket serves root only"})
                    return
                while True:
                    header, _ = wire.recv_frame(sock, max_payload=0)
                    wire.send_frame(sock, self._control_answer(header))
            except FormatError as exc:
                try:
                    wire.send_frame(sock, {"ok": False, "error": str(exc)})
                except OSError:
                    pass
            except (EOFError, OSError):
                pass

    def _control_answer(self, header: dict) -> dict:
        op = header.get("op")
        try:
            if op == "ping":
                return {"ok": True, "pid": os.getpid(), "devices_alive": self.pool.alive()}
            if op == "stats":
                return self.stats()
            job = header.get("job")
            if isinstance(job, bool) or not isinstance(job, int) or not 1 <= job < 2**32:
                return {"ok": False, "error": f"'{op}' needs a job id"}
            if op == "open":
                return {"ok": True, "endpoint": self.open_job(job)}
            if op == "close":
                return {"ok": True, "stats": self.close_job(job)}
            return {"ok": False, "error": f"unknown control op {str(op)[:40]!r}"}
        except (SlurmTpuError, OSError) as exc:
            return {"ok": False, "error": str(exc)}

    # ---- figures ----

    def _stats_loop(self) -> None:
        while not self._stop.wait(STATS_EVERY_S):
            try:
                self._write_all_stats()
                self.reconcile()
            except Exception as exc:  # noqa: BLE001 - the figures and the reconciling go on
                _log.warning("broker: the stats loop: %s: %s", type(exc).__name__, exc)

    def _write_all_stats(self) -> None:
        with self._stats_lock:
            for job, figures in self.pool.all_figures().items():
                with self._jobs_lock:
                    if job not in self.jobs:  # closed: close_job wrote its last figures
                        self._saved.pop(job, None)
                        continue
                data = figures.as_dict()
                if self._saved.get(job) == data:
                    continue
                try:
                    self.state.write_stats(job, data)
                    self._saved[job] = data
                except (OSError, SlurmTpuError) as exc:
                    _log.warning("broker: cannot write figures of job %s: %s", job, exc)
