"""The node's energy in Slurm's job record: the spool entry's version 3 (``energy_j`` from root's
figures, ``energy_method``) and the AdminComment item, with versions 1 and 2 still read."""

from __future__ import annotations

import pytest

from slurm_tpu.protocol.broker_wire import FIGURES
from slurm_tpu.protocol.energy import DeviceEnergy
from slurm_tpu.protocol.job_record import (
    admin_energy,
    decode_spool,
    encode_spool,
    parse_admin_comment,
    render_item,
    shard_figures,
    totals,
)

V1 = b"version=1\njob=8\nnode=n1\ndevices=1\ninferences=12\ninference_seconds=0.5\nenergy_j=\n"


def test_version_3_round_trips_with_and_without_shards():
    measured = [DeviceEnergy("pci-0000:41:00.0", "gpu", 987.654, "measured", 120.0)]
    entry = totals(9, "n1", 0, [], measured)
    raw = encode_spool(entry)
    assert raw == (
        b"version=3\njob=9\nnode=n1\ndevices=0\ninferences=0\ninference_seconds=0\n"
        b"energy_j=987.654\nenergy_method=measured\n"
    )
    assert decode_spool(raw, "spool/9") == entry
    shard = [DeviceEnergy("usb-2-1.3", "edgetpu", 150.0, "estimated", 600.0, "busy time measured by the broker")]
    entry = totals(10, "n1", 0, [], shard)
    entry.shards = shard_figures(2, dict.fromkeys(FIGURES, 1))
    assert decode_spool(encode_spool(entry), "spool/10") == entry
    item = render_item(entry)
    assert "energy_j=150,energy_method=estimated,shards=2" in item
    assert admin_energy(item) == {"n1": (150.0, "estimated")} and "energy_j" not in parse_admin_comment(item)["n1"]


def test_every_figure_unavailable_is_a_method_with_no_joules():
    entry = totals(11, "n1", 1, [], [DeviceEnergy("x", "gpu", None, "unavailable", 5.0, "rebooted")])
    assert (entry.energy_j, entry.energy_method) == (None, "unavailable")
    assert decode_spool(encode_spool(entry), "spool/11") == entry
    assert render_item(entry).endswith("inference_seconds=0,energy_method=unavailable")


def test_versions_1_and_2_are_still_read_and_written_without_energy():
    entry = decode_spool(V1, "spool/8")
    assert (entry.energy_j, entry.energy_method) == (None, "")
    assert encode_spool(entry) == V1  # no energy figure: still version 1


@pytest.mark.parametrize(
    "raw, why",
    [
        (V1.replace(b"version=1", b"version=3"), "without energy_method"),
        (V1 + b"energy_method=measured\n", "with energy_method"),
        (V1.replace(b"version=1", b"version=3") + b"energy_method=guessed\n", "not an energy method"),
        (
            V1.replace(b"version=1", b"version=3").replace(b"energy_j=", b"energy_j=-5") + b"energy_method=measured\n",
            "out of range",
        ),
        (V1.replace(b"energy_j=", b"energy_j=nan"), "out of range"),
    ],
)
def test_an_entry_that_is_not_one_is_refused_naming_it(raw, why):
    with pytest.raises(ValueError, match="spool/8") as refused:
        decode_spool(raw, "spool/8")
    assert why in str(refused.value)
