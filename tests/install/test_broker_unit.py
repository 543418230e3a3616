"""The TPU broker's place on a node: its unit and entry script, install/uninstall, and doctor's check."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from slurm_tpu.config import Config
from slurm_tpu.hardware import Inventory
from slurm_tpu.ops import install as install_module
from slurm_tpu.ops.doctor import BROKER_UNIT, Node, check_broker
from slurm_tpu.ops.install import HOOK_FILES, SYSTEMD_FILES, Layout, planned_files
from slurm_tpu.protocol import broker_wire


def test_the_unit_runs_the_installed_broker_before_slurmd_hardened_and_writing_only_its_state():
    layout = Layout("/opt/st", "/srv/etc")
    config = Config(state_dir="/run/st-state")
    [unit] = [f for f in planned_files(layout, config, "/srv/etc/slurm") if f.path.endswith(f"/{BROKER_UNIT}")]
    lines = unit.content.splitlines()
    assert f"ExecStart={layout.hooks_dir}/slurm-tpu-broker" in lines and "Before=slurmd.service" in lines
    assert "ReadWritePaths=-/run/st-state" in lines and "ExecStartPre=+/bin/mkdir -p -m 0755 /run/st-state" in lines
    for setting in ("NoNewPrivileges=yes", "ProtectSystem=strict", "ProtectHome=yes", "PrivateTmp=yes"):
        assert setting in lines
    [bounding] = [line for line in lines if line.startswith("CapabilityBoundingSet=")]
    assert set(bounding.split("=", 1)[1].split()) <= {"CAP_CHOWN", "CAP_FOWNER", "CAP_DAC_READ_SEARCH"}
    assert "@" not in unit.content  # every placeholder filled in
    assert ("systemd", "slurm-tpu-broker", 0o755) in HOOK_FILES and (BROKER_UNIT, BROKER_UNIT) in SYSTEMD_FILES
    [entry] = [f for f in planned_files(layout, config, "/srv/etc/slurm") if f.path.endswith("/slurm-tpu-broker")]
    assert entry.content.startswith(f"#!{install_module.node_files.interpreter()} -IS\n")
    assert "  # set by slurm-tpu install\n" in entry.content and 'runpy.run_module("slurm_tpu.broker"' in entry.content


def sharing(config: Config) -> Config:
    """``config`` with its Edge TPUs shared (families.edgetpu.shared: [all])."""
    import dataclasses

    shared = dataclasses.replace(config.family("edgetpu"), shared=("all",))
    return dataclasses.replace(config, families={**config.families, "edgetpu": shared})


def pinger(path: str, answer: dict | None = None) -> socket.socket:
    """A control socket answering every request ``answer`` (default ``{"ok": true, "devices_alive": true}``,
    one real frame), as a live broker's ping."""
    os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(4)

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:
                return
            with conn:
                size, _ = broker_wire.parse_head(conn.recv(broker_wire.HEAD.size, socket.MSG_WAITALL))
                assert broker_wire.parse_header(conn.recv(size, socket.MSG_WAITALL))["op"] == "ping"
                conn.sendall(broker_wire.encode_frame(answer or {"ok": True, "devices_alive": True}))

    threading.Thread(target=serve, daemon=True).start()
    return server


def test_install_doctor_and_uninstall_of_the_broker(tmp_path, monkeypatch):
    if os.geteuid() != 0:
        pytest.skip("install runs as root")
    layout = Layout(str(tmp_path / "p"), str(tmp_path / "p" / "etc"))
    monkeypatch.setattr(install_module, "DEFAULT_CONFIG", layout.config_file)
    state = tmp_path / "state"
    config = Config(state_dir=str(state))
    said: list[str] = []
    install_module.install(layout, config, str(tmp_path / "none"), say=said.append)
    unit = os.path.join(layout.systemd_dir, BROKER_UNIT)
    entry = os.path.join(layout.hooks_dir, "slurm-tpu-broker")
    assert f"write {unit}" in said and f"write {entry}" in said
    assert os.stat(entry).st_mode & 0o777 == 0o755 and os.stat(unit).st_mode & 0o777 == 0o644

    def line(cfg) -> str:
        [finding] = check_broker(Node(cfg, layout, str(tmp_path / "slurm.conf"), "n1", Inventory()))
        return finding.line()

    assert line(config) == "ok    tpu broker: this node shares no Edge TPU (families.edgetpu.shared): no broker needed"
    shared = sharing(config)
    assert line(shared) == (
        f"FAIL  tpu broker: {BROKER_UNIT} is not enabled: after a reboot shard jobs find no broker; "
        f"fix: systemctl enable --now {BROKER_UNIT}"
    )
    wants = os.path.join(layout.systemd_dir, "multi-user.target.wants")
    os.makedirs(wants)
    os.symlink(unit, os.path.join(wants, BROKER_UNIT))  # what systemctl enable makes
    down = line(shared)
    assert down.startswith("FAIL  tpu broker: the broker does not answer ping (nothing listens on ") and down.endswith(
        f"fix: systemctl enable --now {BROKER_UNIT}; journalctl -u {BROKER_UNIT}"
    )
    os.makedirs(state, mode=0o755)
    server = pinger(broker_wire.control_path(str(state)))
    try:
        assert line(shared) == f"ok    tpu broker: {BROKER_UNIT} enabled; its control socket answers"
    finally:
        server.close()
    os.unlink(broker_wire.control_path(str(state)))
    server = pinger(broker_wire.control_path(str(state)), {"ok": True, "devices_alive": False})
    try:  # a broker whose device thread died answers, but that TPU's jobs would wait in vain
        assert line(shared).startswith("FAIL  tpu broker: the broker answers, but a device's thread died")
    finally:
        server.close()
    with open(unit, "a", encoding="utf-8") as handle:
        handle.write("# the admin's line\n")
    assert line(shared).startswith(f"FAIL  tpu broker: {unit} is stale")
    os.unlink(os.path.join(wants, BROKER_UNIT))
    os.rmdir(wants)
    install_module.install(layout, config, str(tmp_path / "none"), say=said.append)  # puts its own back
    install_module.uninstall(layout, say=said.append)
    assert not os.path.lexists(unit) and not os.path.lexists(entry)
