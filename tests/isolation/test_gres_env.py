"""The prolog reads the job's Edge TPUs from SLURM_JOB_TPUS (our gres plugin) when it can, else asks Slurm.

Unit tests of hooks/allocation.py's reading of the variable (no daemons); the cluster
tests (test_gres_plugin.py) show slurmd really sets it and the hooks then ask nothing.
"""

from __future__ import annotations

import pytest

from slurm_tpu.hooks import allocation
from slurm_tpu.hooks.context import HookError, HookRun, JobContext
from slurm_tpu.slurm.jobdetail import GresAlloc


@pytest.mark.parametrize(
    ("value", "indices"),
    [("0", (0,)), ("0,3", (0, 3)), ("12,1", (12, 1)), ("9999", (9999,))],
)
def test_well_formed_values_give_the_indices_in_slurms_order(value, indices):
    assert allocation.parse_indices(value) == indices


@pytest.mark.parametrize(
    "value",
    ["", ",", "0,", ",0", "1,,2", " 1", "1 ", "-1", "+1", "0x1", "a", "1;2", "1\n2", "\u0661", "1,1", "12345"]
    + ["1," * 3000],
)
def test_malformed_values_are_refused(value):
    assert allocation.parse_indices(value) is None


def test_the_variable_gives_one_untyped_entry_per_gres():
    assert allocation.gres_from_env(7, ["tpu"], {"SLURM_JOB_TPUS": "2,0"}) == [GresAlloc("tpu", None, 2, (2, 0))]


def test_without_the_variable_slurm_is_asked():
    assert allocation.gres_from_env(7, ["tpu"], {}) is None


def test_a_node_that_also_leases_another_gres_asks_slurm():
    # The variable says nothing of the GPUs (or Hailo NPUs) the job may hold here.
    assert allocation.gres_from_env(7, ["tpu", "gpu"], {"SLURM_JOB_TPUS": "0"}) is None
    assert allocation.gres_from_env(7, ["gpu"], {"SLURM_JOB_GPUS": "0"}) is None


def test_a_malformed_value_asks_slurm_and_says_so_in_one_line(capsys):
    assert allocation.gres_from_env(7, ["tpu"], {"SLURM_JOB_TPUS": "0,,1"}) is None
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "job 7: SLURM_JOB_TPUS" in err[0] and "asking Slurm" in err[0]


class _Settings:
    """What query_job_gres reads of HookSettings: the leasable names, and Slurm (which must not be asked)."""

    def __init__(self, names: list[str]):
        self.names = names
        self.asked = 0
        self.shards = None  # the node shares no TPU

    def leasable_names(self) -> list[str]:
        return self.names

    def slurm(self, environ, detail_source=None):
        self.asked += 1
        raise HookError("asked Slurm")


def _run(settings: _Settings, env: dict[str, str]) -> HookRun:
    hook = HookRun("prolog", {**env, "SLURMD_NODENAME": "n1"})
    hook.settings, hook.job = settings, JobContext(7, 1000, "alice", "n1")  # type: ignore[assignment]
    return hook


def test_query_job_gres_asks_slurm_nothing_when_the_variable_covers_the_node():
    settings = _Settings(["tpu"])
    assert allocation.query_job_gres(_run(settings, {"SLURM_JOB_TPUS": "1"})) == [GresAlloc("tpu", None, 1, (1,))]
    assert settings.asked == 0


@pytest.mark.parametrize("env", [{}, {"SLURM_JOB_TPUS": "1,x"}])
def test_query_job_gres_asks_slurm_otherwise(env):
    settings = _Settings(["tpu"])
    with pytest.raises(HookError, match="asked Slurm"):
        allocation.query_job_gres(_run(settings, env))
    assert settings.asked == 1


@pytest.mark.parametrize(
    "names, env, asks",
    [
        (["tpu"], {"SLURM_JOB_TPUS": "1"}, False),  # a TPU job on a node whose GPUs are read for energy
        (["tpu"], {"SLURM_JOB_TPUS": "1", "SLURM_JOB_GPUS": "0"}, True),  # it holds a GPU too: which one?
        ([], {}, False),  # a CPU job on a GPU node: no query at all
        ([], {"SLURM_JOB_GPUS": "1"}, True),
    ],
)
def test_gpus_read_for_energy_cost_a_query_only_for_a_job_that_holds_one(names, env, asks):
    settings = _Settings(names)
    hook = _run(settings, env)
    if asks:
        with pytest.raises(HookError, match="asked Slurm"):
            allocation.query_job_gres(hook, ["gpu"])
    else:
        assert allocation.query_job_gres(hook, ["gpu"]) == allocation.gres_from_env(7, names, env)
    assert settings.asked == asks
