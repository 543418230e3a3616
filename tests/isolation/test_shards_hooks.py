"""TPU shares at the Prolog and Epilog (hooks/shards.py), run as the hook functions with a testbed.

No Slurm and no broker branch: the node's settings are built here (``HookSettings.shards``, a
ShardPolicy), the job's allocation is what Slurm would answer, and the
broker is either absent (nothing listens on control.sock) or a tiny real socket server in this
process speaking protocol/broker_wire.py, so what crosses the socket is the real frames.
"""

from __future__ import annotations

import json
import os
import socket
import threading

import pytest
from support import run_hook_in_process as run  # never a drain for the broker

from slurm_tpu.hooks import allocation, epilog, prolog, settings as hook_settings
from slurm_tpu.protocol import broker_wire, envfile
from slurm_tpu.protocol.hooks_snapshot import ShardPolicy
from slurm_tpu.protocol.job_record import decode_spool
from slurm_tpu.slurm.jobdetail import GresAlloc

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="the state directory must be root-owned")
pytestmark = needs_root  # (the last test needs no root, but runs with the others)


@pytest.fixture
def node(tmp_path, monkeypatch, capsys):
    os.chmod(tmp_path, 0o755)
    state, spool = tmp_path / "state", tmp_path / "spool"
    os.mkdir(spool, 0o700)  # a collector runs here: the epilog spools
    settings = hook_settings.HookSettings(str(state), node="n1")
    from slurm_tpu.config import Config

    hook_settings.apply_families(settings, Config())
    settings.shards = ShardPolicy("tpu_shard", {"usb-2-1.3": 4})
    settings.accounting_spool = str(spool)
    monkeypatch.setattr(hook_settings, "load", lambda environ, node=None, create=True: settings)
    allocs = [GresAlloc("tpu_shard", None, 2, ())]
    monkeypatch.setattr(allocation, "query_job_gres", lambda hook, metered=(): allocs)
    env = {"SLURM_JOB_ID": "41", "SLURM_JOB_UID": "1234", "SLURM_JOB_GID": "1235", "SLURMD_NODENAME": "n1"}
    return state, spool, env, Said(capsys)


class Said:
    """slurmd's log of the hooks: what they wrote to stderr so far, line by line."""

    def __init__(self, capsys):
        self.capsys, self.lines = capsys, []

    def __iter__(self):
        self.lines += [line for line in self.capsys.readouterr().err.splitlines() if line]
        return iter(list(self.lines))

    def __bool__(self) -> bool:
        return bool(list(self))


def test_prolog_with_the_broker_down_grants_announces_and_starts_the_job(node):
    state, _, env, said = node
    assert run(prolog, env) == 0
    grant = state / "broker" / "grants" / "41"
    assert broker_wire.decode_grant(grant.read_bytes(), "grant") == (41, 1234, 1235, 2)
    assert grant.stat().st_mode & 0o777 == 0o600 and grant.stat().st_uid == 0
    assert (state / "broker" / "grants").stat().st_mode & 0o777 == 0o700
    lines = (state / envfile.DIR / envfile.file_name(41)).read_text().splitlines()
    assert f"export SLURM_TPU_BROKER={state}/broker/jobs/41.sock" in lines
    assert "export SLURM_TPU_SHARDS=2" in lines
    # No whole TPU: the node's libedgetpu sees only the shard, which it forwards to the broker.
    assert f"export EDGETPU_VISIBLE_DEVICES=broker:{state}/broker/jobs/41.sock" in lines
    assert "unset SLURM_TPU_USAGE_DIR" in lines  # no usage box: the broker counts, not the job
    # Every line is one the task prolog prints.
    assert all(line.startswith(envfile.PRINTED) for line in lines if line.startswith("export SLURM_TPU_B"))
    [line] = [line for line in said if "broker" in line]
    assert "job 41" in line and "systemctl restart slurm-tpu-broker" in line and "nothing listens" in line
    # slurmd logs a successful Prolog's output only at debug2: the audit log is the node's trail of it.
    records = [json.loads(r) for r in (state / "audit.log").read_text().splitlines()]
    [record] = [r for r in records if r["event"] == "broker-unavailable"]
    assert (record["job_id"], record["uid"]) == (41, 1234) and record["reason"].startswith("open: nothing listens")


def test_prolog_of_a_job_without_shares_on_a_sharing_node_does_nothing(node, monkeypatch):
    state, _, env, said = node
    monkeypatch.setattr(allocation, "query_job_gres", lambda hook, metered=(): [])
    assert run(prolog, env) == 0
    assert not (state / "broker" / "grants" / "41").exists() and not said


def test_epilog_spools_the_last_stats_file_and_removes_the_grant(node):
    state, spool, env, said = node
    assert run(prolog, env) == 0
    stats = state / "broker" / "stats"
    stats.mkdir(mode=0o700)
    figures = {"busy_ms": 1234.5, "inferences": 300, "model_swaps": 2, "queue_wait_ms": 80.25, "model_loads": 1}
    (stats / "41").write_text(json.dumps(figures))
    assert run(epilog, env) == 0
    assert not (state / "broker" / "grants" / "41").exists()
    assert not (stats / "41").exists()
    assert not (state / envfile.DIR / envfile.file_name(41)).exists()
    entry = decode_spool((spool / "41").read_bytes(), "spool")
    assert (entry.job_id, entry.devices) == (41, 0)
    assert entry.shards == {
        "shards": 2,
        "shard_busy_ms": 1234.5,
        "shard_inferences": 300,
        "shard_model_swaps": 2,
        "shard_queue_wait_ms": 80.25,
        "shard_model_loads": 1,
    }
    assert any("did not close" in line and "job 41" in line for line in said)
    # A second run changes nothing.
    assert run(epilog, env) == 0
    assert decode_spool((spool / "41").read_bytes(), "spool") == entry


class FakeBroker:
    """A control socket answering each request with ``answers[op]`` (one real frame each)."""

    def __init__(self, path: str, answers: dict[str, dict]):
        self.answers, self.requests = answers, []
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(4)
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.server.accept()
            except OSError:
                return
            with conn:
                head = conn.recv(broker_wire.HEAD.size, socket.MSG_WAITALL)
                size, _ = broker_wire.parse_head(head)
                request = broker_wire.parse_header(conn.recv(size, socket.MSG_WAITALL))
                self.requests.append(request)
                conn.sendall(broker_wire.encode_frame(self.answers[request["op"]]))

    def close(self) -> None:
        self.server.close()


def test_prolog_and_epilog_ask_the_broker_and_take_its_figures(node):
    state, spool, env, said = node
    figures = {"busy_ms": 10.0, "inferences": 5, "model_swaps": 0, "queue_wait_ms": 1.5, "model_loads": 1}
    broker = FakeBroker(
        broker_wire.control_path(str(state)), {"open": {"ok": True}, "close": {"ok": True, "stats": figures}}
    )
    try:
        assert run(prolog, env) == 0
        assert not said
        # The broker leaves its final figures in stats/<job> at close too; the answer's figures are taken.
        stats = state / "broker" / "stats"
        stats.mkdir(mode=0o700)
        (stats / "41").write_text(json.dumps(figures))
        assert run(epilog, env) == 0
    finally:
        broker.close()
    assert not (stats / "41").exists()  # gone with the job
    assert broker.requests == [{"op": "open", "job": 41}, {"op": "close", "job": 41}]
    entry = decode_spool((spool / "41").read_bytes(), "spool")
    assert entry.shards is not None and entry.shards["shard_inferences"] == 5 and entry.shards["shard_busy_ms"] == 10.0
    assert not (state / "broker" / "grants" / "41").exists() and not said


def test_a_silent_broker_costs_the_prolog_its_bound_not_the_job(node):
    state, _, env, said = node
    path = broker_wire.control_path(str(state))
    os.makedirs(os.path.dirname(path), exist_ok=True)
    silent = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    silent.bind(path)
    silent.listen(4)  # accepts (the kernel's backlog), never answers
    try:
        assert run(prolog, env) == 0
    finally:
        silent.close()
    assert any("no answer" in line and "job 41" in line for line in said)
    assert (state / "broker" / "grants" / "41").exists()


def test_a_sharing_node_asks_slurm_for_the_shard_gres_even_with_the_plugins_variable():
    class Slurm:
        def __init__(self):
            self.asked = []

        def job_gres(self, job_id, node):
            self.asked.append((job_id, node))
            return [GresAlloc("tpu", "edgetpu_usb", 1, (0,)), GresAlloc("tpu_shard", None, 3, ())]

    class Hook:
        environ = ("SLURM_JOB_TPUS", "0")  # our gres plugin's variable: enough where nothing is shared
        job = type("Job", (), {"job_id": 41, "node": "n1"})()
        settings = hook_settings.HookSettings("/nonexistent", node="n1")

        def __init__(self):
            self.environ = dict([Hook.environ])

        def slurm(self):
            return slurm

    slurm = Slurm()
    Hook.settings.index = {"tpu": [("edgetpu_usb", "/dev/slurm-tpu/usb-2-1.3")]}
    from slurm_tpu.protocol.inventory import KnownDevice

    Hook.settings.devices = {"usb-2-1.3": KnownDevice("usb-2-1.3", "edgetpu", "usb", ("/dev/bus/usb/002/005",))}
    from slurm_tpu.config import Config

    hook_settings.apply_families(Hook.settings, Config())
    assert [a.name for a in allocation.query_job_gres(Hook())] == ["tpu"] and not slurm.asked
    Hook.settings.shards = ShardPolicy("tpu_shard", {"usb-2-1.4": 4})
    assert [a.name for a in allocation.query_job_gres(Hook())] == ["tpu", "tpu_shard"]
    assert slurm.asked == [(41, "n1")]


def test_both_task_prologs_print_the_shard_jobs_broker_lines(node, tmp_path):
    """The env file the Prolog wrote for a shard job, printed by the sh task prolog and the native one alike."""
    import shutil
    import subprocess

    from slurm_tpu import defaults
    from slurm_tpu.ops.hook_client import NATIVE_HOOKS, build, link_native_entries, shipped_hook

    state, _, env, _ = node
    assert run(prolog, env) == 0
    config = tmp_path / "config.yaml"
    config.write_text(f"state_dir: {state}\n", encoding="utf-8")
    directory = tmp_path / "hooks"
    directory.mkdir(mode=0o755)
    client = build(str(directory))
    programs = [
        os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), "prolog", "slurm-tpu-task-prolog")
    ]
    if client is not None:
        for name in NATIVE_HOOKS:
            shutil.copy(shipped_hook(name), directory)
        link_native_entries(client, [str(directory / name) for name in NATIVE_HOOKS])
        programs.append(str(directory / "slurm-tpu-task-prolog-native"))
    printed = {
        subprocess.run(
            [program],
            env={"PATH": "/usr/bin:/bin", defaults.CONFIG_ENV: str(config), "SLURM_JOB_ID": "41"},
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        ).stdout
        for program in programs
    }
    [text] = printed  # the same from both
    assert f"export SLURM_TPU_BROKER={state}/broker/jobs/41.sock\nexport SLURM_TPU_SHARDS=2\n" in text
