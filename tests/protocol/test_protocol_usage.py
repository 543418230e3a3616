"""Usage records (slurm_tpu.protocol.usage): the bytes, records older runners wrote, and refusals.

The runner side and the reader's file checks are in tests/runner/test_runner_usage.py;
the real per-job box on a real cluster in tests/isolation/test_usage_attacks.py.
"""

from __future__ import annotations

import json
import os

import pytest

from slurm_tpu.access.ledger import Ledger
from slurm_tpu.hooks import jobusage
from slurm_tpu.protocol import FormatError, audit
from slurm_tpu.protocol.usage import FORMAT_VERSION, UsageRecord, decode, encode, record_name

# What the runner has written since usage records exist (json.dumps of the running totals).
OLD_RECORD = b'{"version": 1, "inferences": 8, "seconds": 0.012345, "energy_j": null}'


def test_round_trip_and_the_bytes_older_runners_wrote():
    assert encode(8, 0.0123451) == b'{"version": 1, "inferences": 8, "seconds": 0.012345}'
    # Older runners wrote energy_j (always null): still read, the field ignored (energy is root's).
    assert decode(OLD_RECORD, "usb-2-1.4") == UsageRecord("usb-2-1.4", 8, 0.012345)
    forged = b'{"version": 1, "inferences": 8, "seconds": 0.5, "energy_j": "lots"}'
    assert decode(forged, "usb-2-1.4") == UsageRecord("usb-2-1.4", 8, 0.5)
    assert decode(encode(3, 1.5), "pci-0000:03:00.0") == UsageRecord("pci-0000:03:00.0", 3, 1.5)
    assert FORMAT_VERSION == 1 and record_name("usb-2-1.4") == "usb-2-1.4.json"


@pytest.mark.parametrize(
    "raw, why",
    [
        (b'{"version": 2, "inferences": 1, "seconds": 1}', "is not format version 1"),
        (b'{"inferences": 1, "seconds": 1}', "is not format version 1"),
        (b'{"version": 1, "inferences": 1e400, "seconds": 1}', "figures out of bounds"),
        (b'{"version": 1, "inferences": true, "seconds": 1}', "figures out of bounds"),
        (b"[1, 2]", ": not a JSON object"),
        (b"\xff{", ": not a JSON object (not JSON"),
        (b" " * 5000, "is over 4096 bytes"),
    ],
)
def test_forged_records_are_refused_with_one_line_naming_the_file(raw, why):
    with pytest.raises(FormatError) as refused:
        decode(raw, "usb-2-1.4")
    assert str(refused.value).startswith("usage record usb-2-1.4.json") and why in str(refused.value)


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting the job's usage box needs root")
def test_the_epilog_audits_a_rejected_record_and_counts_a_good_one(tmp_path):
    os.chmod(tmp_path, 0o755)
    uid = os.getuid()
    with Ledger(str(tmp_path / "state")) as ledger:
        box = jobusage.prepare(ledger, 77, uid)
        assert box is not None, "no usage box (mount refused?)"
        try:
            with open(os.path.join(box, "usb-2-1.4.json"), "wb") as handle:
                handle.write(b'{"version": 1, "inferences": 1e400, "seconds": 1}')
            os.symlink("/etc/shadow", os.path.join(box, "usb-2-1.5.json"))
            with open(os.path.join(box, "usb-2-1.6.json"), "wb") as handle:
                handle.write(OLD_RECORD)
            assert len(jobusage.collect(ledger, 77, uid, ["usb-2-1.4", "usb-2-1.5", "usb-2-1.6", "usb-2-1.7"])) == 1
        finally:
            jobusage.discard(ledger, 77)
    with open(tmp_path / "state" / audit.FILE, encoding="utf-8") as handle:
        events = [json.loads(line) for line in handle]
    assert [(e["event"], e["identity"]) for e in events] == [
        (audit.USAGE_REJECTED, "usb-2-1.4"),
        (audit.USAGE_REJECTED, "usb-2-1.5"),
        (audit.USAGE, "usb-2-1.6"),
    ]
    assert "figures out of bounds" in events[0]["reason"] and "is a symbolic link" in events[1]["reason"]
    assert (events[2]["inferences"], events[2]["seconds"], events[2]["job_id"]) == (8, 0.012345, 77)
