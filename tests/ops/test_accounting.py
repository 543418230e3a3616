"""Accounting from audit events (read and paired by protocol.audit), on literal data."""

from __future__ import annotations

import json

from slurm_tpu.ops.accounting import summarize_audit
from slurm_tpu.protocol.audit import pair_leases, read_events


def lease_records(events):
    return pair_leases(events).spans


LINES = [
    {"event": "acquire", "identity": "usb-1-1", "job_id": 1, "uid": 1001, "t": 100.0},
    {"event": "acquire", "identity": "usb-1-2", "job_id": 2, "uid": 1002, "t": 105.0},
    {"event": "usage", "identity": "usb-1-1", "job_id": 1, "uid": 1001, "inferences": 40, "seconds": 0.6, "t": 109.0},
    {"event": "release", "identity": "usb-1-1", "job_id": 1, "uid": 1001, "t": 110.0},
    {"event": "acquire", "identity": "usb-1-1", "job_id": 3, "uid": 1001, "t": 111.0},
    {"event": "rollback", "identity": "usb-1-1", "job_id": 3, "uid": 1001, "t": 112.0},
    {"event": "remove", "identity": "usb-1-2", "t": 113.0},
    {"event": "reclaim", "identity": "usb-1-2", "job_id": 2, "uid": 1002, "by_job": 4, "t": 125.0},
    {"event": "acquire", "identity": "usb-1-2", "job_id": 4, "uid": 1002, "t": 126.0},
]


def records(extra: list[str] = ()):
    return lease_records(read_events([json.dumps(e) for e in LINES] + list(extra)))


def test_leases_are_paired_and_usage_attached():
    found = records(['{"event": "release", "identity": "usb-1-', "garbage"])  # torn last lines
    assert [(r.identity, r.job_id, r.start, r.end) for r in found] == [
        ("usb-1-1", 1, 100.0, 110.0),
        ("usb-1-2", 2, 105.0, 125.0),
        ("usb-1-1", 3, 111.0, 112.0),
        ("usb-1-2", 4, 126.0, None),
    ]
    assert found[0].inferences == 40 and found[0].inference_seconds == 0.6


def test_totals_by_user_device_and_job():
    by_user = summarize_audit(records(), "user", None, None, now=130.0, user_name=lambda uid: f"u{uid}")
    assert by_user["u1001"].to_json() == {
        "jobs": 2,
        "leases": 2,
        "lease_seconds": 11.0,
        "inferences": 40,
        "inference_seconds": 0.6,
        "mean_latency_ms": 15.0,
        # No energy events in this log: no figure, and no method to go with one.
        "energy_j": None,
        "energy_kwh": None,
        "energy_method": None,
        "energy_notes": [],
    }
    assert by_user["u1002"].to_json()["lease_seconds"] == 20.0 + 4.0  # job 4 still running at t=130
    by_device = summarize_audit(records(), "device", None, None, now=130.0)
    assert by_device["usb-1-1"].to_json()["jobs"] == 2 and by_device["usb-1-2"].to_json()["jobs"] == 2
    assert list(summarize_audit(records(), "job", None, None, now=130.0)) == ["1", "2", "3", "4"]


def test_period_clips_lease_time():
    window = summarize_audit(records(), "device", since=108.0, until=120.0, now=130.0)
    assert window["usb-1-1"].to_json()["lease_seconds"] == 2.0 + 1.0  # job 1: 108-110, job 3: 111-112
    assert window["usb-1-2"].to_json()["lease_seconds"] == 12.0  # job 2: 108-120
    late = summarize_audit(records(), "job", since=126.5, until=None, now=130.0)
    assert list(late) == ["4"]


def test_absurd_numbers_already_in_an_audit_log_are_skipped_not_fatal():
    """What an older version let a job write: 1e400 (parsed as inf), huge ints, NaN, negatives."""
    forged = [
        '{"event": "usage", "identity": "usb-1-1", "job_id": 1, "uid": 1001, "inferences": 1e400, '
        '"seconds": 1, "t": 109.5}',
        '{"event": "usage", "identity": "usb-1-1", "job_id": 1, "uid": 1001, "inferences": '
        + "1"
        + "0" * 400
        + ', "seconds": 1, "t": 109.5}',
        '{"event": "usage", "identity": "usb-1-1", "job_id": 1, "uid": 1001, "inferences": 5, '
        '"seconds": NaN, "t": 109.5}',
        '{"event": "usage", "identity": "usb-1-1", "job_id": 1, "uid": 1001, "inferences": 5, '
        '"seconds": -1, "t": 109.5}',
        '{"event": "usage", "identity": "usb-1-1", "job_id": 1, "uid": 1001, "inferences": -5, '
        '"seconds": 1, "t": 109.5}',
        '{"event": "usage", "identity": "usb-1-1", "job_id": 1, "uid": 1001, "inferences": "5", '
        '"seconds": 1, "t": 109.5}',
        '{"event": "acquire", "identity": "usb-9-9", "job_id": 9, "uid": 1001, "t": Infinity}',
        '{"event": "acquire", "identity": "usb-9-9", "job_id": "x", "uid": 1001, "t": 1}',
        '{"event": "acquire", "identity": "usb-9-9", "job_id": 9, "uid": 1001, "t": NaN}',
    ]
    found = lease_records(read_events([json.dumps(e) for e in LINES[:4]] + forged))
    assert [(r.identity, r.job_id, r.inferences, r.inference_seconds) for r in found] == [
        ("usb-1-1", 1, 40, 0.6),
        ("usb-1-2", 2, 0, 0.0),
    ]
    totals = summarize_audit(found, "user", None, None, now=130.0, user_name=str)
    assert totals["1001"].to_json()["inferences"] == 40
    json.dumps({k: t.to_json() for k, t in totals.items()}, allow_nan=False)  # strict JSON out


def test_a_revoked_usb_lease_ends_at_its_revocation_not_when_the_stick_is_back():
    events = [
        {"event": "acquire", "identity": "usb-1-1", "job_id": 7, "uid": 1001, "t": 200.0},
        {"event": "revoke", "identity": "usb-1-1", "job_id": 7, "uid": 1001, "devnum": 5, "t": 204.0},
        {"event": "remove", "identity": "usb-1-1", "t": 204.1},
        {"event": "release", "identity": "usb-1-1", "job_id": 7, "uid": 1001, "revoked": True, "t": 205.5},
    ]
    found = lease_records(read_events(json.dumps(e) for e in events))
    assert [(r.job_id, r.start, r.end) for r in found] == [(7, 200.0, 204.0)]
