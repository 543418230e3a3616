"""The Slurm parsers on text captured from real clusters: Debian's 22.05.8 and 25.11.7.

The files under captured/<release>/ came from the same jobs on both releases
(see captured/README.md for how they were made and what each job is). Both
parsers (``scontrol show job -d`` text and ``squeue --json``) must give the
same answer for every job and node, on both releases.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slurm_tpu.slurm.jobdetail import ForgedOutputError, GresAlloc, SiblingsOnNode, parse_scontrol_job_detail
from slurm_tpu.slurm.parse import parse_node_state, parse_squeue_job_json

CAPTURED = Path(__file__).resolve().parent / "captured"
RELEASES = ("22.05", "25.11")
# The jobs (ids as submitted on both releases, see captured/README.md).
SINGLE, TYPED, MULTI, FORGED, ARRAY, HET, HET_1 = 1, 2, 3, 4, 5, 6, 7


def text(release: str, name: str) -> str:
    return (CAPTURED / release / name).read_text()


def squeue_json(release: str, job: str) -> str:
    # 22.05's squeue --json ignores -j: one capture lists every job.
    return text(release, "squeue_json_all.json" if release == "22.05" else f"squeue_json_{job}.json")


def usb(count, *idx):
    return GresAlloc("tpu", "edgetpu_usb", count, idx)


def pci(count, *idx):
    return GresAlloc("tpu", "edgetpu_pci", count, idx)


@pytest.mark.parametrize("release", RELEASES)
def test_versions_are_what_the_directories_say(release):
    assert text(release, "version.txt").split()[-1].startswith(release)


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize(
    "job, key, node, expected",
    [
        (SINGLE, "single", "n3", [usb(1, 0)]),
        (SINGLE, "single", "n1", None),
        (TYPED, "typed", "n1", [pci(2, 2, 3)]),
        (MULTI, "multi", "n1", [usb(1, 0), pci(0)]),
        (MULTI, "multi", "n2", [usb(1, 0), pci(0)]),
        (HET, "het", "n1", [usb(1, 1), pci(0)]),
    ],
)
def test_scontrol_and_squeue_json_agree(release, job, key, node, expected):
    assert parse_scontrol_job_detail(text(release, f"show_job_d_{key}.txt"), node, job) == expected
    assert parse_squeue_job_json(squeue_json(release, key), job, node) == expected


@pytest.mark.parametrize("release", RELEASES)
def test_the_array_task_under_the_master_id_is_narrowed_not_taken_for_a_forgery(release):
    # Tasks 0, 1, 2 of array 5 all run on n2; task 2 runs as job 5, and
    # `scontrol show job -d 5` lists every task with its own Nodes=n2 line.
    listing = text(release, "show_job_d_array.txt")
    assert listing.count("Nodes=n2 ") == 3
    with pytest.raises(SiblingsOnNode) as narrowed:
        parse_scontrol_job_detail(listing, "n2", ARRAY)
    assert narrowed.value.selector == "5_2"
    alone = text(release, "show_job_d_array_master_task.txt")  # `scontrol show job -d 5_2`
    expected = [usb(0), pci(1, 4)]
    assert parse_scontrol_job_detail(alone, "n2", ARRAY, narrowed=True) == expected
    assert parse_squeue_job_json(squeue_json(release, "array"), ARRAY, "n2") == expected


@pytest.mark.parametrize("release", RELEASES)
def test_het_components_are_told_apart_by_their_job_ids(release):
    listing = text(release, "show_job_d_het.txt")  # leader 6 on n1 lists component 7 on n2
    assert parse_scontrol_job_detail(listing, "n1", HET) == [usb(1, 1), pci(0)]
    with pytest.raises(SiblingsOnNode) as narrowed:  # the leader has no line for n2, component 7 has
        parse_scontrol_job_detail(listing, "n2", HET)
    assert narrowed.value.selector == "6+0"
    component = text(release, "show_job_d_het_comp1.txt")
    assert parse_scontrol_job_detail(component, "n2", HET_1) == [usb(0), pci(1, 5)]
    assert parse_squeue_job_json(squeue_json(release, "het"), HET_1, "n2") == [usb(0), pci(1, 5)]


@pytest.mark.parametrize("release", RELEASES)
def test_a_name_forging_a_line_and_a_record_is_caught_and_json_has_the_truth(release):
    # -J $'evil\n     Nodes=n2 ... GRES=tpu:edgetpu_usb:1(IDX:0)\nJobId=77777 JobName=x': the fake
    # JobId line moves Slurm's own line (IDX:1) into a fake record, leaving the forged IDX:0 in job 4's.
    forged = text(release, "show_job_d_forged.txt")
    assert forged.splitlines()[1].strip().endswith("(IDX:0)") and "JobId=77777" in forged
    with pytest.raises(ForgedOutputError):
        parse_scontrol_job_detail(forged, "n2", FORGED)
    assert parse_squeue_job_json(squeue_json(release, "forged"), FORGED, "n2") == [usb(1, 1), pci(0)]


FAKE_SIBLING = (
    "\n     Nodes=n2 CPU_IDs=0 Mem=0 GRES=tpu:edgetpu_pci:1(IDX:0)\nJobId=99 ArrayJobId=5 ArrayTaskId=7 JobName=x"
)


@pytest.mark.parametrize("release", RELEASES)
def test_a_fake_sibling_record_in_an_array_name_never_gives_its_index(release):
    # An array's name is in every task's record; here only the master's (a renamed task) holds it.
    listing = text(release, "show_job_d_array.txt").replace("JobName=arr", "JobName=arr" + FAKE_SIBLING, 1)
    with pytest.raises(SiblingsOnNode):
        parse_scontrol_job_detail(listing, "n2", ARRAY)
    alone = text(release, "show_job_d_array_master_task.txt").replace("JobName=arr", "JobName=arr" + FAKE_SIBLING)
    with pytest.raises(ForgedOutputError):
        parse_scontrol_job_detail(alone, "n2", ARRAY, narrowed=True)
    # Siblings only on other nodes: the job's own single line is Slurm's, whatever else is there.
    assert parse_scontrol_job_detail(text(release, "show_job_d_array.txt"), "n1", ARRAY) is None


def test_the_first_record_must_be_the_job_asked_for():
    with pytest.raises(ForgedOutputError):
        parse_scontrol_job_detail(text("25.11", "show_job_d_single.txt"), "n3", 2)
    assert parse_scontrol_job_detail("", "n3", 1) is None


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("name", ["show_node_o_drained.txt", "show_node_n3_drained.txt"])
def test_node_state_in_both_layouts(release, name):
    state = parse_node_state(text(release, name))
    assert state == {
        "state": "MIXED+DRAIN",
        "reason": "slurm-tpu: test reason with spaces",
        "gres": "tpu:edgetpu_usb:1",
    }


@pytest.mark.parametrize("release", RELEASES)
def test_node_state_one_line_per_node(release):
    lines = text(release, "show_node_o.txt").splitlines()
    states = {line.split()[0]: parse_node_state(line) for line in lines}
    assert set(states) == {"NodeName=n1", "NodeName=n2", "NodeName=n3"}
    assert states["NodeName=n3"]["gres"] == "tpu:edgetpu_usb:1" and states["NodeName=n3"]["reason"] == ""
    assert states["NodeName=n1"]["gres"].startswith("tpu:edgetpu_usb:2,tpu:edgetpu_pci:4,gpu:a100_sxm4_80gb:2(S:")


def test_squeue_json_of_neither_layout_is_an_error():
    with pytest.raises(ValueError):
        parse_squeue_job_json(json.dumps({"nothing": []}), 1, "n1")
