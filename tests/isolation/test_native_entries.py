"""The hooks' native entries (hook_client/slurm-tpu-hook-client.c run as slurm-tpu-prolog-native,
slurm-tpu-epilog-native, slurm-tpu-task-prolog-native): the task prolog prints what the sh task
prolog prints; the Prolog and Epilog ask the node agent, else run the Python hook beside them,
handing each the state directory they found.

No cluster: each case runs the native task prolog and the sh one on the same state directory and
config and compares what they print, or drives the native Prolog/Epilog against a stand-in
agent socket and a stand-in Python hook beside it. The real cluster runs the native entries in
tests/isolation/test_agent.py and bench/bench_hooks.py.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile

import pytest
from support import REPO

from slurm_tpu import defaults
from slurm_tpu.hooks.settings import scan_state_dir

SH_TASK_PROLOG = os.path.join(REPO, "prolog", "slurm-tpu-task-prolog")


@pytest.fixture(scope="module")
def hooks_dir():
    """A root-owned directory as `slurm-tpu install` makes: the client, its native entries beside
    the hooks (copies of the shipped ones)."""
    from slurm_tpu.ops.hook_client import NATIVE_HOOKS, build, link_native_entries, shipped_hook

    directory = tempfile.mkdtemp(prefix="slurm-tpu-native-", dir="/tmp")
    os.chmod(directory, 0o755)
    client = build(directory)
    if client is None:
        pytest.skip("no C compiler: slurm.conf names the hooks themselves")
    for name in NATIVE_HOOKS:
        shutil.copy(shipped_hook(name), directory)
    link_native_entries(client, [os.path.join(directory, name) for name in NATIVE_HOOKS])
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def state(tmp_path):
    """A state directory and a config naming it."""
    state_dir = tmp_path / "state"
    (state_dir / "jobs").mkdir(parents=True)
    config = tmp_path / "config.yaml"
    config.write_text(f"node_name: n1\nstate_dir: {state_dir}\n", encoding="utf-8")
    return state_dir, config


def run(program: str, config, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [program],
        env={"PATH": "/usr/bin:/bin", defaults.CONFIG_ENV: str(config), **env},
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )


ENV_FILE = (
    "export SLURM_TPU_VISIBLE_DEVICES=0\n"
    "export EDGETPU_VISIBLE_DEVICES=/dev/apex_1\n"
    "export SLURM_TPU_CDI_DEVICES=slurm-tpu.dev/edgetpu=pci-0000:03:00.0,slurm-tpu.dev/edgetpu=usb-2-1.3\n"
    "unset SLURM_TPU_USAGE_DIR\n"
    "export LD_PRELOAD=/tmp/evil.so\n"  # not ours to export: neither hook prints it
    "# a comment\n"
    "export SLURM_TPU_SPACES='a b  c'\n"
    "export SLURM_TPU_UNTERMINATED=1"  # no newline: the sh task prolog's "while read" drops it, and so does C
)


@pytest.mark.parametrize(
    "job_id, files",
    [
        ("17", {"jobs/17.env": ENV_FILE}),
        ("17", {"jobs/18.env": ENV_FILE, "no-devices.env": "unset SLURM_TPU_VISIBLE_DEVICES\n"}),
        ("17", {}),
        ("1;id", {"jobs/1;id.env": ENV_FILE, "no-devices.env": "unset SLURM_TPU_X\n"}),
        ("", {"no-devices.env": "unset SLURM_TPU_X\n"}),
        ("17", {"jobs/17.env": ""}),
    ],
    ids=["own file", "no file: no-devices", "neither", "forged job id", "no job id", "empty file"],
)
def test_the_task_prolog_prints_what_the_sh_task_prolog_prints(hooks_dir, state, job_id, files):
    state_dir, config = state
    for name, text in files.items():
        (state_dir / name).write_text(text, encoding="utf-8")
    native = run(os.path.join(hooks_dir, "slurm-tpu-task-prolog-native"), config, SLURM_JOB_ID=job_id)
    sh = run(SH_TASK_PROLOG, config, SLURM_JOB_ID=job_id)
    assert (native.returncode, native.stdout, native.stderr) == (sh.returncode, sh.stdout, sh.stderr)
    assert native.stdout.startswith("export EDGETPU_VISIBLE_DEVICES=\n")
    assert "LD_PRELOAD" not in native.stdout and "UNTERMINATED" not in native.stdout
    if files.get("jobs/17.env"):  # the job's CDI names reach it from the native entry as from the sh one
        assert "export SLURM_TPU_CDI_DEVICES=slurm-tpu.dev/edgetpu=pci-0000:03:00.0," in native.stdout


def test_the_task_prolog_follows_no_symlink_and_reads_no_fifo(hooks_dir, state):
    state_dir, config = state
    secret = state_dir.parent / "secret.env"
    secret.write_text("export SLURM_TPU_SECRET=1\n", encoding="utf-8")
    os.symlink(secret, state_dir / "jobs" / "17.env")
    os.mkfifo(state_dir / "jobs" / "18.env")  # an open that waited for a writer would hang the task
    (state_dir / "no-devices.env").write_text("unset SLURM_TPU_VISIBLE_DEVICES\n", encoding="utf-8")
    for job in ("17", "18"):
        native = run(os.path.join(hooks_dir, "slurm-tpu-task-prolog-native"), config, SLURM_JOB_ID=job)
        sh = run(SH_TASK_PROLOG, config, SLURM_JOB_ID=job)
        assert native.stdout == sh.stdout == "export EDGETPU_VISIBLE_DEVICES=\nunset SLURM_TPU_VISIBLE_DEVICES\n"


@pytest.mark.parametrize(
    "line",
    [
        "state_dir: {dir}",
        "state_dir:   '{dir}'   # where the ledger lives",
        'state_dir: "{dir}"\r',
        "state_dir:{dir}",
        "  state_dir: /elsewhere\nstate_dir: {dir}",  # an indented (nested) key is not the top-level one
        "state_dir: {dir}\nstate_dir: /second",  # the first one counts
    ],
)
def test_the_state_directory_is_the_one_python_reads(hooks_dir, tmp_path, line):
    state_dir = tmp_path / "the state"
    (state_dir / "jobs").mkdir(parents=True)
    (state_dir / "jobs" / "5.env").write_text("export SLURM_TPU_FOUND=1\n", encoding="utf-8")
    config = tmp_path / "config.yaml"
    config.write_text("version: 1\n" + line.format(dir=state_dir) + "\nnode_name: n1\n", encoding="utf-8")
    assert scan_state_dir(str(config)) == str(state_dir)
    native = run(os.path.join(hooks_dir, "slurm-tpu-task-prolog-native"), config, SLURM_JOB_ID="5")
    assert "export SLURM_TPU_FOUND=1\n" in native.stdout


def stand_in_hook(hooks_dir: str, name: str) -> str:
    """A copy of hooks_dir with the Python hook ``name`` replaced by one that says it ran, and with
    which state directory."""
    directory = tempfile.mkdtemp(prefix="slurm-tpu-native-hook-", dir="/tmp")
    for entry in os.listdir(hooks_dir):
        shutil.copy(os.path.join(hooks_dir, entry), directory)
    with open(os.path.join(directory, name), "w", encoding="utf-8") as handle:
        handle.write(f'#!/bin/sh\necho "hook ran: $0 in ${defaults.STATE_DIR_ENV}"\nexit 7\n')
    os.chmod(os.path.join(directory, name), 0o755)
    return directory


@pytest.mark.parametrize("name", ["slurm-tpu-prolog", "slurm-tpu-epilog"])
def test_without_an_agent_socket_the_native_entry_runs_the_python_hook(hooks_dir, state, name):
    state_dir, config = state
    directory = stand_in_hook(hooks_dir, name)
    try:
        done = run(os.path.join(directory, name + "-native"), config, SLURM_JOB_ID="5")
        assert (done.returncode, done.stdout) == (7, f"hook ran: {os.path.join(directory, name)} in {state_dir}\n")
    finally:
        shutil.rmtree(directory, ignore_errors=True)


@pytest.mark.parametrize("name, hook", [("slurm-tpu-prolog", "prolog"), ("slurm-tpu-epilog", "epilog")])
def test_with_an_agent_socket_the_native_entry_asks_the_agent(hooks_dir, state, name, hook):
    from slurm_tpu.hooks.agent import read_request
    from slurm_tpu.protocol.agent_wire import encode_answer

    state_dir, config = state
    directory = stand_in_hook(hooks_dir, name)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(state_dir / "agent.sock"))
    server.listen(1)
    try:
        program = subprocess.Popen(
            [os.path.join(directory, name + "-native")],
            env={"PATH": "/usr/bin:/bin", defaults.CONFIG_ENV: str(config), "SLURM_JOB_ID": "5"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        conn, _ = server.accept()
        asked, environ = read_request(conn)
        conn.sendall(encode_answer(3, b"the agent's line\n"))
        conn.close()
        out, err = program.communicate(timeout=60)
        assert (asked, environ["SLURM_JOB_ID"], environ[defaults.STATE_DIR_ENV]) == (hook, "5", str(state_dir))
        assert (program.returncode, out, err) == (3, "", "the agent's line\n")  # never the Python hook
    finally:
        server.close()
        shutil.rmtree(directory, ignore_errors=True)


def test_the_c_defaults_are_the_packages():
    text = open(os.path.join(REPO, "hook_client", "slurm-tpu-hook-client.c"), encoding="utf-8").read()
    assert f'#define DEFAULT_STATE_DIR "{defaults.STATE_DIR}"\n' in text
    assert f'#define CONFIG_ENV "{defaults.CONFIG_ENV}"\n' in text
    assert f'#define DEFAULT_CONFIG "{defaults.CONFIG_PATH}"\n' in text
    assert f'#define STATE_DIR_ENV "{defaults.STATE_DIR_ENV}"' in text
