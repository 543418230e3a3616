"""Audit events (slurm_tpu.protocol.audit): the writer's bytes, the reader, the one lease pairing."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from slurm_tpu.access.ledger import Ledger
from slurm_tpu.protocol import FormatError, audit

# Lines as the hooks have written them since the audit log exists (ledger.json_line, before this package).
OLD_LOG = """\
{"event": "acquire", "identity": "usb-2-1.3", "job_id": 41, "nodes": ["/dev/bus/usb/002/005"], "t": 100.0, "uid": 4321}
{"event": "usage", "energy_j": null, "identity": "usb-2-1.3", "inferences": 12, "job_id": 41, "seconds": 0.25, "t": 103.5, "uid": 4321}
{"by_job": null, "devnum": 5, "event": "revoke", "identity": "usb-2-1.3", "job_id": 41, "t": 104.0, "uid": 4321}
{"event": "remove", "identity": "usb-2-1.3", "t": 104.1}
{"event": "reenumerate", "identity": "usb-2-1.3", "nodes": ["/dev/bus/usb/002/006"], "t": 105.2}
{"by_job": null, "event": "release", "identity": "usb-2-1.3", "job_id": 41, "t": 105.3, "uid": 4321}
{"event": "acquire", "identity": "usb-2-1.3", "job_id": 42, "nodes": ["/dev/bus/usb/002/006"], "t": 106.0, "uid": 1001}
{"event": "usage-unavailable", "job_id": 42, "reason": "Operation not permitted", "t": 106.1, "uid": 1001}
{"by_job": null, "event": "release", "identity": "usb-2-1.3", "job_id": 42, "t": 110.0, "uid": 1001}
{"by_job": 44, "event": "reclaim", "identity": "pci-0000:03:00.0", "job_id": 999999, "t": 111.0, "uid": 777}
{"event": "acquire", "identity": "pci-0000:03:00.0", "job_id": 44, "nodes": ["/dev/apex_0"], "t": 111.5, "uid": 1001}
{"event": "release", "identity": "usb-2-
"""


def test_the_writer_writes_the_bytes_the_hooks_always_wrote():
    fields = {"identity": "usb-2-1.3", "job_id": 41, "uid": 4321, "nodes": ["/dev/bus/usb/002/005"]}
    assert audit.encode(audit.ACQUIRE, 100.0, fields) == OLD_LOG.splitlines()[0].encode() + b"\n"
    odd = audit.encode(audit.SURVIVOR, 1.0000004, {"how": 'a "quoted"\\ ünïcode\n\x01', "pids": (1, 2), "ok": True})
    assert (
        odd == b'{"event": "survivor", "how": "a \\"quoted\\"\\\\ \xc3\xbcn\xc3\xafcode\\u000a\\u0001", '
        b'"ok": true, "pids": [1, 2], "t": 1.0}\n'
    )
    assert json.loads(odd)["how"] == 'a "quoted"\\ ünïcode\n\x01'


def test_round_trip_through_the_ledger(tmp_path):
    os.chmod(tmp_path, 0o755)
    with Ledger(str(tmp_path / "state")) as ledger:
        ledger.audit(audit.ACQUIRE, identity="usb-2-1.3", job_id=7, uid=1001, nodes=["/dev/x"])
        ledger.audit(audit.RELEASE, identity="usb-2-1.3", job_id=7, uid=1001, by_job=None)
    with open(tmp_path / "state" / audit.FILE, encoding="utf-8") as handle:
        events = list(audit.read_events(handle))
    assert [(e[audit.EVENT], e[audit.JOB_ID], e.get("by_job", "-")) for e in events] == [
        ("acquire", 7, "-"),
        ("release", 7, None),
    ]
    assert all(isinstance(e[audit.T], float) for e in events)


@pytest.mark.parametrize(
    "line, why",
    [
        ('{"event": "release", "identity": "usb-', "not a JSON object (not JSON, or a torn line)"),
        ("[1, 2]", "not a JSON object"),
        ("[" * 100000, "not a JSON object"),
        ('{"identity": "usb-1-1", "job_id": 1, "t": 1}', "no event name"),
        ('{"event": "acquire", "identity": "usb-1-1", "job_id": 1, "t": NaN}', "'t' is not a finite number"),
        ('{"event": "acquire", "identity": "usb-1-1", "job_id": 1, "t": 1e400}', "'t' is not a finite number"),
        ('{"event": "acquire", "identity": "usb-1-1", "job_id": 1, "t": ' + "1" * 400 + "}", "not a finite number"),
        ('{"event": "acquire", "identity": "usb-1-1", "job_id": 1, "t": "100"}', "not a finite number"),
        ('{"event": "acquire", "identity": ["usb-1-1"], "job_id": 1, "t": 1}', "'identity' is not a string"),
        ('{"event": "acquire", "identity": "usb-1-1", "job_id": "1", "t": 1}', "'job_id' is not an integer"),
        ('{"event": "acquire", "identity": "usb-1-1", "job_id": true, "t": 1}', "'job_id' is not an integer"),
        ('{"event": "acquire", "identity": "usb-1-1", "job_id": 1, "uid": 1.5, "t": 1}', "'uid' is not an integer"),
        ('{"event": "acquire", "identity": "usb-1-1", "job_id": 1, "t": 1, "v": 2}', "audit format version 2"),
    ],
)
def test_lines_that_are_not_events_are_refused_with_one_line_and_skipped_by_the_reader(line, why):
    with pytest.raises(FormatError) as refused:
        audit.decode(line, "audit.log line 3")
    assert str(refused.value).startswith("audit.log line 3: ") and why in str(refused.value)
    assert list(audit.read_events([line, OLD_LOG.splitlines()[0]])) == [json.loads(OLD_LOG.splitlines()[0])]


def test_an_old_log_pairs_into_spans_with_usage_and_no_conflicts():
    pairing = audit.pair_leases(audit.read_events(OLD_LOG.splitlines()))
    assert pairing.conflicts == []
    assert [(s.identity, s.job_id, s.uid, s.start, s.end, s.freed) for s in pairing.spans] == [
        ("usb-2-1.3", 41, 4321, 100.0, 104.0, 105.3),  # the job lost it at its revocation; free once back
        ("usb-2-1.3", 42, 1001, 106.0, 110.0, 110.0),
        ("pci-0000:03:00.0", 44, 1001, 111.5, None, None),
    ]  # the planted lease's reclaim pairs with nothing
    first = pairing.spans[0]
    assert (first.inferences, first.inference_seconds) == (12, 0.25)
    assert first.seconds_within(None, None, now=200.0) == 4.0
    assert pairing.spans[2].seconds_within(112.0, None, now=120.0) == 8.0


def test_overlaps_and_foreign_releases_are_conflicts():
    events = [
        {"event": "acquire", "identity": "usb-1-1", "job_id": 1, "uid": 5, "t": 1.0},
        {"event": "acquire", "identity": "usb-1-1", "job_id": 2, "uid": 6, "t": 2.0},
        {"event": "release", "identity": "usb-1-1", "job_id": 1, "uid": 5, "t": 3.0},
        {"event": "release", "identity": "usb-1-1", "job_id": 2, "uid": 6, "t": 4.0},
        {"event": "rollback", "identity": "pci-0000:01:00.0", "job_id": 3, "uid": 6, "t": 5.0},
        {"event": "clear", "identity": "pci-0000:02:00.0", "job_id": 9, "uid": 6, "t": 6.0},
    ]
    pairing = audit.pair_leases(events)
    assert pairing.conflicts == [
        "usb-1-1 acquired by job 2 at 2.0 while job 1 held it",
        "release of usb-1-1 by job 1 at 3.0 while job 2 held it",
        "rollback of pci-0000:01:00.0 by job 3 at 5.0, which never acquired it",
    ]  # a clear may end a planted lease
    assert [(s.job_id, s.end, s.freed) for s in pairing.spans] == [(1, 3.0, 3.0), (2, 4.0, 4.0)]


def test_forged_usage_figures_are_not_counted():
    events = [
        {"event": "acquire", "identity": "usb-1-1", "job_id": 1, "uid": 5, "t": 1.0},
        {"event": "usage", "identity": "usb-1-1", "job_id": 1, "uid": 5, "inferences": 10**20, "seconds": 1, "t": 2.0},
        {
            "event": "usage",
            "identity": "usb-1-1",
            "job_id": 1,
            "uid": 5,
            "inferences": 3,
            "seconds": 0.5,
            "energy_j": 2.0,
            "t": 2.5,
        },
        {"event": "usage", "identity": "usb-1-1", "job_id": 2, "uid": 5, "inferences": 3, "seconds": 0.5, "t": 2.6},
    ]  # a job that never held it
    (span,) = audit.pair_leases(events).spans
    # A job's own energy_j (older runners') is no figure: root's energy events are; the span has none.
    assert (span.inferences, span.inference_seconds, span.end) == (3, 0.5, None)
    assert not hasattr(span, "energy_j")


def test_every_event_the_package_writes_is_a_named_event():
    """A literal event name in an audit call must be declared (and documented) in protocol/audit.py."""
    package = Path(audit.__file__).resolve().parent.parent
    written = set()
    for path in package.rglob("*.py"):
        text = path.read_text(encoding="utf-8")
        written |= set(re.findall(r"\.audit\(\s*\"([^\"]+)\"", text))
        for first, second in re.findall(r"\.audit\(\s*\"([^\"]+)\" if .+? else \"([^\"]+)\"", text):
            written |= {first, second}
        written |= {getattr(audit, name) for name in re.findall(r"\.audit\(\s*(?:audit\.)?([A-Z_]+)", text)}
    assert written, "no audit calls found: the scan is broken"
    assert written <= audit.EVENTS, written - audit.EVENTS
    assert set(audit.CLOSING) >= set(audit.FREEING) and set(audit.CLOSING) <= audit.EVENTS
