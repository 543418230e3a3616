"""``slurm-tpu cdi``: this node's CDI specs, rendered (slurm_tpu/render/cdi.py) and written (ops/cdi.py).

The nodes are the suite's described ones (tests/hardware/), detected by the real ``detect``; the
specs are checked against the CDI spec's rules (cdiVersion, kind ``vendor.tld/class``, device
names, absolute paths, one edit at least per device) and for what each device gives a container.
Real Podman reads them in test_podman.py.
"""

from __future__ import annotations

import json
import os

import pytest

from helpers import detect_json, run_cli
from slurm_tpu.config import Config, parse_config
from slurm_tpu.families import inventory_from_json
from slurm_tpu.files import BACKUP_SUFFIX
from slurm_tpu.ops.cdi import refresh_cdi, write_cdi
from slurm_tpu.protocol.jobenv import cdi_name
from slurm_tpu.render.cdi import CDI_VERSION, render_cdi, validate_spec

LIBEDGETPU = {"edgetpu": ("/opt/node/libedgetpu.so.1.0", "/usr/lib/x86_64-linux-gnu/libedgetpu.so.1")}


@pytest.fixture(scope="module")
def big_node():
    return inventory_from_json(detect_json("big_node"))


@pytest.fixture(scope="module")
def hailo_node():
    return inventory_from_json(detect_json("hailo_node"))


def devices(spec: dict) -> dict[str, dict]:
    return {d["name"]: d["containerEdits"] for d in spec["devices"]}


def test_one_spec_per_leased_family_each_device_named_by_its_identity(big_node):
    specs = render_cdi(big_node, Config(), LIBEDGETPU)
    assert set(specs) == {"edgetpu"}  # GPUs are not leased by default: NVIDIA's spec is theirs
    spec = specs["edgetpu"]
    assert (spec["cdiVersion"], spec["kind"]) == (CDI_VERSION, "slurm-tpu.dev/edgetpu")
    usable = [a.identity for a in big_node.usable() if a.kind == "edgetpu"]
    assert [d["name"] for d in spec["devices"]] == usable
    # The name the task prolog gives the job is the spec's kind and device name.
    assert cdi_name("edgetpu", usable[0]) == f"{spec['kind']}={usable[0]}"
    assert validate_spec(spec) == []


def test_a_card_gets_its_node_a_stick_the_usb_directory_and_every_device_the_nodes_library(big_node):
    spec = render_cdi(big_node, Config(), LIBEDGETPU)["edgetpu"]
    for accelerator in (a for a in big_node.usable() if a.kind == "edgetpu"):
        edits = devices(spec)[accelerator.identity]
        if accelerator.bus.value == "pci":
            assert edits == {"deviceNodes": [{"path": accelerator.primary_node, "permissions": "rw"}]}
        else:
            # The stick's node moves at firmware load: the directory follows it, ownership decides.
            assert edits == {
                "mounts": [
                    {
                        "hostPath": "/dev/bus/usb",
                        "containerPath": "/dev/bus/usb",
                        "options": ["nosuid", "noexec", "rbind"],
                    }
                ]
            }
        assert "env" not in edits  # the job's variables come from its environment (containers.conf env)
    assert spec["containerEdits"]["mounts"] == [
        {
            "hostPath": "/opt/node/libedgetpu.so.1.0",
            "containerPath": "/usr/lib/x86_64-linux-gnu/libedgetpu.so.1",
            "options": ["ro", "nosuid", "nodev", "bind"],
        }
    ]


def test_gpus_only_where_they_are_leased(big_node):
    specs = render_cdi(big_node, parse_config({"version": 2, "families": {"gpu": {"isolate": True}}}), {})
    gpus = specs["gpu"]
    assert gpus["kind"] == "slurm-tpu.dev/gpu" and validate_spec(gpus) == []
    for accelerator in (a for a in big_node.usable() if a.kind == "gpu"):
        nodes = devices(gpus)[accelerator.identity]["deviceNodes"]
        assert [n["path"] for n in nodes] == list(accelerator.device_nodes)
    assert "containerEdits" not in specs["edgetpu"]  # no library known: none mounted


def test_hailo_gets_its_node_and_the_hosts_libhailort(hailo_node):
    lib = "/usr/lib/x86_64-linux-gnu/libhailort.so.4.20.0"
    spec = render_cdi(hailo_node, Config(), {"hailo": (lib, lib)})["hailo"]
    assert spec["kind"] == "slurm-tpu.dev/hailo" and validate_spec(spec) == []
    hailo = next(a for a in hailo_node.usable() if a.kind == "hailo")
    assert devices(spec)[hailo.identity]["deviceNodes"] == [{"path": hailo.primary_node, "permissions": "rw"}]
    assert spec["containerEdits"]["mounts"][0]["containerPath"] == lib


@pytest.mark.parametrize(
    "change, problem",
    [
        ({"cdiVersion": "1.0.0"}, "cdiVersion"),
        ({"kind": "slurm-tpu/edgetpu"}, "kind"),
        ({"kind": "slurm-tpu.dev/edge.tpu"}, "kind"),
        ({"devices": []}, "no devices"),
        ({"devices": [{"name": "-usb", "containerEdits": {"env": ["A=1"]}}]}, "device name"),
        ({"devices": [{"name": "a", "containerEdits": {"env": ["A=1"]}}] * 2}, "appears twice"),
        ({"devices": [{"name": "a", "containerEdits": {}}]}, "no edits"),
        ({"devices": [{"name": "a", "containerEdits": {"deviceNodes": [{"path": "dev/apex_0"}]}}]}, "not absolute"),
        (
            {"devices": [{"name": "a", "containerEdits": {"mounts": [{"hostPath": "/x", "containerPath": "x"}]}}]},
            "absolute",
        ),
        ({"devices": [{"name": "a", "containerEdits": {"env": ["A"]}}]}, "NAME=VALUE"),
    ],
)
def test_the_schema_rules_catch_what_a_runtime_would_refuse(big_node, change, problem):
    spec = {**render_cdi(big_node, Config(), LIBEDGETPU)["edgetpu"], **change}
    assert any(problem in p for p in validate_spec(spec)), validate_spec(spec)


def test_written_atomically_with_a_backup_untouched_when_unchanged_and_stale_specs_removed(big_node, tmp_path):
    site = parse_config({"version": 2, "families": {"gpu": {"isolate": True}}})
    first = write_cdi(str(tmp_path), big_node, site, LIBEDGETPU)
    paths = sorted(first.written)
    assert [os.path.basename(p) for p in paths] == ["slurm-tpu-edgetpu.json", "slurm-tpu-gpu.json"]
    assert all(oct(os.stat(p).st_mode & 0o777) == "0o644" for p in paths)
    before = {p: os.stat(p).st_mtime_ns for p in paths}
    again = write_cdi(str(tmp_path), big_node, site, LIBEDGETPU)
    assert (again.written, sorted(again.unchanged)) == ((), paths)
    assert {p: os.stat(p).st_mtime_ns for p in paths} == before and not list(tmp_path.glob("*.bak"))
    # GPUs no longer leased: their spec goes (kept as a backup), the Edge TPUs' stays as it was.
    third = write_cdi(str(tmp_path), big_node, Config(), LIBEDGETPU)
    assert third.removed == (str(tmp_path / "slurm-tpu-gpu.json"),)
    assert (tmp_path / ("slurm-tpu-gpu.json" + BACKUP_SUFFIX)).exists()
    # A device unplugged: the spec is rewritten, the old one kept beside it.
    fewer = big_node.__class__(accelerators=tuple(a for a in big_node if a.identity != "usb-2-1"))
    fourth = write_cdi(str(tmp_path), fewer, Config(), LIBEDGETPU)
    assert fourth.written == (str(tmp_path / "slurm-tpu-edgetpu.json"),)
    assert "usb-2-1" in (tmp_path / ("slurm-tpu-edgetpu.json" + BACKUP_SUFFIX)).read_text()
    assert "usb-2-1" not in (tmp_path / "slurm-tpu-edgetpu.json").read_text()


def test_kept_current_only_where_the_node_has_our_specs_and_with_their_library(big_node, tmp_path):
    elsewhere = tmp_path / "etc-cdi"
    elsewhere.mkdir()
    assert refresh_cdi(Config(), big_node, (str(tmp_path), str(elsewhere))) == [] and not list(elsewhere.iterdir())
    write_cdi(str(tmp_path), big_node, Config(), LIBEDGETPU)
    fewer = big_node.__class__(accelerators=tuple(a for a in big_node if a.identity != "usb-2-1"))
    (result,) = refresh_cdi(Config(), fewer, (str(tmp_path), str(elsewhere)))
    assert result.written and not list(elsewhere.iterdir())
    spec = json.loads((tmp_path / "slurm-tpu-edgetpu.json").read_text())
    assert "usb-2-1" not in devices(spec)
    assert spec["containerEdits"]["mounts"][0]["hostPath"] == LIBEDGETPU["edgetpu"][0]  # the one it had


def test_the_cli_prints_writes_and_says_what_it_did(tmp_path):
    library = tmp_path / "libedgetpu.so.1"
    library.write_bytes(b"\x7fELF")
    printed = run_cli(["cdi", "--libedgetpu", str(library)], "big_node")
    assert printed.returncode == 0, printed.stderr
    specs = json.loads(printed.stdout)
    assert list(specs) == ["slurm-tpu-edgetpu.json"]
    assert specs["slurm-tpu-edgetpu.json"]["containerEdits"]["mounts"][0]["hostPath"] == str(library)
    assert "nvidia-ctk cdi generate" in printed.stderr  # big_node has GPUs, not leased
    out = tmp_path / "cdi"
    wrote = run_cli(["cdi", "--output", str(out), "--libedgetpu", str(library)], "big_node")
    assert wrote.returncode == 0 and f"wrote {out}/slurm-tpu-edgetpu.json" in wrote.stderr
    again = run_cli(["cdi", "--output", str(out), "--libedgetpu", str(library)], "big_node")
    assert f"{out}/slurm-tpu-edgetpu.json is up to date" in again.stderr


def test_bad_input_is_one_line_and_a_non_zero_exit(tmp_path):
    missing = run_cli(["cdi", "--libedgetpu", str(tmp_path / "nope.so")], "big_node")
    assert missing.returncode != 0 and missing.stdout == ""
    assert missing.stderr.strip().count("\n") == 0 and "no such file" in missing.stderr
    (tmp_path / "file").write_text("")
    unwritable = run_cli(["cdi", "--output", str(tmp_path / "file" / "cdi")], "big_node")
    assert unwritable.returncode != 0 and "cannot write CDI specs" in unwritable.stderr


def test_doctor_flags_a_users_writable_rootful_socket_and_a_stale_spec(big_node, tmp_path, monkeypatch):
    import socket

    from slurm_tpu.ops import doctor
    from slurm_tpu.ops.install import Layout
    from slurm_tpu.render import cdi as render

    sockets = []
    for name, mode in (("private.sock", 0o600), ("open.sock", 0o666)):
        server = socket.socket(socket.AF_UNIX)
        server.bind(str(tmp_path / name))
        os.chmod(tmp_path / name, mode)
        sockets.append(server)
    cdi_dir = tmp_path / "cdi"
    monkeypatch.setattr(render, "CDI_DIRS", (str(tmp_path / "etc-cdi"), str(cdi_dir)))
    node = doctor.Node(Config(), Layout(prefix=str(tmp_path)), str(tmp_path / "slurm.conf"), "n1", big_node)

    def lines() -> list[str]:
        return [f.line() for f in doctor.check_containers(node)]

    monkeypatch.setattr(doctor, "ROOTFUL_SOCKETS", (str(tmp_path / "private.sock"),))
    assert [f.ok for f in doctor.check_containers(node)] == [True, True]  # no socket to fear, no spec yet
    monkeypatch.setattr(doctor, "ROOTFUL_SOCKETS", (str(tmp_path / "private.sock"), str(tmp_path / "open.sock")))
    found = doctor.check_containers(node)
    assert [f.ok for f in found] == [False, True]
    assert "open.sock (0666) lets every user run rootful containers" in found[0].message
    assert "private.sock" not in found[0].message
    write_cdi(str(cdi_dir), big_node, Config(), LIBEDGETPU)
    assert "match the devices" in lines()[-1]
    fewer = big_node.__class__(accelerators=tuple(a for a in big_node if a.identity != "usb-2-1"))
    write_cdi(str(cdi_dir), fewer, Config(), LIBEDGETPU)
    stale = doctor.check_containers(node)[-1]
    assert not stale.ok and "differ from its devices" in stale.message and "slurm-tpu cdi --output" in stale.fix
    for server in sockets:
        server.close()


def test_install_refreshes_the_specs_a_node_has_or_says_how_to_write_them(big_node, tmp_path, monkeypatch):
    import shutil

    from slurm_tpu.ops import cdi as ops, health_check
    from slurm_tpu.render import cdi as render

    cdi_dir = tmp_path / "cdi"
    monkeypatch.setattr(render, "CDI_DIRS", (str(tmp_path / "etc-cdi"), str(cdi_dir)))
    monkeypatch.setattr(render, "CDI_DIR", str(cdi_dir))
    monkeypatch.setattr(health_check, "configured_inventory", lambda config: big_node)
    said: list[str] = []
    monkeypatch.setattr(shutil, "which", lambda name: "/usr/bin/podman" if name == "podman" else None)
    ops.install_cdi_note(Config(), said.append)
    assert said == [f"Podman is installed: `slurm-tpu cdi --output {cdi_dir}` gives containers the job's devices"]
    fewer = big_node.__class__(accelerators=tuple(a for a in big_node if a.identity != "usb-2-1"))
    write_cdi(str(cdi_dir), fewer, Config(), LIBEDGETPU)
    said.clear()
    ops.install_cdi_note(Config(), said.append)
    assert said == [f"updated {cdi_dir}/slurm-tpu-edgetpu.json (the node's CDI spec)"]
    assert "usb-2-1" in (cdi_dir / "slurm-tpu-edgetpu.json").read_text()
