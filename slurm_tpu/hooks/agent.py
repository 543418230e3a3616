"""The node's resident slurm-tpu agent: the root hooks' work without a Python start per hook.

One root process per node (``systemd/slurm-tpu-agent``) that has imported everything the hooks need
once. The hooks' thin C clients (``hook_client/slurm-tpu-hook-client``) hand it their environment over
``<state_dir>/agent.sock``; a pre-forked worker runs the very same hook code (prolog.main, epilog.main,
udev_event.main) with it and answers with the hook's messages and exit status (protocol/agent_wire.py).
docs/architecture.md ("The node agent") gives the design and its safety: a root-only socket and peers
(SO_PEERCRED), bounded requests no string of which reaches a shell, the ledger on disk as the only
truth, and the leases of a prolog whose client went away given back at once (:func:`_client_gone`).
"""

from __future__ import annotations

import os
import select
import signal
import socket
import struct
import sys
import time

from ..protocol.agent_wire import MAX_OUTPUT, PIDFILE, SOCKET, encode_answer, parse_request, request_length
from . import agent_query
from .context import say
from .probe import Probe

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

READ_TIMEOUT_S = 5.0
# Workers waiting for a connection: a node's jobs start and end together (on a 2-device node, two
# prologs, then two epilogs), and workers are replaced once none is busy (or the last one is taken).
IDLE_WORKERS = 3
_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
# A worker's message on the pool pipe: its pid and its state (one write, atomic: under PIPE_BUF).
_POOL_MESSAGE = struct.Struct("ii")
TAKEN, IDLE_AGAIN, ENDING = 1, 2, 3
# Hooks one kept worker serves before it ends and is replaced: bounds what a long-lived process
# could gather (memory, a cache gone stale); forking one costs about 1 ms of CPU.
MAX_REQUESTS = 500
# When a worker woke for a request, and (step, when it ended) since: for the probe (run_hook).
Woke = tuple[float, tuple[tuple[str, float], ...]]


class BadRequest(Exception):
    """A request the agent refuses (the message is logged, the client gets no status)."""


def preload() -> None:
    """Import what the hooks import lazily, so that no worker pays for it (the point of the agent)."""
    from ..access import ledger, node_inventory, ownership, processes, revoke, slots  # noqa: F401
    from ..protocol import audit, envfile, hooks_snapshot, usage  # noqa: F401
    from ..slurm import commands, installation, jobdetail  # noqa: F401
    from . import agent_query, allocation, epilog, jobusage, leasing, prolog, settings, udev_event  # noqa: F401

    jobusage._libc()  # ctypes + libc, for the usage box mount


def _recv_exact(conn: socket.socket, count: int, deadline: float) -> bytes:
    data = bytearray()
    while len(data) < count:
        left = deadline - time.monotonic()
        if left <= 0:
            raise BadRequest(f"request not complete within {READ_TIMEOUT_S:g} s")
        conn.settimeout(left)
        chunk = conn.recv(count - len(data))
        if not chunk:
            raise BadRequest("client closed the connection mid-request")
        data += chunk
    return bytes(data)


def read_request(conn: socket.socket) -> tuple[str, dict[str, str]]:
    """(hook, environment) of one request; raises BadRequest, or FormatError for bytes that are not one
    (descriptors sent with it are closed)."""
    deadline = time.monotonic() + READ_TIMEOUT_S
    conn.settimeout(READ_TIMEOUT_S)
    head, ancillary, flags, _ = conn.recvmsg(4, socket.CMSG_SPACE(16 * 4))
    fds = agent_query.received_fds(ancillary)
    for fd in fds:
        os.close(fd)
    if fds or flags & socket.MSG_CTRUNC:
        raise BadRequest("descriptors sent with the request")
    head += _recv_exact(conn, 4 - len(head), deadline)  # nothing more when the 4 bytes came at once
    return parse_request(_recv_exact(conn, request_length(head), deadline))


def _client_gone(conn: socket.socket) -> bool:
    """Whether the client hung up (it sends nothing after its request, so readable means EOF)."""
    try:
        return conn.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


def _resident_scontrol(queries: socket.socket, environ: dict[str, str], timing: Probe):
    """A ``Slurm.detail_source`` asking the agent's query helper (agent_query.py) for this hook's Slurm."""

    def source(scontrol: str, selector: str) -> str | None:
        answer = agent_query.ask(queries, selector, environ)
        text = answer[1] if answer is not None and answer[0] == scontrol else None
        timing.mark("resident_scontrol" if text is not None else "resident_scontrol_unused")
        return text

    return source


def run_hook(
    hook: str,
    environ: dict[str, str],
    conn: socket.socket | None = None,
    queries: socket.socket | None = None,
    answer: Callable[[], None] | None = None,
    woke: Woke = (0.0, ()),
    client_pid: int | None = None,
) -> int:
    """Run one hook in this (worker) process, as its Python entry script would; returns its status.

    ``answer``: lets the epilog answer its client before it releases (hooks/epilog.py says why).
    ``woke``: see :data:`Woke`. ``client_pid``: the hook client's (SO_PEERCRED), the process Slurm
    started for this prolog, which its leases record (leasing.acquire): this worker outlives it.
    """
    now = time.time()
    timing = Probe(environ, woke[0] or now, (*woke[1], ("environ", now)) if woke[0] else ())
    if hook == "prolog":
        from ..access.processes import process_start_time
        from . import epilog, prolog

        process = (client_pid, process_start_time(client_pid)) if client_pid else None
        scontrol = _resident_scontrol(queries, environ, timing) if queries is not None else None
        status = prolog.main(environ, process, scontrol, timing)
        if status == 0 and conn is not None and _client_gone(conn):
            # Nobody waits for this prolog any more (slurmd killed it, the client gave up): the
            # job was refused, so it must not keep devices. The epilog's release is idempotent.
            say(
                f"prolog: job {environ.get('SLURM_JOB_ID', '?')}: its hook client went away; "
                "giving back what was leased for it"
            )
            epilog.main(environ)
            status = 1
        return status
    if hook == "epilog":
        from . import epilog

        return epilog.main(environ, answer, timing)
    from . import udev_event

    return udev_event.main(environ, timing)


def _idle_worker(
    listener: socket.socket, queries: socket.socket | None, pool_pipe: int, agent_alive: int, keep: bool
) -> None:
    """A forked worker: serve connections one at a time, telling the agent, until it must end (never returns).
    ``agent_alive``: reads EOF once the agent stopped or died, and then it exits unused. ``keep``: it
    serves up to :data:`MAX_REQUESTS` hooks, else one (forked while all the kept ones were busy). It
    also ends after a hook that failed or left a descriptor open."""
    try:
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        # Put back after each hook: the standard descriptors (the agent's log). The environment
        # is not: the next hook's replaces this one's variable by variable (_set_environ).
        standard = [os.dup(fd) for fd in (0, 1, 2)]
        # One idle worker woken per connection (EPOLLEXCLUSIVE), not every one of them to race for it.
        poller = select.epoll()
        poller.register(listener.fileno(), select.EPOLLIN | select.EPOLLEXCLUSIVE)
        poller.register(agent_alive, select.EPOLLIN)
        _warm_up()
        idle_fds = _open_fds()
        # A hook that moved (chdir) or changed its umask leaves the next one nothing.
        cwd, umask = os.getcwd(), os.umask(0o022)
        os.umask(umask)
        limit = MAX_REQUESTS if keep else 1
        for served in range(1, limit + 1):
            conn, woke = _next_connection(listener, agent_alive, poller)
            _tell_pool(pool_pipe, TAKEN)
            clean = _serve(conn, queries, standard[2], woke)
            sys.stdout.flush()
            sys.stderr.flush()
            for fd, saved in enumerate(standard):
                os.dup2(saved, fd)
            os.chdir(cwd)
            os.umask(umask)
            if not clean or _open_fds() != idle_fds:
                break  # a hook that failed, or left a descriptor open, ends its worker: a fresh one serves on
            if served < limit:
                _tell_pool(pool_pipe, IDLE_AGAIN)
        _tell_pool(pool_pipe, ENDING)
        os._exit(0)
    finally:
        os._exit(1)


def _next_connection(listener: socket.socket, agent_alive: int, poller: select.epoll) -> tuple[socket.socket, Woke]:
    """The next hook's connection (its peer unchecked: :func:`_serve` checks) and its :data:`Woke`;
    exits the worker once the agent is gone (its pipe reads EOF)."""
    while True:
        try:
            events = poller.poll()
        except InterruptedError:
            continue
        woke = time.time()  # for the probe (slurm_tpu/hooks/probe.py)
        if any(fd == agent_alive for fd, _ in events):
            os._exit(0)
        try:
            # Non-blocking: another idle worker may have taken it (EPOLLEXCLUSIVE wakes one or more).
            conn, _ = listener.accept()
        except (BlockingIOError, InterruptedError):
            continue
        conn.setblocking(True)
        return conn, (woke, (("accept", time.time()),))


def _open_fds() -> list[str]:
    """This process's open descriptors (the listing's own excluded)."""
    fd = os.open("/proc/self/fd", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        return sorted(name for name in os.listdir(fd) if name != str(fd))
    finally:
        os.close(fd)


def _set_environ(target: dict[str, str]) -> None:
    """Make this process's environment ``target``, changing only what differs (each change is a
    putenv or unsetenv, and consecutive hooks share most of their variables)."""
    for name in [name for name in os.environ if name not in target]:
        del os.environ[name]
    for name, value in target.items():
        if os.environ.get(name) != value:
            os.environ[name] = value


def _tell_pool(pool_pipe: int, state: int) -> None:
    """Tell the agent that this worker took a connection (TAKEN), is idle again, or ends."""
    try:
        os.write(pool_pipe, _POOL_MESSAGE.pack(os.getpid(), state))
    except OSError:
        pass  # the agent is gone: the hook is served all the same (it is the agent's own code)


def _warm_up() -> None:
    """Read the node's settings once, and forget them, before any hook asks.
    A fresh worker's first run through the hook code copies the agent's pages it writes
    (reference counts), a fault each: the settings step took 0.75 ms in a new worker against
    0.19 ms in a warm one. Done here, while the worker waits, that cost is off the hook's path."""
    from . import settings as hook_settings
    from .context import node_from_env

    try:
        hook_settings.load(os.environ, node_from_env(os.environ), create=False)
    except Exception:  # noqa: BLE001 - a warm-up only: the hook meets and reports any problem itself
        pass


def _serve(conn: socket.socket, queries: socket.socket | None, log: int, woke: Woke = (0.0, ())) -> bool:
    """Serve one accepted connection: check the peer, read, run, answer, close it; whether the worker may
    serve another (False after a hook that raised). ``log``: the agent's log, for what an epilog says
    after it answered."""
    status, output, clean = 1, -1, True
    answered = False
    environ: dict[str, str] = {}

    def send(status: int) -> None:
        """Send ``status`` and the hook's messages so far."""
        text = b""
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            if output >= 0:
                text = os.pread(output, MAX_OUTPUT, 0)
        except (OSError, ValueError):
            pass
        try:
            conn.sendall(encode_answer(status, text))
        except OSError:
            pass  # the client is gone: the hook's work goes on all the same

    def answer_now() -> None:
        """Send status 0 and the hook's messages so far; the worker goes on, its client is done."""
        nonlocal answered
        send(0)
        answered = True
        os.dup2(log, 1)
        os.dup2(log, 2)

    try:
        # The connected process, from the kernel (SO_PEERCRED), not from the request.
        pid, uid, _gid = _UCRED.unpack(conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
        if uid != 0:
            say(f"agent: refused a connection from pid {pid} (uid {uid}): only root's hooks may ask")
            return True
        try:
            hook, environ = read_request(conn)
        except (BadRequest, OSError, ValueError) as exc:  # ValueError: FormatError too
            say(f"agent: refused a request: {exc}")
            return True
        woke = (woke[0], (*woke[1], ("request", time.time())))
        conn.settimeout(None)
        sys.stdout.flush()
        sys.stderr.flush()
        # The hook's stdout and stderr go to a memory file sent back with its status: the client
        # writes them where the Python hook would have (slurmd's log). No stdin (no job string).
        output = os.memfd_create("slurm-tpu-hook-output", os.MFD_CLOEXEC)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
        os.dup2(output, 1)
        os.dup2(output, 2)
        _set_environ(environ)
        status = run_hook(hook, environ, conn, queries, answer_now if hook == "epilog" else None, woke, pid)
    except BaseException as exc:  # noqa: BLE001 - one line, then fail closed
        say(f"agent: worker failed: {type(exc).__name__}: {exc}")
        status, clean = 1, False
    try:
        if not answered:
            send(status)
        elif status != 0:
            job = environ.get("SLURM_JOB_ID", "?")
            say(f"agent: job {job}: the epilog failed after it answered Slurm (see above)")
        return clean
    finally:
        conn.close()
        if output >= 0:
            os.close(output)


def _reap(pool: _Pool, sampler: _SamplerProcess | None = None) -> None:
    """Collect ended workers (and the power sampler); one that ended without saying so (killed) is
    forgotten all the same."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        pool.forget(pid)
        if sampler is not None:
            sampler.ended(pid)


class _SamplerProcess:
    """The agent's power sampler (slurm_tpu/energy/sampler.py), a child process of its own.

    Not a thread: the agent forks hook workers all its life, and a fork of a threaded process copies
    only the forking thread, with whatever lock another held (the sampler's, NVML's, the import lock)
    held for ever in the worker. A child shares nothing with the workers: it closes every descriptor
    it inherited (the agent's socket and pool pipes: a dead agent's socket must refuse, its idle
    workers must see the pipe close), ends with the agent (energy/sampler.py serve: the agent's
    pidfd), and an NVML that hangs or crashes takes only it down; it is started again, at most once
    per period. Started where energy figures are on."""

    def __init__(self, settings) -> None:
        self.settings, self.pid, self.started = settings, 0, 0.0
        self.period = settings.energy_poll_s  # config energy.poll_seconds: 1..60, checked there

    def wanted(self) -> bool:
        """Whether energy figures are on (config ``energy.enabled``). Not narrowed to nodes whose
        devices have a polled source: the agent reads its settings once, and a GPU added since must
        still be sampled; an idle sampler costs one directory listing per period."""
        return self.settings.energy_enabled

    def start(self) -> None:
        """Fork the sampler (a failed fork is tried again next period)."""
        self.started = time.monotonic()
        sys.stdout.flush()
        sys.stderr.flush()
        agent = os.getpid()
        try:
            pid = os.fork()
        except OSError as exc:
            say(f"agent: cannot fork the energy sampler ({exc}); trying again in {self.period:g} s")
            return
        if pid == 0:
            code = 1
            try:
                _sampler_child(agent, self.settings, self.period)
                code = 0
            finally:
                os._exit(code)  # never past here: the agent's shutdown would remove its socket
        self.pid = pid

    def keep_running(self) -> None:
        """Start it again if it ended (at most once per period: one that fails at once does not spin)."""
        if not self.pid and time.monotonic() - self.started >= self.period:
            self.start()

    def ended(self, pid: int) -> None:
        if pid == self.pid:
            self.pid = 0

    def stop(self) -> None:
        """End it and collect it (it would end by itself once the agent is gone: this is sooner)."""
        pid, self.pid = self.pid, 0
        if not pid:
            return
        try:
            os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 5.0
            while os.waitpid(pid, os.WNOHANG)[0] == 0:
                if time.monotonic() > deadline:  # stuck in the driver: it must not outlive the agent
                    os.kill(pid, signal.SIGKILL)
                    os.waitpid(pid, 0)
                    break
                time.sleep(0.05)
        except (ChildProcessError, ProcessLookupError):
            pass


def _sampler_child(agent: int, settings, period: float) -> None:
    """The sampler process: drop what it inherited from the agent, then sample until the agent ends."""
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGHUP):
        signal.signal(sig, signal.SIG_DFL)
    syslog = sys.modules.get("syslog")
    if syslog is not None:
        syslog.closelog()  # its socket is among the descriptors closed below: reopened at the next line
    os.closerange(3, os.sysconf("SC_OPEN_MAX"))
    from ..energy.sampler import Sampler, serve

    sampler = Sampler(settings.state_dir, period, settings.nvml_library, settings.sysfs_root, say)
    serve(agent, sampler)


class _Pool:
    """The agent's side of its pre-forked workers."""

    def __init__(self, listener: socket.socket, queries: socket.socket | None):
        self.listener, self.queries = listener, queries
        self.taken_r, self.taken_w = os.pipe2(os.O_CLOEXEC | os.O_NONBLOCK)
        self.alive_r, self.alive_w = os.pipe2(os.O_CLOEXEC)
        listener.setblocking(False)
        self.idle: set[int] = set()
        self.busy: set[int] = set()
        self.kept: set[int] = set()  # the workers that serve up to MAX_REQUESTS hooks (at most IDLE_WORKERS)

    def fill(self) -> None:
        """Fork workers until IDLE_WORKERS wait, or only one while a hook runs (a failed fork is
        tried again on the next round)."""
        while len(self.idle) < (1 if self.busy else IDLE_WORKERS):
            keep = len(self.kept) < IDLE_WORKERS
            sys.stdout.flush()
            sys.stderr.flush()
            try:
                pid = os.fork()
            except OSError as exc:
                say(f"agent: cannot fork a worker ({exc}); trying again within a second")
                return
            if pid == 0:
                try:
                    os.close(self.taken_r)
                    os.close(self.alive_w)
                    _idle_worker(self.listener, self.queries, self.taken_w, self.alive_r, keep)
                finally:
                    # Never past here in a worker: the agent's shutdown would remove its socket.
                    os._exit(1)
            self.idle.add(pid)
            if keep:
                self.kept.add(pid)

    def collect_taken(self) -> None:
        """Follow what the workers say on the pipe: took a connection, idle again, ending."""
        while True:
            try:
                data = os.read(self.taken_r, 4096)
            except BlockingIOError:
                return
            if not data:
                return
            usable = len(data) // _POOL_MESSAGE.size * _POOL_MESSAGE.size
            for pid, state in _POOL_MESSAGE.iter_unpack(data[:usable]):
                # Only a worker still known: one reaped already (killed after it wrote) stays forgotten.
                if state == TAKEN and pid in self.idle:
                    self.idle.discard(pid)
                    self.busy.add(pid)
                elif state == IDLE_AGAIN and pid in self.busy:
                    self.busy.discard(pid)
                    self.idle.add(pid)
                elif state == ENDING:
                    self.forget(pid)

    def forget(self, pid: int) -> None:
        """A worker that ended (or says it is ending)."""
        self.idle.discard(pid)
        self.busy.discard(pid)
        self.kept.discard(pid)

    def close(self) -> None:
        """Idle workers exit (their end of the agent's pipe reads EOF); busy ones finish their hook."""
        for fd in (self.alive_w, self.alive_r, self.taken_r, self.taken_w):
            os.close(fd)


def _bind(state_fd: int) -> tuple[socket.socket, int]:
    """Listen on <state_dir>/agent.sock (0600); returns the socket and the socket file's inode."""
    try:
        os.unlink(SOCKET, dir_fd=state_fd)  # a dead agent's: never follows a link
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    old = os.umask(0o177)
    try:
        # Through the checked directory's fd: no path-length limit, no symlink in between.
        listener.bind(f"/proc/self/fd/{state_fd}/{SOCKET}")
    finally:
        os.umask(old)
    listener.listen(128)
    return listener, os.stat(SOCKET, dir_fd=state_fd, follow_symlinks=False).st_ino


def main() -> int:
    """Entry point for systemd/slurm-tpu-agent: run the agent for the node the environment names
    (SLURM_TPU_CONFIG, SLURMD_NODENAME) until SIGTERM; 1 after one line for a failure (its C client is
    built by whoever put the hooks in place: ``slurm-tpu install``, scripts/setup.sh, LocalCluster)."""
    try:
        from ..access import statedir
        from . import settings as hook_settings
        from .context import node_from_env

        if os.geteuid() != 0:
            say("agent: must run as root (it leases devices for the hooks)")
            return 2
        preload()
        settings = hook_settings.load(os.environ, node_from_env(os.environ))
        state_fd = statedir.open_dir(settings.state_dir, create=True)
        # Forked before anything else runs here: the helper shares nothing with the workers but its socket.
        queries = agent_query.start(os.environ, settings) if settings.leasable_names() else None
        sampler = _SamplerProcess(settings)
        if sampler.wanted():
            sampler.start()
        listener, inode = _bind(state_fd)
        statedir.write_atomic(state_fd, PIDFILE, f"{os.getpid()}\n".encode())
        stopping = []

        def stop(signum, _frame):
            stopping.append(signum)

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        say(f"agent: serving {settings.node}'s hooks on {settings.state_dir}/{SOCKET} (pid {os.getpid()})", error=False)
        # No worker's garbage collection walks (and so copies) what the agent imported.
        import gc

        gc.freeze()
        pool = _Pool(listener, queries)
        try:
            while not stopping:
                pool.fill()
                try:
                    select.select([pool.taken_r], [], [], 1.0)
                except InterruptedError:
                    pass
                pool.collect_taken()
                _reap(pool, sampler)
                if sampler.wanted():
                    sampler.keep_running()
        finally:
            sampler.stop()
            pool.close()
            # Remove the socket only if it is still ours (a new agent may have replaced it).
            try:
                if os.stat(SOCKET, dir_fd=state_fd, follow_symlinks=False).st_ino == inode:
                    os.unlink(SOCKET, dir_fd=state_fd)
            except OSError:
                pass
            listener.close()
            if queries is not None:
                queries.close()
            os.close(state_fd)
        return 0
    except Exception as exc:  # noqa: BLE001 - one line
        say(f"agent: {type(exc).__name__}: {exc}")
        return 1
