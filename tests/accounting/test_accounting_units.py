"""Slurm accounting pieces without a cluster: TRES entries per family, install's and doctor's view of
them, the spool entry and AdminComment formats, and the collector's handling of its spool."""

from __future__ import annotations

import os

import pytest

from helpers import detect_json, run_cli


def inventory(hardware: str):
    from slurm_tpu.families import inventory_from_json

    return inventory_from_json(detect_json(hardware))


def test_accounting_tres_names_every_gres_and_type_of_a_node_line():
    from slurm_tpu.render.node_conf import accounting_tres, accounting_tres_of_nodes_conf

    assert accounting_tres("tpu:edgetpu_usb:2,tpu:edgetpu_pci:4,npu:hailo8:1,gpu:2,mps:4K") == [
        "gres/tpu",
        "gres/tpu:edgetpu_usb",
        "gres/tpu:edgetpu_pci",
        "gres/npu",
        "gres/npu:hailo8",
        "gres/gpu",
        "gres/mps",
    ]
    assert accounting_tres("") == []
    text = (
        "NodeName=a Gres=tpu:edgetpu_usb:1\nNodeName=b CPUs=2\n# NodeName=c Gres=gpu:x:1\n"
        "NodeName=d Gres=npu:hailo8:2\n"
    )
    assert accounting_tres_of_nodes_conf(text) == ["gres/tpu", "gres/tpu:edgetpu_usb", "gres/npu", "gres/npu:hailo8"]


def test_tres_come_from_the_families_and_the_sites_gres_names():
    from slurm_tpu.config import Config
    from slurm_tpu.render.node_conf import inventory_tres

    big, hailo = inventory("big_node"), inventory("hailo_node")
    assert inventory_tres(big, Config()) == [
        "gres/tpu",
        "gres/tpu:edgetpu_usb",
        "gres/tpu:edgetpu_pci",
        "gres/gpu",
        "gres/gpu:a100_sxm4_80gb",
        "gres/gpu:radeon_rx_6800",
        "gres/gpu:tegra_ga10b",
    ]
    assert [t for t in inventory_tres(hailo, Config()) if t.startswith("gres/npu")][:1] == ["gres/npu"]
    assert any(t.startswith("gres/npu:") for t in inventory_tres(hailo, Config()))


def test_node_conf_prints_the_accounting_tres_line(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text("version: 1\ngres:\n  tpu_name: coral\n")  # a site's own GRES name is the one tracked
    result = run_cli(["--config", str(config), "node-conf", "--node", "big", "--no-hardware"], "big_node")
    assert result.returncode == 0, result.stderr
    assert (
        "needs: AccountingStorageTRES=gres/coral,gres/coral:edgetpu_usb,gres/coral:edgetpu_pci,gres/gpu,"
        in result.stderr
    )


def test_install_wants_the_tres_only_where_slurmdbd_records_jobs():
    from slurm_tpu.config import Config
    from slurm_tpu.ops.accounting import accounting_on
    from slurm_tpu.ops.install import accounting_tres_line, missing_slurm_conf_lines
    from slurm_tpu.slurm.parse import parse_slurm_conf_options

    wanted = accounting_tres_line(inventory("big_node"), Config())
    assert wanted[0].startswith("AccountingStorageTRES=gres/tpu,gres/tpu:edgetpu_usb,")
    off = parse_slurm_conf_options("AccountingStorageType=accounting_storage/none\n")
    assert not accounting_on(off)
    on = parse_slurm_conf_options(
        "AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageTRES=gres/mps,gres/tpu\n"
    )
    assert accounting_on(on)
    # A list: the site's entries are kept, ours added.
    [line] = missing_slurm_conf_lines(wanted, on)
    assert line.startswith("AccountingStorageTRES=gres/mps,gres/tpu,gres/tpu:edgetpu_usb,")
    complete = parse_slurm_conf_options(f"AccountingStorageType=accounting_storage/slurmdbd\n{line}\n")
    assert missing_slurm_conf_lines(wanted, complete) == []


def test_doctor_fails_in_one_line_when_a_gres_is_not_tracked(tmp_path):
    from slurm_tpu.config import Config
    from slurm_tpu.ops.doctor import Node, check_accounting_tres
    from slurm_tpu.ops.install import Layout

    conf = tmp_path / "slurm.conf"
    node = Node(Config(), Layout(str(tmp_path / "usr")), str(conf), "big", inventory("big_node"))
    conf.write_text("AccountingStorageType=accounting_storage/none\n")
    [finding] = check_accounting_tres(node)
    assert finding.ok
    conf.write_text("AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageTRES=gres/tpu,gres/gpu\n")
    [finding] = check_accounting_tres(node)
    assert not finding.ok
    line = finding.line()
    assert line.startswith("FAIL  AccountingStorageTRES: slurm.conf AccountingStorageTRES lacks gres/tpu:edgetpu_usb,")
    assert "\n" not in line and "; fix: set AccountingStorageTRES=gres/tpu,gres/gpu,gres/tpu:edgetpu_usb," in line


# ---- the spool entry and the AdminComment ----------------------------------------------


def test_spool_entry_round_trip_and_admin_comment_merge():
    from slurm_tpu.protocol.job_record import (
        decode_spool,
        encode_spool,
        merge,
        parse_admin_comment,
        render_item,
        totals,
    )
    from slurm_tpu.protocol.usage import UsageRecord

    entry = totals(42, "n1", 2, [UsageRecord("usb-2-1.3", 10, 0.25), UsageRecord("pci-0000:01:00.0", 2, 0.5, 3.0)])
    assert (entry.devices, entry.inferences, entry.inference_seconds, entry.energy_j) == (2, 12, 0.75, 3.0)
    assert decode_spool(encode_spool(entry), "x") == entry
    assert render_item(entry) == "slurm-tpu/n1:devices=2,inferences=12,inference_seconds=0.75,energy_j=3"
    # An admin's note and another node's item are kept; this node's item is replaced.
    other = totals(42, "n2", 1, [UsageRecord("usb-1-1", 5, 1.0)])
    text = merge(merge("checked by ops", entry), other)
    assert text == (
        "checked by ops;slurm-tpu/n1:devices=2,inferences=12,inference_seconds=0.75,energy_j=3;"
        "slurm-tpu/n2:devices=1,inferences=5,inference_seconds=1"
    )
    again = totals(42, "n1", 1, [])
    assert merge(text, again).endswith(";slurm-tpu/n1:devices=1,inferences=0,inference_seconds=0")
    assert parse_admin_comment(text) == {
        "n1": {"devices": 2, "inferences": 12, "inference_seconds": 0.75, "energy_j": 3.0},
        "n2": {"devices": 1, "inferences": 5, "inference_seconds": 1.0},
    }
    assert parse_admin_comment("slurm-tpu/n1:inferences=x;slurm-tpu/:a=1;junk") == {}


@pytest.mark.parametrize(
    "raw, why",
    [
        (b"version=2\njob=1\nnode=n1\ndevices=1\ninferences=1\ninference_seconds=1\nenergy_j=\n", "format version"),
        (b"version=1\njob=1\nnode=n;1\ndevices=1\ninferences=1\ninference_seconds=1\nenergy_j=\n", "node name"),
        (b"version=1\njob=1\nnode=n1\ndevices=1\ninference_seconds=1\n", "not a slurm-tpu spool entry"),
        (b"x" * 2000, "over 1024 bytes"),
    ],
)
def test_a_bad_spool_entry_is_named(raw, why):
    from slurm_tpu.protocol.job_record import decode_spool

    with pytest.raises(ValueError, match=why):
        decode_spool(raw, "/run/slurm-tpu/accounting-spool/1")


def test_collector_makes_a_root_only_spool_and_names_what_is_not_an_entry(tmp_path):
    from slurm_tpu.ops.accounting import collect

    state = tmp_path / "state"
    state.mkdir(mode=0o755)
    spool = state / "accounting-spool"
    # No entry: Slurm is never asked (what it does with entries: test_accounting_usage.py, on a real cluster).
    assert collect(str(state), slurm=None).applied == {}  # the first run makes the spool
    assert oct(spool.stat().st_mode & 0o777) == "0o700" and spool.stat().st_uid == 0
    (spool / "10").write_bytes(b"not an entry")
    (spool / ".11.123.tmp").write_bytes(b"half")  # an epilog still writing: not looked at
    os.symlink("/etc/passwd", spool / "12")
    result = collect(str(state), slurm=None)
    assert set(result.refused) == {"10", "12"}
    assert "not a slurm-tpu spool entry" in result.refused["10"] and "symlink" in result.refused["12"]
    assert sorted(os.listdir(spool)) == [".11.123.tmp", "10", "12"]  # left for the admin, nothing lost


def test_sacct_rows_sum_to_tres_seconds_within_the_period():
    import datetime

    from slurm_tpu.ops.accounting import parse_sacct, summarize_sacct

    def at(minute: int, second: int = 0) -> str:
        return datetime.datetime(2026, 11, 25, 12, minute, second).isoformat()

    def stamp(minute: int) -> float:
        return datetime.datetime(2026, 11, 25, 12, minute).timestamp()

    text = "\n".join(
        [
            f"7|alice|{at(0)}|{at(2)}|billing=1,cpu=1,gres/tpu:edgetpu_usb=1,gres/tpu=1,node=1|"
            "slurm-tpu/n1:devices=1,inferences=12,inference_seconds=0.5",
            f"8_1|alice|{at(1)}|Unknown|cpu=1,gres/tpu=2|note|with a bar",  # running; AdminComment holding '|'
            f"9|bob|{at(3)}|{at(4)}|cpu=2,node=1|",  # no accelerator
            "10|bob|None|Unknown|gres/tpu=1|",  # never started
        ]
    )
    rows = parse_sacct(text)
    assert [r.job_id for r in rows] == ["7", "8_1", "9", "10"]
    # [12:01, 12:03): job 7 for 60 s, job 8_1 (still running at 12:05) for 120 s on 2 TPUs
    groups = summarize_sacct(rows, "user", ["gres/tpu", "gres/npu"], stamp(1), stamp(3), now=stamp(5))
    assert list(groups) == ["alice"]
    data = groups["alice"].to_json()
    assert data["tres_seconds"] == {"gres/tpu": 60 + 240} and data["jobs"] == 2 and data["inferences"] == 12
    by_job = summarize_sacct(rows, "job", ["gres/tpu"], None, None, now=stamp(5))
    assert by_job["8_1"].tres_seconds == {"gres/tpu": 2 * 240} and by_job["7"].tres_seconds == {"gres/tpu": 120}
