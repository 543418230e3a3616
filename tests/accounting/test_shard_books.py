"""The TPU broker's figures of shard jobs in the books: spool entry, AdminComment, report, metrics.

Records written before shards existed (version 1 entries, items without the shard figures) are
still read, and summed as before.
"""

from __future__ import annotations

import pytest

from helpers import exposition
from slurm_tpu.ops.accounting import parse_sacct, summarize_sacct
from slurm_tpu.ops.metrics import BrokerView, Holder, ShardJob, broker_families
from slurm_tpu.protocol.job_record import (
    SpoolEntry,
    decode_spool,
    encode_spool,
    merge,
    parse_admin_comment,
    render_item,
    shard_figures,
)

FIGURES = {"busy_ms": 1500.5, "inferences": 40, "model_swaps": 3, "queue_wait_ms": 250.0, "model_loads": 2}


def test_a_shard_entry_round_trips_as_version_2_and_an_old_entry_still_reads():
    entry = SpoolEntry(7, "n1", 0, 0, 0.0, None, shards=shard_figures(2, FIGURES))
    raw = encode_spool(entry)
    assert raw.startswith(b"version=2\n") and b"shard_busy_ms=1500.5\n" in raw and b"shards=2\n" in raw
    assert decode_spool(raw, "spool/7") == entry
    marked = SpoolEntry(7, "n1", 0, 0, 0.0, None, "mark", entry.shards)
    assert decode_spool(encode_spool(marked), "spool/7") == marked  # the collector's mark keeps the figures
    # Without shares: version 1, byte for byte what an older epilog wrote.
    old = b"version=1\njob=8\nnode=n1\ndevices=1\ninferences=12\ninference_seconds=0.5\nenergy_j=\n"
    assert decode_spool(old, "spool/8") == SpoolEntry(8, "n1", 1, 12, 0.5)
    assert encode_spool(SpoolEntry(8, "n1", 1, 12, 0.5)) == old


@pytest.mark.parametrize(
    "tail, why",
    [
        (b"shards=2\n", "version 1 with shards"),
        (
            b"shards=2\nshard_busy_ms=-1\nshard_inferences=1\nshard_model_swaps=0\n"
            b"shard_queue_wait_ms=0\nshard_model_loads=0\n",
            "negative",
        ),
        (
            b"shards=2\nshard_busy_ms=nan\nshard_inferences=1\nshard_model_swaps=0\n"
            b"shard_queue_wait_ms=0\nshard_model_loads=0\n",
            "negative",
        ),
    ],
)
def test_a_bad_shard_entry_is_named(tail, why):
    head = b"version=1\n" if "version 1" in why else b"version=2\n"
    raw = head + b"job=1\nnode=n1\ndevices=0\ninferences=0\ninference_seconds=0\nenergy_j=\n" + tail
    with pytest.raises(ValueError, match=why):
        decode_spool(raw, "spool/1")


def test_the_admin_comment_item_carries_the_figures_and_old_items_still_parse():
    entry = SpoolEntry(7, "n1", 1, 5, 0.25, None, shards=shard_figures(2, FIGURES))
    item = render_item(entry)
    assert item == (
        "slurm-tpu/n1:devices=1,inferences=5,inference_seconds=0.25,shards=2,shard_busy_ms=1500.5,"
        "shard_inferences=40,shard_model_swaps=3,shard_queue_wait_ms=250,shard_model_loads=2"
    )
    comment = merge("slurm-tpu/n2:devices=1,inferences=12,inference_seconds=0.5;admin note", entry)
    parsed = parse_admin_comment(comment)
    assert parsed["n2"] == {"devices": 1, "inferences": 12, "inference_seconds": 0.5}
    assert parsed["n1"]["shard_inferences"] == 40 and parsed["n1"]["shard_busy_ms"] == 1500.5


def test_report_sums_device_time_inferences_swaps_and_queue_wait_per_user_and_job():
    shard = render_item(SpoolEntry(7, "n1", 0, 0, 0.0, None, shards=shard_figures(1, FIGURES)))
    other = render_item(SpoolEntry(9, "n1", 0, 0, 0.0, None, shards=shard_figures(3, {**FIGURES, "model_swaps": 1})))
    text = "\n".join(
        [
            f"7|alice|2026-11-25T12:00:00|2026-11-25T12:01:00|cpu=1,gres/tpu_shard=1|{shard}",
            f"9|alice|2026-11-25T12:00:00|2026-11-25T12:02:00|cpu=1,gres/tpu_shard=3|{other}",
            "8|bob|2026-11-25T12:00:00|2026-11-25T12:01:00|gres/tpu=1|"
            "slurm-tpu/n1:devices=1,inferences=12,inference_seconds=0.5",  # an old item: no shard figures
        ]
    )
    rows = parse_sacct(text)
    by_user = summarize_sacct(rows, "user", ["gres/tpu", "gres/tpu_shard"], None, None, now=0)
    alice = by_user["alice"].to_json()
    assert alice["tres_seconds"] == {"gres/tpu_shard": 60 + 3 * 120}
    assert alice["shards"] == {
        "jobs": 2,
        "device_seconds": 3.001,
        "inferences": 80,
        "model_swaps": 4,
        "queue_wait_seconds": 0.5,
        "model_loads": 4,
    }
    assert "shards" not in by_user["bob"].to_json() and by_user["bob"].inferences == 12
    by_job = summarize_sacct(rows, "job", ["gres/tpu_shard"], None, None, now=0)
    assert by_job["9"].shards is not None and by_job["9"].shards.model_swaps == 1


def test_metrics_label_shard_jobs_and_gauge_each_shared_devices_utilization():
    view = BrokerView(
        (ShardJob(Holder(7, 0), 2, FIGURES),),
        {"usb-2-1.3": {"busy_s": 12.5, "utilization": 0.25, "model_swaps": 3, "inferences": 40}},
    )
    _, found = exposition(broker_families("n1", view))
    [up] = found["slurm_tpu_broker_up"].samples
    assert up.value == 1.0
    [busy] = found["slurm_tpu_job_shard_busy_seconds"].samples
    assert busy.labels == {"node": "n1", "hpc_job": "7", "hpc_user": "root"} and busy.value == pytest.approx(1.5005)
    assert found["slurm_tpu_job_shard_queue_wait_seconds"].samples[0].value == pytest.approx(0.25)
    assert found["slurm_tpu_job_shard_model_swaps"].samples[0].value == 3
    assert found["slurm_tpu_job_shards"].samples[0].value == 2
    [util] = found["slurm_tpu_device_utilization"].samples
    assert util.labels == {"node": "n1", "identity": "usb-2-1.3"} and util.value == 0.25
    assert found["slurm_tpu_device_busy_seconds"].samples[0].value == 12.5


def test_metrics_without_a_broker_say_so_once_and_leave_its_series_out():
    text, found = exposition(
        broker_families("n1", BrokerView(why="nothing listens on /run/slurm-tpu/broker/control.sock"))
    )
    assert set(found) == {"slurm_tpu_broker_up"} and found["slurm_tpu_broker_up"].samples[0].value == 0
    assert text.count("nothing listens") == 1


def test_a_node_sharing_nothing_has_no_broker_view(tmp_path):
    from slurm_tpu.ops.metrics import broker_view

    assert broker_view(str(tmp_path), shares_here=False) is None
    view = broker_view(str(tmp_path), shares_here=True)
    assert view is not None and "nothing listens" in view.why
