"""The hooks' C client (hook_client/slurm-tpu-hook-client.c) against stand-in agents: the wire format the
real agent reads (agent.read_request, the format protocol/agent_wire.py), and failing closed when the
agent is gone or slow.

No cluster: each stand-in is a socket in a root-owned temp directory, driven by the test, and
each assertion waits on the client's exit (its status and its one line), never on a clock.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading

import pytest
from support import REPO


@pytest.fixture(scope="module")
def client():
    from slurm_tpu.ops.hook_client import build

    directory = tempfile.mkdtemp(prefix="slurm-tpu-agent-client-", dir="/tmp")
    path = build(directory)
    if path is None:
        pytest.skip("no C compiler: the hooks run the Python hooks")
    yield path
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def state_dir():
    directory = tempfile.mkdtemp(prefix="slurm-tpu-agent-state-", dir="/tmp")
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


def listen(state_dir: str) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(os.path.join(state_dir, "agent.sock"))
    server.listen(4)
    return server


def run_client(client: str, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [client, *args],
        env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "4242", **env},
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def test_the_request_is_what_the_agent_reads_and_the_status_is_the_clients(client, state_dir):
    from slurm_tpu.hooks.agent import read_request
    from slurm_tpu.protocol.agent_wire import encode_answer as answer

    server = listen(state_dir)
    seen = {}

    def agent():
        conn, _ = server.accept()
        with conn:
            hook, environ = read_request(conn)
            seen.update(hook=hook, environ=environ)
            conn.sendall(answer(7, b"slurm-tpu: prolog: a line from the worker\n"))  # the hook's messages

    thread = threading.Thread(target=agent)
    thread.start()
    done = run_client(client, "prolog", state_dir, SLURM_JOB_UID="1001", ODD="a=b\tc")
    thread.join(60)
    server.close()
    assert done.returncode == 7
    assert done.stderr == "slurm-tpu: prolog: a line from the worker\n"
    assert seen["hook"] == "prolog"
    assert seen["environ"]["SLURM_JOB_ID"] == "4242" and seen["environ"]["SLURM_JOB_UID"] == "1001"
    assert seen["environ"]["ODD"] == "a=b\tc"  # bytes as given, never through a shell


def test_an_agent_that_does_not_answer_in_time_refuses_the_job(client, state_dir):
    server = listen(state_dir)  # takes the connection (backlog) and never answers
    try:
        done = run_client(client, "prolog", state_dir, SLURM_TPU_AGENT_TIMEOUT="1")
    finally:
        server.close()
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1
    assert "job 4242: the node's slurm-tpu agent did not answer within 1 s; job refused" in done.stderr


def test_an_agent_that_dies_before_answering_refuses_the_job(client, state_dir):
    server = listen(state_dir)

    def agent():
        conn, _ = server.accept()
        conn.recv(1 << 16)
        conn.close()  # crashed: no status

    thread = threading.Thread(target=agent)
    thread.start()
    done = run_client(client, "prolog", state_dir)
    thread.join(60)
    server.close()
    assert done.returncode == 1
    assert "ended before it answered" in done.stderr and "job refused" in done.stderr


@pytest.mark.parametrize("hook", ["prolog", "epilog"])
def test_a_dead_agents_socket_leaves_the_work_to_the_python_hook_and_says_so(client, state_dir, hook):
    listen(state_dir).close()  # the socket file stays, nobody listens: ECONNREFUSED
    assert os.path.exists(os.path.join(state_dir, "agent.sock"))
    done = run_client(client, hook, state_dir, "--", "/bin/echo", f"python {hook}")
    assert (done.returncode, done.stdout) == (0, f"python {hook}\n")
    assert "agent does not answer on its socket (restart it: slurm-tpu-agent)" in done.stderr
    assert "the Python hook does the work" in done.stderr and "job refused" not in done.stderr


@pytest.mark.parametrize("hook", ["prolog", "epilog"])
def test_an_agent_that_stopped_accepting_does_not_hang_the_hook(client, state_dir, hook):
    """A hung agent's listen backlog fills; connect() on a full backlog blocks (no EOF, no refusal).
    The client bounds it by its answer limit, then runs the Python hook."""
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(os.path.join(state_dir, "agent.sock"))
    server.listen(0)  # one pending connection fills it
    filler = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    filler.setblocking(False)
    filler.connect(os.path.join(state_dir, "agent.sock"))
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.setblocking(False)
    with pytest.raises(BlockingIOError):  # the backlog is full: a connect would block
        probe.connect(os.path.join(state_dir, "agent.sock"))
    probe.close()
    try:
        done = run_client(client, hook, state_dir, "--", "/bin/echo", f"python {hook}", SLURM_TPU_AGENT_TIMEOUT="1")
    finally:
        filler.close()
        server.close()
    assert (done.returncode, done.stdout) == (0, f"python {hook}\n")
    assert "agent does not answer on its socket" in done.stderr


@pytest.mark.parametrize("hook", ["prolog", "epilog"])
def test_an_environment_too_large_for_the_agent_runs_the_python_hook(client, state_dir, hook):
    """A job can grow the hooks' environment (slurmd passes its SPANK_ variables): the client
    cannot send it, so the Python hook, which takes any size, does the work instead of a refusal
    (prolog) or a drained node (epilog)."""
    server = listen(state_dir)  # a live agent: the size alone decides
    try:
        done = subprocess.run(
            [client, hook, state_dir, "--", "/bin/echo", f"python {hook}"],
            env={"PATH": "/usr/bin:/bin", "SLURM_JOB_ID": "4242", "SPANK_BIG": "x" * 70000},
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )
    finally:
        server.close()
    assert (done.returncode, done.stdout) == (0, f"python {hook}\n"), done.stderr


@pytest.mark.parametrize("owner,mode", [(65534, 0o755), (0, 0o777)], ids=["not-roots", "writable-by-all"])
def test_a_socket_in_a_state_directory_others_control_is_not_asked(client, state_dir, owner, mode):
    """Whoever could have put the socket there is not the agent: one line, status 1, nothing sent."""
    server = listen(state_dir)
    os.chown(state_dir, owner, 0)
    os.chmod(state_dir, mode)
    try:
        done = run_client(client, "epilog", state_dir, "--", "/bin/echo", "python epilog")
    finally:
        server.close()
    assert (done.returncode, done.stdout) == (1, "")
    assert "the state directory is not root's alone" in done.stderr


def test_bad_arguments_are_one_line_and_status_2(client):
    done = subprocess.run([client], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith("usage: slurm-tpu-hook-client")
    assert os.path.isfile(os.path.join(REPO, "hook_client", "slurm-tpu-hook-client.c"))


# A driver for the test below: the agent's own worker loop (agent._idle_worker) on a socket in STATE,
# its run_hook wrapped to report what each hook met on arrival and, after the real hook ran, to leave
# behind what a careless hook might (a variable, a working directory, a umask); then it serves until
# this driver's stdin closes.
WORKER = """
import json, os, socket, sys, types
from slurm_tpu.hooks import agent

state = sys.argv[1]
agent.preload()


def modules():
    # Every value a loaded slurm_tpu module holds (functions and classes by identity; submodules, which
    # a hook's first lazy import adds, aside): hook state kept at module level would show here.
    return {
        name: sorted(
            (key, repr(value))
            for key, value in vars(module).items()
            if not key.startswith("__") and not isinstance(value, types.ModuleType)
        )
        for name, module in sorted(sys.modules.items())
        if name.startswith("slurm_tpu") and module is not None
    }


real = agent.run_hook
first = []  # the modules as the worker's first hook found them


def changed():
    now = modules()
    first[:] = first or [now]
    return [name for name in sorted(first[0]) if now[name] != first[0][name]]


def spy(hook, environ, *args, **kwargs):
    umask = os.umask(0o022)
    os.umask(umask)
    seen = {"pid": os.getpid(), "env": dict(os.environ), "cwd": os.getcwd(), "umask": umask,
            "fds": agent._open_fds(), "modules_changed": changed()}
    status = real(hook, environ, *args, **kwargs)
    seen["modules_changed_after"] = changed()
    print("SEEN " + json.dumps(seen), flush=True)
    os.environ["LEFT_BY_JOB_" + environ["SLURM_JOB_ID"]] = "1"
    os.chdir(state)
    os.umask(0)
    return status


agent.run_hook = spy
listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
listener.bind(os.path.join(state, "agent.sock"))
listener.listen(4)
listener.setblocking(False)
pool_r, pool_w = os.pipe()
alive_r, alive_w = os.pipe()
worker = os.fork()
if worker == 0:
    os.close(alive_w)
    agent._idle_worker(listener, None, pool_w, alive_r, True)
print("ready", flush=True)
sys.stdin.read()
os.close(alive_w)
os.waitpid(worker, 0)
"""


def test_one_worker_gives_a_hook_nothing_of_the_hook_before_it(client, state_dir):
    """Two jobs' prologs through one worker of the node agent (the real hook code, down to its Slurm query,
    answered by a stand-in scontrol that knows no job): the second meets exactly its own environment, the
    agent's working directory and umask, the same descriptors, and every slurm_tpu module as it was before
    the first (no hook keeps module state)."""
    from slurm_tpu.access import node_inventory

    config = os.path.join(state_dir, "config.yaml")
    with open(config, "w", encoding="utf-8") as handle:
        handle.write(f"version: 2\nstate_dir: {state_dir}/state\nslurm:\n  bin_dir: {state_dir}/bin\n")
        handle.write(f"devices:\n  slot_dir: {state_dir}/slots\n")
    with open(os.path.join(state_dir, "slurm.conf"), "w", encoding="utf-8") as handle:
        handle.write("ClusterName=t\nSlurmctldHost=localhost\nNodeName=n1 CPUs=1 Gres=tpu:edgetpu_usb:1\n")
    with open(os.path.join(state_dir, "gres.conf"), "w", encoding="utf-8") as handle:
        handle.write(f"NodeName=n1 Name=tpu Type=edgetpu_usb File={state_dir}/slots/usb-2-1.3\n")
    os.makedirs(os.path.join(state_dir, "bin"))
    shutil.copy("/bin/true", os.path.join(state_dir, "bin", "scontrol"))  # Slurm lists no job on n1
    stick = {"identity": "usb-2-1.3", "kind": "edgetpu", "bus": "usb", "device_nodes": ["/dev/bus/usb/002/005"]}
    node_inventory.write_state_inventory(os.path.join(state_dir, "state"), {"accelerators": [stick]})
    driver = subprocess.Popen(
        [sys.executable, "-c", WORKER, state_dir],
        cwd="/",
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": REPO, "AGENT_ONLY": "y"},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert driver.stdout is not None and driver.stdout.readline() == "ready\n"
        seen = []
        for job, user in (("101", "alice"), ("102", "bob")):
            env = {"SLURM_JOB_ID": job, "SLURM_JOB_UID": "0", "SLURM_JOB_USER": user, "SLURMD_NODENAME": "n1"}
            env |= {"SLURM_TPU_CONFIG": config, "SLURM_CONF": os.path.join(state_dir, "slurm.conf")}
            done = run_client(client, "prolog", state_dir, **env)
            assert done.returncode == 0, done.stderr
            [line] = [line for line in done.stderr.splitlines() if line.startswith("SEEN ")]
            seen.append((env, json.loads(line[5:])))
    finally:
        try:
            driver.communicate("", timeout=60)  # its stdin closed: the worker ends, then the driver
        except subprocess.TimeoutExpired:
            driver.kill()  # the worker sees the driver's end of its pipe close, and ends too
            driver.communicate()
    (_, first), (env, second) = seen
    assert first["pid"] == second["pid"]  # one worker served both
    # Nothing of job 101's, nor of the agent's: what slurmd gave the hook, and the state directory its client found.
    assert second["env"] == {"PATH": "/usr/bin:/bin", **env, "SLURM_TPU_STATE_DIR": state_dir}
    assert (first["cwd"], second["cwd"]) == ("/", "/")
    assert first["umask"] == second["umask"] != 0
    assert first["fds"] == second["fds"]
    for hook in (first, second):
        assert hook["modules_changed"] == hook["modules_changed_after"] == []
