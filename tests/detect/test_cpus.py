"""CPU lists and GPU core affinity (Cores=) in Slurm's core indices."""

from __future__ import annotations

import pytest

from helpers import detect_json, run_cli
from slurm_tpu.cpulist import core_indices, format_cpu_list, parse_cpu_list


def test_cpu_lists_round_trip():
    assert parse_cpu_list("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert format_cpu_list([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert parse_cpu_list("") == [] and format_cpu_list([]) == ""
    with pytest.raises(ValueError):
        parse_cpu_list("0-x")


def test_core_indices_rank_packages_and_core_ids():
    topology = {0: (0, 0), 1: (0, 2), 2: (1, 0), 3: (1, 2), 4: (0, 0), 5: (0, 2)}
    assert core_indices(topology) == {0: 0, 1: 1, 2: 2, 3: 3, 4: 0, 5: 1}


def test_smt_node_gets_cores_not_thread_ids():
    document = detect_json("smt_gpu_node")
    assert document["core_of_cpu"] == {"0": 0, "1": 1, "2": 2, "3": 3, "4": 0, "5": 1, "6": 2, "7": 3}
    result = run_cli(["gres-conf", "--node", "g1"], "smt_gpu_node")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith("NodeName=")]
    # local_cpulist 0-1,4-5 is threads of cores 0-1; slurmd knows only cores 0-3.
    assert lines == [
        "NodeName=g1 Name=gpu Type=a40 File=/dev/nvidia0 Cores=0-1",
        "NodeName=g1 Name=gpu Type=a40 File=/dev/nvidia1 Cores=2-3",
    ]
