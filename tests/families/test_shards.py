"""Shared devices (issue 32, the Slurm side): ``families.<kind>.shared`` and ``shares_per_device``,
the lines they render (gres.conf, NodeName Gres=, AccountingStorageTRES, GresTypes), what
``detect`` and ``doctor`` say, the hooks' snapshot (``HookSettings.shards``, never a lease), and
the watcher's re-render when a shared device goes. The node is tests/hardware/big_node (two USB
sticks, four PCIe cards, two A100s, a Radeon, a Tegra), read through real libudev once.
"""

from __future__ import annotations

import json

import pytest

from helpers import run_cli
from slurm_tpu.config import Config, parse_config
from slurm_tpu.errors import ConfigError
from slurm_tpu.families import family, inventory_from_json
from slurm_tpu.hardware import Inventory
from slurm_tpu.hooks.allocation import resolve
from slurm_tpu.hooks.settings import HookSettings, apply_families
from slurm_tpu.protocol.hooks_snapshot import FORMAT, ShardPolicy, format_snapshot, parse_snapshot
from slurm_tpu.protocol.inventory import parse_inventory
from slurm_tpu.render import node_features, node_gres, render_gres_conf, shard_counts
from slurm_tpu.render.node_conf import inventory_tres
from slurm_tpu.slurm.gres_index import device_order
from slurm_tpu.slurm.jobdetail import GresAlloc
from slurm_tpu.slurm.parse import parse_gres_conf, parse_node_gres

USB_FW, USB_BOOT = "usb-2-1", "usb-1-1.4"
PCI = ("pci-0000:03:00.0", "pci-0000:04:00.0", "pci-0000:05:00.0", "pci-0000:06:00.0")
A100 = ("pci-0000:c1:00.0", "pci-0000:41:00.0")  # /dev/nvidia0, /dev/nvidia1


@pytest.fixture(scope="module")
def document() -> dict:
    result = run_cli(["detect", "--json"], "big_node")
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def big(document) -> Inventory:
    return inventory_from_json(document)


def config(**families) -> Config:
    return parse_config({"version": 2, "families": families})


# ---- config -----------------------------------------------------------------------------


def test_defaults_share_nothing_and_name_the_shard_gres_once():
    tpu, gpu, hailo = (Config().family(kind) for kind in ("edgetpu", "gpu", "hailo"))
    assert tpu.shared == gpu.shared == () and tpu.shares_per_device == gpu.shares_per_device == 4
    assert family("edgetpu").shard_name(tpu) == "tpu_shard" and family("gpu").shard_name(gpu) == "shard"
    assert family("hailo").shard_name(hailo) == ""  # Hailo is never shared


def test_shared_by_identity_type_or_all():
    parsed = config(edgetpu={"shared": [USB_FW, "edgetpu_pci"], "shares_per_device": 8, "shard_gres_name": "coral_s"})
    tpu = parsed.family("edgetpu")
    assert tpu.shared == (USB_FW, "edgetpu_pci") and tpu.shares_per_device == 8
    assert family("edgetpu").shard_name(tpu) == "coral_s"
    edge = family("edgetpu")
    assert edge.shares(tpu, USB_FW, "edgetpu_usb") == 8 and edge.shares(tpu, "usb-9", "edgetpu_pci") == 8
    assert edge.shares(tpu, USB_BOOT, "edgetpu_usb") == 0
    every = config(gpu={"shared": ["all"]}).family("gpu")
    assert family("gpu").shares(every, "pci-x", "anything") == 4


@pytest.mark.parametrize(
    "families, key, words",
    [
        ({"edgetpu": {"shared": "all"}}, "families.edgetpu.shared", "wrong type"),
        ({"edgetpu": {"shared": ["all", USB_FW]}}, "families.edgetpu.shared", "either [all]"),
        ({"edgetpu": {"shared": [""]}}, "families.edgetpu.shared", "device identities or GRES type names"),
        ({"gpu": {"shared": [3]}}, "families.gpu.shared", "device identities"),
        ({"edgetpu": {"shares_per_device": 0}}, "families.edgetpu.shares_per_device", "1 to 64"),
        ({"gpu": {"shares_per_device": 65}}, "families.gpu.shares_per_device", "1 to 64"),
        ({"edgetpu": {"shares_per_device": True}}, "families.edgetpu.shares_per_device", "wrong type"),
        ({"edgetpu": {"shares_per_device": "4"}}, "families.edgetpu.shares_per_device", "wrong type"),
        ({"edgetpu": {"shard_gres_name": "shard"}}, "families.edgetpu.shard_gres_name", "Slurm's own"),
        ({"edgetpu": {"shard_gres_name": "tpu"}}, "families.edgetpu.shard_gres_name", "whole devices"),
        ({"edgetpu": {"shard_gres_name": "a:b"}}, "families.edgetpu.shard_gres_name", "splits on"),
        ({"edgetpu": {"shard_gres_name": "gpu"}}, "families.edgetpu.shard_gres_name", "GRES of the GPUs"),
        ({"gpu": {"shard_gres_name": "x"}}, "families.gpu.shard_gres_name", "unknown key"),  # Slurm's name is fixed
        ({"hailo": {"shared": ["all"]}}, "families.hailo.shared", "unknown key"),  # not shareable
        ({"hailo": {"shares_per_device": 2}}, "families.hailo.shares_per_device", "unknown key"),
    ],
)
def test_bad_sharing_names_the_key(families, key, words):
    with pytest.raises(ConfigError) as caught:
        config(**families)
    assert caught.value.key == key and words in str(caught.value), str(caught.value)


# ---- rendering --------------------------------------------------------------------------


def test_nothing_shared_renders_as_before(big):
    text = render_gres_conf(big, Config(), "big")
    assert "shard" not in text and "shard" not in node_gres(big, Config())


def test_shared_edge_tpus_leave_tpu_lines_for_one_count(big):
    site = config(edgetpu={"shared": [USB_FW, "edgetpu_pci"]})
    text = render_gres_conf(big, site, "big")
    lines = text.splitlines()
    tpu = [line for line in lines if " Name=tpu " in line]
    assert tpu == [f"NodeName=big Name=tpu Type=edgetpu_usb File=/dev/slurm-tpu/{USB_BOOT}"]
    assert "NodeName=big Name=tpu_shard Count=20" in lines  # 5 devices x 4, no File=, no Type=
    comment = lines[lines.index("NodeName=big Name=tpu_shard Count=20") - 1]
    assert comment.startswith("# tpu_shard:") and all(name in comment for name in (USB_FW, *PCI))
    gres = node_gres(big, site)
    assert gres.startswith("tpu:edgetpu_usb:1,gpu:") and gres.endswith(",tpu_shard:20")
    assert "edgetpu_pci" not in gres
    assert "gres/tpu_shard" in inventory_tres(big, site) and "gres/tpu_shard:" not in ",".join(
        inventory_tres(big, site)
    )
    # A shared device is never in the tpu index the prolog leases by: slurmd's order has the one whole stick.
    records = parse_gres_conf(text, "big")
    order = device_order("tpu", records, parse_node_gres(f"NodeName=big Gres={gres}", "big"))
    assert order == [("edgetpu_usb", f"/dev/slurm-tpu/{USB_BOOT}")]
    assert shard_counts(big, site) == {"tpu_shard": 20}


def test_shares_per_device_and_renamed_gres(big):
    site = config(edgetpu={"shared": [USB_FW], "shares_per_device": 7, "shard_gres_name": "coral_share"})
    assert "NodeName=big Name=coral_share Count=7" in render_gres_conf(big, site, "big").splitlines()
    assert node_gres(big, site).endswith(",coral_share:7")


def test_shared_gpus_keep_their_gpu_line_and_get_slurms_shard_lines(big):
    site = config(gpu={"shared": ["a100_sxm4_80gb"], "shares_per_device": 8})
    lines = render_gres_conf(big, site, "big").splitlines()
    assert "NodeName=big Name=gpu Type=a100_sxm4_80gb File=/dev/nvidia0 Cores=1" in lines
    assert "NodeName=big Name=shard Count=8 File=/dev/nvidia0" in lines
    assert "NodeName=big Name=shard Count=8 File=/dev/nvidia1" in lines
    assert not any("Name=shard" in line and "renderD" in line for line in lines)  # the Radeon is whole
    gres = node_gres(big, site)
    assert "gpu:a100_sxm4_80gb:2" in gres and gres.endswith(",shard:16")
    assert "gres/shard" in inventory_tres(big, site)


def test_gres_types_list_shard_names_only_where_devices_are_shared():
    from slurm_tpu.ops.install import gres_type_names, gres_types

    assert gres_types(Config()) == "tpu,gpu,npu"  # what a site that shares nothing always had
    tpu_site = config(edgetpu={"shared": ["all"]})
    gpu_site = config(gpu={"shared": ["all"]})
    assert gres_types(tpu_site) == "tpu,gpu,npu,tpu_shard"
    assert gres_types(gpu_site) == "tpu,gpu,npu,shard"  # after gpu: Slurm's gres/shard needs gres/gpu
    assert gres_type_names(Config(), tpu_site, gpu_site) == ["tpu", "gpu", "npu", "tpu_shard", "shard"]


# ---- detect and doctor ------------------------------------------------------------------


def test_detect_says_which_devices_are_shared(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text(
        f"version: 2\nfamilies:\n  edgetpu: {{shared: [{USB_FW}]}}\n  gpu: {{shared: [all], shares_per_device: 2}}\n"
    )
    table = run_cli(["--config", str(path), "detect"], "big_node")
    assert table.returncode == 0, table.stderr
    rows = {line.split()[0]: line for line in table.stdout.splitlines()[1:-1]}
    assert "ok, shared: 4 shares of tpu_shard" in rows[USB_FW] and "shared" not in rows[USB_BOOT]
    assert "ok, shared: 2 shares of shard" in rows[A100[0]]
    items = {
        a["identity"]: a
        for a in json.loads(run_cli(["--config", str(path), "detect", "--json"], "big_node").stdout)["accelerators"]
    }
    assert items[USB_FW]["shared"] == {"gres": "tpu_shard", "shares": 4} and "shared" not in items[USB_BOOT]
    assert items["platform-17000000.gpu"]["shared"] == {"gres": "shard", "shares": 2}


def _doctor_node(tmp_path, big, site, slurm_conf_lines):
    from slurm_tpu.ops.doctor import Node
    from slurm_tpu.ops.install import Layout

    conf = tmp_path / "slurm.conf"
    conf.write_text("\n".join(slurm_conf_lines) + "\n")
    return Node(site, Layout(prefix=str(tmp_path / "p"), sysconfdir=str(tmp_path / "etc")), str(conf), "big", big)


def test_doctor_wants_the_shard_gres_in_grestypes_node_line_and_tres(tmp_path, big):
    from slurm_tpu.ops.doctor import check_accounting_tres, check_gres_types, check_node_line

    site = config(edgetpu={"shared": ["edgetpu_pci"]}, gpu={"shared": [A100[1]]})
    stale = _doctor_node(
        tmp_path,
        big,
        site,
        [
            "GresTypes=tpu,gpu,npu",
            "AccountingStorageType=accounting_storage/slurmdbd",
            "AccountingStorageTRES=" + ",".join(inventory_tres(big, Config())),
            f"NodeName=big Gres={node_gres(big, Config())}",
        ],
    )
    (types,) = check_gres_types(stale)
    assert not types.ok and "lacks tpu_shard,shard" in types.message and "shares big's devices" in types.message
    assert "GresTypes=tpu,gpu,npu,tpu_shard,shard" in types.fix
    (tres,) = check_accounting_tres(stale)
    assert not tres.ok and "gres/tpu_shard" in tres.message and "gres/shard" in tres.message
    (line,) = check_node_line(stale)
    assert not line.ok and "tpu_shard:16" in line.message and "shard:4" in line.message
    good = _doctor_node(
        tmp_path,
        big,
        site,
        [
            "GresTypes=tpu,gpu,npu,tpu_shard,shard",
            "AccountingStorageType=accounting_storage/slurmdbd",
            "AccountingStorageTRES=" + ",".join(inventory_tres(big, site)),
            f"NodeName=big Gres={node_gres(big, site)} Feature={','.join(node_features(big, site))}",
        ],
    )
    assert check_gres_types(good)[0].ok and check_accounting_tres(good)[0].ok and check_node_line(good)[0].ok


# ---- the hooks --------------------------------------------------------------------------


def _settings(document, site) -> HookSettings:
    settings = HookSettings("/run/x", slot_dir="/dev/slurm-tpu", devices=parse_inventory(document))
    apply_families(settings, site, document)
    return settings


def test_snapshot_carries_the_shared_edge_tpus(document):
    site = config(edgetpu={"shared": [USB_FW, "edgetpu_pci"], "shares_per_device": 3})
    settings = _settings(document, site)
    assert settings.shards == ShardPolicy("tpu_shard", {USB_FW: 3, **dict.fromkeys(PCI, 3)})
    assert settings.shards.total == 15
    assert set(settings.families["edgetpu"].shared) == {USB_FW, *PCI} and settings.families["gpu"].shared == ()
    text = format_snapshot(settings)
    assert text.startswith(FORMAT + "\n") and FORMAT == "slurm-tpu hooks snapshot 10"
    back = parse_snapshot(text, HookSettings)
    assert back is not None and back.shards == settings.shards and back.families == settings.families
    # A node that shares nothing has no shard records, and reads back None.
    plain = _settings(document, Config())
    assert plain.shards is None and "\nshard\t" not in format_snapshot(plain)
    assert parse_snapshot(format_snapshot(plain), HookSettings).shards is None


def test_snapshot_without_the_inventory_types_matches_identities_only(document):
    site = config(edgetpu={"shared": [USB_FW, "edgetpu_pci"]})
    settings = HookSettings("/run/x", devices=parse_inventory(document))
    apply_families(settings, site)  # no document: GRES types unknown
    assert settings.shards == ShardPolicy("tpu_shard", {USB_FW: 4})


@pytest.mark.parametrize(
    "line", ["shard\tgres=tpu_shard\tidentity=usb-1\tshares=0", "shard\tgres=tpu_shard\tidentity=usb-1"]
)
def test_a_bad_shard_record_sends_the_hook_down_the_slow_path(document, line):
    text = format_snapshot(_settings(document, Config()))
    assert parse_snapshot(text + line + "\n", HookSettings) is None


def test_a_shared_gpu_is_never_leased_even_with_isolate(document):
    site = config(gpu={"isolate": True, "shared": [A100[0]]})
    settings = _settings(document, site)
    settings.index = {"gpu": [("a100_sxm4_80gb", "/dev/nvidia0"), ("a100_sxm4_80gb", "/dev/nvidia1")]}
    assert settings.shards is None  # no Edge TPU shared: nothing for the broker
    assert settings.families["gpu"].shared == (A100[0],)
    both = [GresAlloc("gpu", "a100_sxm4_80gb", 2, (0, 1))]
    assert [d.identity for d in resolve(7, both, settings)] == [A100[1]]  # nvidia0 is shared: no lease
    assert resolve(8, [GresAlloc("gpu", "a100_sxm4_80gb", 1, (0,))], settings) == []


# ---- the watcher ------------------------------------------------------------------------


def test_a_shared_device_going_lowers_the_rendered_count(tmp_path, big, monkeypatch):
    """``watch``'s sync after an unplug: it renders through ops.configure.configure_node, so the
    shard count follows the shared devices present (slot nodes are another test's concern)."""
    from slurm_tpu.ops.watch import Watcher

    site = config(edgetpu={"shared": ["edgetpu_pci"]})
    fewer = Inventory(tuple(a for a in big if a.identity != PCI[2]), big.online_cpus, big.core_of_cpu)
    monkeypatch.setattr("slurm_tpu.ops.configure.prepare_node_state", lambda config, inventory: None)
    monkeypatch.setattr("slurm_tpu.ops.health_check.configured_inventory", lambda config: big)
    monkeypatch.setattr("slurm_tpu.detect.detect_inventory", lambda use_nvml=False: fewer)
    gres_conf, node_conf = tmp_path / "gres.conf", tmp_path / "nodes.conf"
    node_conf.write_text(f"NodeName=big CPUs=2 Gres={node_gres(big, site)}\n")
    logged: list[str] = []
    watcher = Watcher(site, "big", str(gres_conf), str(node_conf), None, log=logged.append)
    assert watcher.sync(2)
    assert f"removed ['{PCI[2]}']" in logged[0] and "tpu_shard:12" in logged[0]
    text = gres_conf.read_text()
    assert "NodeName=big Name=tpu_shard Count=12" in text and PCI[2] not in text
    assert "CPUs=2" in node_conf.read_text() and node_conf.read_text().count("tpu_shard:12") == 1
