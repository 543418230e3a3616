"""The hooks' C client (prolog/slurm-tpu-hook-client.c) against stand-in agents: the wire format the
real agent reads (agent.read_request, the format protocol/agent_wire.py), and failing closed when the
agent is gone or slow.

No cluster: each stand-in is a socket in a root-owned temp directory, driven by the test, and
each assertion waits on the client's exit (its status and its one line), never on a clock.
"""

from __future__ import annotations

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


def test_a_dead_agents_socket_refuses_a_prolog_and_falls_back_for_the_others(client, state_dir):
    listen(state_dir).close()  # the socket file stays, nobody listens: ECONNREFUSED
    assert os.path.exists(os.path.join(state_dir, "agent.sock"))
    # The prolog names its Python hook too (for an oversized environment) but does not run it here.
    done = run_client(client, "prolog", state_dir, "--", "/bin/echo", "python prolog")
    assert (done.returncode, done.stdout) == (1, "")
    assert "agent does not answer on its socket" in done.stderr and "job refused" in done.stderr
    # The epilog and the udev hook name their Python hook: it runs instead.
    done = run_client(client, "epilog", state_dir, "--", "/bin/echo", "python epilog")
    assert (done.returncode, done.stdout) == (0, "python epilog\n")


@pytest.mark.parametrize("hook", ["prolog", "epilog"])
def test_an_agent_that_stopped_accepting_does_not_hang_the_hook(client, state_dir, hook):
    """A hung agent's listen backlog fills; connect() on a full backlog blocks (no EOF, no refusal).
    The client bounds it by its answer limit: the prolog refuses the job, the epilog runs its Python hook."""
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
    if hook == "prolog":
        assert (done.returncode, done.stdout) == (1, "")
        assert "agent does not answer on its socket" in done.stderr and "job refused" in done.stderr
    else:
        assert (done.returncode, done.stdout) == (0, f"python {hook}\n")


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
    assert os.path.isfile(os.path.join(REPO, "prolog", "slurm-tpu-hook-client.c"))


def test_a_worker_gives_each_hook_exactly_its_own_environment():
    """A worker goes from one hook's environment to the next one's without the agent's in between
    (agent._set_environ): the next hook, and any program it starts, sees its own variables and none
    left from the hook before it or from the agent."""
    code = (
        "import os, subprocess, sys\n"
        "from slurm_tpu.hooks.agent import _set_environ\n"
        "_set_environ({'PATH': '/usr/bin:/bin', 'SLURM_JOB_ID': '1', 'SLURM_JOB_USER': 'alice', 'ONLY_JOB_1': 'x'})\n"
        "_set_environ({'PATH': '/usr/bin:/bin', 'SLURM_JOB_ID': '2', 'SLURM_JOB_USER': 'bob'})\n"
        "print(dict(os.environ) == {'PATH': '/usr/bin:/bin', 'SLURM_JOB_ID': '2', 'SLURM_JOB_USER': 'bob'})\n"
        "print(subprocess.run(['env'], capture_output=True, text=True).stdout, end='')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "AGENT_ONLY": "y", "SLURM_JOB_ID": "0"},
    )
    assert done.returncode == 0, done.stderr
    same, *seen = done.stdout.splitlines()
    assert same == "True"
    assert sorted(seen) == ["PATH=/usr/bin:/bin", "SLURM_JOB_ID=2", "SLURM_JOB_USER=bob"]
