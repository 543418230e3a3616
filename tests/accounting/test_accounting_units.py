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
    from slurm_tpu.protocol.energy import DeviceEnergy
    from slurm_tpu.protocol.job_record import (
        admin_energy,
        decode_spool,
        encode_spool,
        merge,
        parse_admin_comment,
        render_item,
        totals,
    )
    from slurm_tpu.protocol.usage import UsageRecord

    energy = [
        DeviceEnergy("usb-2-1.3", "edgetpu", 1.0, "self-reported", 2.0),
        DeviceEnergy("pci-0000:01:00.0", "edgetpu", 2.0, "estimated", 2.0),
        DeviceEnergy("pci-0000:41:00.0", "gpu", None, "unavailable", 2.0, "the energy counter went back"),
    ]
    entry = totals(42, "n1", 2, [UsageRecord("usb-2-1.3", 10, 0.25), UsageRecord("pci-0000:01:00.0", 2, 0.5)], energy)
    assert (entry.devices, entry.inferences, entry.inference_seconds, entry.energy_j) == (2, 12, 0.75, 3.0)
    assert entry.energy_method == "estimated+self-reported+unavailable"
    assert decode_spool(encode_spool(entry), "x") == entry
    assert render_item(entry) == (
        "slurm-tpu/n1:devices=2,inferences=12,inference_seconds=0.75,energy_j=3,"
        "energy_method=estimated+self-reported+unavailable"
    )
    # An admin's note and another node's item are kept; this node's item is replaced.
    other = totals(42, "n2", 1, [UsageRecord("usb-1-1", 5, 1.0)])
    text = merge(merge("checked by ops", entry), other)
    assert text == (
        "checked by ops;slurm-tpu/n1:devices=2,inferences=12,inference_seconds=0.75,energy_j=3,"
        "energy_method=estimated+self-reported+unavailable;slurm-tpu/n2:devices=1,inferences=5,inference_seconds=1"
    )
    again = totals(42, "n1", 1, [])
    assert merge(text, again).endswith(";slurm-tpu/n1:devices=1,inferences=0,inference_seconds=0")
    assert parse_admin_comment(text) == {
        "n1": {"devices": 2, "inferences": 12, "inference_seconds": 0.75},
        "n2": {"devices": 1, "inferences": 5, "inference_seconds": 1.0},
    }
    assert parse_admin_comment("slurm-tpu/n1:inferences=x;slurm-tpu/:a=1;junk") == {}
    # The energy, only with its method (admin_energy): another method than ours' is no figure.
    assert admin_energy(text) == {"n1": (3.0, "estimated+self-reported+unavailable")}
    assert admin_energy("slurm-tpu/n1:energy_j=3,energy_method=guessed") == {}


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

    if os.geteuid() != 0:
        pytest.skip("the spool is root's")
    spool = tmp_path / "var" / "accounting-spool"
    # No entry: Slurm is never asked (what it does with entries: test_accounting_usage.py, on a real cluster).
    assert collect(str(spool), slurm=None).applied == {}  # the first run makes the spool
    assert oct(spool.stat().st_mode & 0o777) == "0o700" and spool.stat().st_uid == 0
    (spool / "10").write_bytes(b"not an entry")
    (spool / ".11.123.tmp").write_bytes(b"half")  # an epilog still writing: not looked at
    os.symlink("/etc/passwd", spool / "12")
    result = collect(str(spool), slurm=None)
    assert set(result.refused) == {"10", "12"}
    assert "not a slurm-tpu spool entry" in result.refused["10"] and "symlink" in result.refused["12"]
    assert sorted(os.listdir(spool)) == [".11.123.tmp", "10", "12"]  # left for the admin, nothing lost


# ---- the collectors of a multi-node job: read-modify-write without a lock across nodes ------------


class Books:
    """``sacct``/``sacctmgr`` over one in-memory job table (raw job id -> AdminComment), as the collector
    calls them; ``during_sacct`` runs inside each sacct (a test moves its clock there)."""

    def __init__(self, **comments: str):
        self.comments = {job.lstrip("j"): text for job, text in comments.items()}
        self.writes = 0
        self.during_sacct = lambda: None

    def run(self, name: str, *args: str, timeout: float | None = None) -> str:
        if name == "sacct":
            self.during_sacct()
            job = args[args.index("-j") + 1]
            if job not in self.comments:
                return ""
            return f"{job}|{job}|COMPLETED|2025-01-01T00:00:10|{self.comments[job]}\n"
        assert name == "sacctmgr" and args[:5] == ("-i", "modify", "job", "where", args[4])
        self.comments[args[4].removeprefix("jobid=")] = args[-1].removeprefix("AdminComment=")
        self.writes += 1
        return ""


def _spooled(spool: str, entry) -> bytes:
    from slurm_tpu.hooks.jobusage import open_spool
    from slurm_tpu.protocol.job_record import encode_spool

    fd = open_spool(spool, create=True)
    try:
        raw = encode_spool(entry)
        with open(os.path.join(spool, str(entry.job_id)), "wb") as handle:
            handle.write(raw)
        return raw
    finally:
        os.close(fd)


def _nodes(comment: str) -> dict:
    from slurm_tpu.protocol.job_record import parse_admin_comment

    return {node: figures["inferences"] for node, figures in parse_admin_comment(comment).items()}


@pytest.fixture
def two_spools(tmp_path):
    """(spool of n1, spool of n2, n1's entry, n2's entry) of job 7, which ran on both."""
    from slurm_tpu.protocol.job_record import SpoolEntry

    if os.geteuid() != 0:
        pytest.skip("the spool is root's")
    spools = [str(tmp_path / node / "accounting-spool") for node in ("n1", "n2")]
    entries = [SpoolEntry(7, "n1", 1, 11, 0.5), SpoolEntry(7, "n2", 1, 22, 0.25)]
    for spool, entry in zip(spools, entries):
        _spooled(spool, entry)
    return spools, entries


def test_an_item_a_concurrent_collector_erased_is_written_again_and_both_end_final(two_spools, manual_clock):
    from slurm_tpu.hooks.jobusage import open_spool
    from slurm_tpu.ops.accounting import collect, mark_written, read_record, write_item

    (spool_a, spool_b), (entry_a, entry_b) = two_spools
    books, clock, window = Books(j7="checked by ops"), manual_clock.clock, 30.0
    # A reads, B reads, A writes, B writes: B's write, made from a read without A's item, erases it.
    read_a, read_b = read_record(books, entry_a, clock, window), read_record(books, entry_b, clock, window)
    for spool, entry, read in ((spool_a, entry_a, read_a), (spool_b, entry_b, read_b)):
        fd = open_spool(spool)
        try:
            raw = open(os.path.join(spool, "7"), "rb").read()
            mark = write_item(books, read, clock, window)
            assert mark is not None and mark_written(fd, "7", raw, entry, mark)
        finally:
            os.close(fd)
    assert _nodes(books.comments["7"]) == {"n2": 22}  # A's figures lost: what happened before this protocol
    # Within the window both entries wait (written, not yet checked), without asking Slurm.
    writes = books.writes
    assert set(collect(spool_a, books, window, clock).waiting) == {7} and books.writes == writes
    # A window later: A finds its item missing and writes it again; B finds its own, final: removed.
    manual_clock.advance(window)
    first, second = collect(spool_a, books, window, clock), collect(spool_b, books, window, clock)
    assert set(first.applied) == {7} and set(second.confirmed) == {7}
    assert os.listdir(spool_b) == [] and os.listdir(spool_a) == ["7"]
    manual_clock.advance(window)
    assert set(collect(spool_a, books, window, clock).confirmed) == {7}
    assert os.listdir(spool_a) == []
    assert _nodes(books.comments["7"]) == {"n1": 11, "n2": 22}
    assert books.comments["7"].startswith("checked by ops;")  # the admin's note kept throughout


def test_a_write_whose_read_is_older_than_half_the_window_reads_again(two_spools, manual_clock):
    from slurm_tpu.ops.accounting import READS, collect, read_record, write_item

    (spool_a, spool_b), (entry_a, entry_b) = two_spools
    books, clock, window = Books(j7=""), manual_clock.clock, 30.0
    read_b = read_record(books, entry_b, clock, window)
    assert write_item(books, read_record(books, entry_a, clock, window), clock, window) is not None
    manual_clock.advance(window / 2 + 0.001)
    assert write_item(books, read_b, clock, window) is None  # B does not write from its stale read
    assert set(collect(spool_b, books, window, clock).applied) == {7}  # it reads again: A's item is in it
    assert _nodes(books.comments["7"]) == {"n1": 11, "n2": 22}
    # A Slurm that answers slower than the window every time: the entry waits, nothing is written.
    books.comments["7"] = "reset by an admin"
    books.during_sacct = lambda: manual_clock.advance(window)
    writes = books.writes
    manual_clock.advance(window)
    result = collect(spool_a, books, window, clock)
    assert "slower than the window" in result.waiting[7] and books.writes == writes and READS > 1
    assert os.listdir(spool_a) == ["7"]


def test_an_item_found_unmarked_is_marked_then_confirmed_a_window_later(two_spools, manual_clock):
    from slurm_tpu.ops.accounting import collect
    from slurm_tpu.protocol.job_record import decode_spool, render_item

    (spool_a, _), (entry_a, _) = two_spools
    # A run wrote the item and stopped before it marked its entry.
    books, clock, window = Books(j7=render_item(entry_a)), manual_clock.clock, 30.0
    result = collect(spool_a, books, window, clock)
    assert "its item is there" in result.waiting[7] and books.writes == 0
    marked = decode_spool(open(os.path.join(spool_a, "7"), "rb").read(), "x")
    assert marked.written and marked.inferences == 11
    manual_clock.advance(window)
    assert set(collect(spool_a, books, window, clock).confirmed) == {7} and books.writes == 0


def test_a_mark_from_before_a_reboot_is_measured_by_the_wall_clock(manual_clock):
    clock = manual_clock.clock
    assert clock.since(clock.mark()) == 0
    assert clock.since(f"other-boot 5.0 {manual_clock.t - 40}") == 40  # its uptime means nothing now
    assert clock.since("garbage") is None


def test_entries_of_the_spool_under_the_state_dir_are_taken_over(tmp_path, manual_clock):
    """An older slurm-tpu spooled in <state_dir>/accounting-spool (on /run): its entries move to the
    configured spool, where they survive a reboot; the old directory stays for its epilogs."""
    from slurm_tpu.ops.accounting import collect
    from slurm_tpu.protocol.job_record import SpoolEntry, encode_spool

    if os.geteuid() != 0:
        pytest.skip("the spool is root's")
    legacy = tmp_path / "run" / "accounting-spool"
    legacy.mkdir(parents=True, mode=0o700)
    (legacy / "8").write_bytes(encode_spool(SpoolEntry(8, "n1", 1, 3, 0.1)))
    (legacy / "9").write_bytes(b"not an entry")
    spool = tmp_path / "var" / "accounting-spool"
    result = collect(str(spool), Books(j8=""), 30.0, manual_clock.clock, legacy=str(legacy))
    assert set(result.applied) == {8} and "not a slurm-tpu spool entry" in result.refused[f"{legacy}/9"]
    assert os.listdir(legacy) == ["9"] and os.listdir(spool) == ["8"]
    assert (spool / "8").stat().st_mode & 0o777 == 0o600


def test_the_spool_lives_on_persistent_storage_apart_from_the_state_dir():
    from slurm_tpu.config import Config

    config = Config()
    assert config.accounting_spool == "/var/lib/slurm-tpu/accounting-spool"
    assert not config.accounting_spool.startswith(("/run/", "/tmp/", "/dev/", config.state_dir + "/"))


def test_the_epilog_spools_only_into_a_root_only_spool_never_through_a_link(tmp_path):
    from slurm_tpu.hooks.jobusage import spool

    if os.geteuid() != 0:
        pytest.skip("the spool is root's")

    class Ledger:
        def __init__(self) -> None:
            self.audited: list = []

        def audit(self, *args, **fields):
            self.audited.append(fields)

    ledger, path = Ledger(), tmp_path / "var" / "accounting-spool"
    assert not spool(ledger, 5, 1000, "n1", 1, [], str(path))  # no collector ran here: nothing spooled
    path.parent.mkdir()
    os.symlink(tmp_path, path)
    assert not spool(ledger, 5, 1000, "n1", 1, [], str(path))  # a link is never followed
    os.unlink(path)
    path.mkdir(mode=0o755)
    os.chmod(path, 0o755)
    assert not spool(ledger, 5, 1000, "n1", 1, [], str(path)) and os.listdir(path) == []  # readable by others
    os.chmod(path, 0o700)
    assert spool(ledger, 5, 1000, "n1", 1, [], str(path))
    info = (path / "5").stat()
    assert (info.st_uid, info.st_mode & 0o777) == (0, 0o600)
    os.chmod(path.parent, 0o777)  # whoever can write its parent could swap the spool
    assert not spool(ledger, 6, 1000, "n1", 1, [], str(path))
    assert ledger.audited == []  # no collector, or no safe spool: said by doctor, not per job


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
