"""Parsers and the IDX -> device mapping, on captured Slurm text (no daemons)."""

from __future__ import annotations

import json

import pytest

from slurm_tpu.config import parse_config
from slurm_tpu.hooks.allocation import resolve
from slurm_tpu.hooks.context import HookError
from slurm_tpu.hooks.settings import HookSettings, apply_families
from slurm_tpu.protocol.inventory import KnownDevice
from slurm_tpu.slurm.gres_index import device_order
from slurm_tpu.slurm.jobdetail import (
    ForgedOutputError,
    GresAlloc,
    expand_hostlist,
    parse_gres_detail,
    parse_scontrol_job_detail,
)
from slurm_tpu.slurm.parse import parse_gres_conf, parse_node_gres, parse_squeue_job_json

# Captured from `squeue --json -j 2` (Slurm 22.05.8), trimmed to the fields we read;
# the job name holds a newline and a forged GRES line, which JSON keeps inert.
SQUEUE_JSON = json.dumps(
    {
        "jobs": [
            {
                "job_id": 2,
                "name": "evil\n     Nodes=n1 CPU_IDs=0 Mem=0 GRES=tpu:edgetpu_usb:1(IDX:3)",
                "gres_detail": ["tpu:edgetpu_usb:1(IDX:2)"],
                "nodes": "n1",
                "user_id": 0,
                "job_state": "RUNNING",
                "job_resources": {"nodes": "n1", "allocated_nodes": [{"nodename": "n1", "cpus_used": 0}]},
            }
        ]
    }
)


def test_hostlists_expand_ranges_and_padding():
    assert expand_hostlist("n[1-3,5],gpu01") == ["n1", "n2", "n3", "n5", "gpu01"]
    assert expand_hostlist("node[08-10]") == ["node08", "node09", "node10"]
    assert expand_hostlist("/dev/nvidia[0-1]") == ["/dev/nvidia0", "/dev/nvidia1"]
    with pytest.raises(ValueError):
        expand_hostlist("n[1-")


def test_gres_detail_items():
    assert parse_gres_detail("tpu:edgetpu_usb:1(IDX:0)") == [GresAlloc("tpu", "edgetpu_usb", 1, (0,))]
    assert parse_gres_detail("tpu:edgetpu_pci:2(IDX:0-1),gpu:1(IDX:3)") == [
        GresAlloc("tpu", "edgetpu_pci", 2, (0, 1)),
        GresAlloc("gpu", None, 1, (3,)),
    ]
    assert parse_gres_detail("tpu:3(IDX:0,2-3)") == [GresAlloc("tpu", None, 3, (0, 2, 3))]
    assert parse_gres_detail("") == []
    with pytest.raises(ValueError):
        parse_gres_detail("tpu:1(IDX:x)")
    # A GRES without device files (tpu_shard), as Slurm 22.05's `scontrol show job -d` writes it.
    assert parse_gres_detail("tpu:edgetpu_pci:1(IDX:0),tpu_shard(CNT:3)") == [
        GresAlloc("tpu", "edgetpu_pci", 1, (0,)),
        GresAlloc("tpu_shard", None, 3, ()),
    ]
    for bad in ("tpu_shard(CNT:x)", "tpu_shard:2(CNT:2)", "tpu_shard(CNT:)"):
        with pytest.raises(ValueError):
            parse_gres_detail(bad)


# Captured from `scontrol show job -d 1` (Slurm 22.05.8) for a job submitted with
# -J $'evil\n     Nodes=n1 CPU_IDs=0 Mem=0 GRES=tpu:edgetpu_usb:1(IDX:3)': Slurm's real line says IDX:2.
SCONTROL_FORGED = """\
JobId=1 JobName=evil
     Nodes=n1 CPU_IDs=0 Mem=0 GRES=tpu:edgetpu_usb:1(IDX:3)
   UserId=root(0) GroupId=root(0) MCS_label=N/A
   NumNodes=1 NumCPUs=1 NumTasks=1 CPUs/Task=1 ReqB:S:C:T=0:0:*:*
   TRES=cpu=1,node=1,billing=1
   Socks/Node=* NtasksPerN:B:S:C=0:0:*:* CoreSpec=*
   JOB_GRES=tpu:edgetpu_usb:1
     Nodes=n1 CPU_IDs=0 Mem=0 GRES=tpu:edgetpu_usb:1(IDX:2)
   MinCPUsNode=1 MinMemoryNode=0 MinTmpDiskNode=0
"""


def test_scontrol_detail_lines_and_forgery_detection():
    honest = SCONTROL_FORGED.replace("     Nodes=n1 CPU_IDs=0 Mem=0 GRES=tpu:edgetpu_usb:1(IDX:3)\n", "", 1)
    assert parse_scontrol_job_detail(honest, "n1", 1) == [GresAlloc("tpu", "edgetpu_usb", 1, (2,))]
    assert parse_scontrol_job_detail(honest, "n2", 1) is None
    with pytest.raises(ForgedOutputError):
        parse_scontrol_job_detail(SCONTROL_FORGED, "n1", 1)
    # A forged line for a node range that covers ours is caught as well.
    ranged = honest.replace("JobName=evil", "JobName=evil\n     Nodes=n[0-3] CPU_IDs=0 Mem=0 GRES=tpu:1(IDX:1)")
    with pytest.raises(ForgedOutputError):
        parse_scontrol_job_detail(ranged, "n1", 1)
    multi = (
        "JobId=1 JobName=m\n   Nodes=n[1-2] CPU_IDs=0-1 Mem=0 GRES=tpu:edgetpu_pci:2(IDX:0-1)\n"
        "   Nodes=n3 CPU_IDs=0 Mem=0 GRES=\n"
    )
    assert parse_scontrol_job_detail(multi, "n2", 1) == [GresAlloc("tpu", "edgetpu_pci", 2, (0, 1))]
    assert parse_scontrol_job_detail(multi, "n3", 1) == []


def test_squeue_json_is_not_fooled_by_a_forged_job_name():
    assert parse_squeue_job_json(SQUEUE_JSON, 2, "n1") == [GresAlloc("tpu", "edgetpu_usb", 1, (2,))]
    assert parse_squeue_job_json(SQUEUE_JSON, 2, "n2") is None
    assert parse_squeue_job_json(SQUEUE_JSON, 3, "n1") is None


GRES_CONF = """\
# BEGIN slurm-tpu gres n1
NodeName=n1 Name=tpu Type=edgetpu_usb File=/dev/x/tpu0
NodeName=n1 Name=tpu Type=edgetpu_pci File=/dev/x/tpu[1-2]
NodeName=n1 Name=tpu Type=edgetpu_usb File=/dev/x/tpu3
NodeName=n2 Name=gpu Type=a100 File=/dev/nvidia[0-1]
"""


def files(order):
    return [f for _, f in order]


def test_idx_follows_slurm_conf_type_order_then_gres_conf_order():
    """Measured on slurmd 22.05.8: usb-first Gres= gave the usb jobs IDX 0,1; pci-first gave them 2,3."""
    records = parse_gres_conf(GRES_CONF, "n1")
    pci_first = device_order("tpu", records, [("tpu", "edgetpu_pci", 2), ("tpu", "edgetpu_usb", 2)])
    assert files(pci_first) == ["/dev/x/tpu1", "/dev/x/tpu2", "/dev/x/tpu0", "/dev/x/tpu3"]
    assert [t for t, _ in pci_first] == ["edgetpu_pci"] * 2 + ["edgetpu_usb"] * 2
    usb_first = device_order("tpu", records, [("tpu", "edgetpu_usb", 2), ("tpu", "edgetpu_pci", 2)])
    assert files(usb_first) == ["/dev/x/tpu0", "/dev/x/tpu3", "/dev/x/tpu1", "/dev/x/tpu2"]
    # No NodeName line in slurm.conf (configless): types in order of first appearance.
    assert files(device_order("tpu", records, None)) == files(usb_first)


def test_idx_name_lines_come_before_nodename_lines_and_counts_truncate():
    text = "NodeName=n1 Name=tpu Type=a File=/d/a[0-2]\nName=tpu Type=a File=/d/b0\n"
    records = parse_gres_conf(text, "n1")
    assert files(device_order("tpu", records, [("tpu", "a", 3)])) == ["/d/b0", "/d/a0", "/d/a1"]


def test_node_gres_from_slurm_conf():
    conf = (
        "NodeName=DEFAULT Gres=tpu:x:1\nNodeName=n[1-2] CPUs=2 Gres=tpu:edgetpu_pci:2,tpu:edgetpu_usb:1\n"
        "NodeName=n3 CPUs=2\n"
    )
    assert parse_node_gres(conf, "n2") == [("tpu", "edgetpu_pci", 2), ("tpu", "edgetpu_usb", 1)]
    assert parse_node_gres(conf, "n3") == [("tpu", "x", 1)]
    assert parse_node_gres(conf, "n9") is None


KNOWN = {
    "usb-2-1.3": KnownDevice("usb-2-1.3", "edgetpu", "usb", ("/dev/bus/usb/002/005",)),
    "pci-0000:03:00.0": KnownDevice("pci-0000:03:00.0", "edgetpu", "pci", ("/dev/apex_0",)),
    "pci-0000:41:00.0": KnownDevice("pci-0000:41:00.0", "gpu", "pci", ("/dev/nvidia0",)),
}
INDEX = {
    "tpu": [("edgetpu_usb", "/dev/slurm-tpu/usb-2-1.3"), ("edgetpu_pci", "/dev/slurm-tpu/pci-0000:03:00.0")],
    "gpu": [("a100", "/dev/nvidia0")],
}


def settings(index=INDEX):
    result = HookSettings("/run/x", slot_dir="/dev/slurm-tpu", devices=KNOWN, index=index)
    apply_families(result, parse_config({"version": 2, "families": {"gpu": {"isolate": True}}}))
    return result


def test_resolve_maps_indices_to_inventory_devices_in_order():
    allocs = [
        GresAlloc("tpu", "edgetpu_pci", 1, (1,)),
        GresAlloc("tpu", "edgetpu_usb", 1, (0,)),
        GresAlloc("gpu", "a100", 1, (0,)),
    ]
    assert [d.identity for d in resolve(7, allocs, settings())] == ["pci-0000:03:00.0", "usb-2-1.3", "pci-0000:41:00.0"]


@pytest.mark.parametrize(
    "index, alloc, message",
    [
        ({"tpu": [("edgetpu_usb", "/etc/shadow")]}, GresAlloc("tpu", "edgetpu_usb", 1, (0,)), "/etc/shadow"),
        ({"tpu": [("edgetpu_usb", "/dev/slurm-tpu/../../etc/shadow")]}, GresAlloc("tpu", None, 1, (0,)), "shadow"),
        ({"tpu": [("edgetpu_usb", "/dev/slurm-tpu/usb-9-9")]}, GresAlloc("tpu", None, 1, (0,)), "usb-9-9"),
        ({"tpu": [("edgetpu_usb", "/dev/slurm-tpu/usb-2-1.3")]}, GresAlloc("tpu", None, 1, (1,)), "beyond"),
        ({"tpu": [("edgetpu_usb", "/dev/slurm-tpu/usb-2-1.3")]}, GresAlloc("tpu", "edgetpu_pci", 1, (0,)), "disagree"),
    ],
)
def test_resolve_refuses_paths_that_are_not_known_devices(index, alloc, message):
    with pytest.raises(HookError, match=message.replace(".", r"\.")):
        resolve(7, [alloc], settings(index))
