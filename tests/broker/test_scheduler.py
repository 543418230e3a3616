"""The broker's scheduler (pure): shares, no banked credit, ties toward the loaded model."""

from __future__ import annotations

from slurm_tpu.broker.scheduler import Scheduler


def _saturate(scheduler: Scheduler, costs: dict[int, float], rounds: int) -> dict[int, float]:
    busy = dict.fromkeys(costs, 0.0)
    for _ in range(rounds):
        for job in costs:
            while scheduler.queued(job) < 2:
                scheduler.submit(job, "m", None)
        job, _, _ = scheduler.pick("m")
        scheduler.charge(job, costs[job])
        busy[job] += costs[job]
    return busy


def test_device_time_follows_shares_whatever_each_request_costs():
    scheduler = Scheduler()
    scheduler.add_job(1, 1)
    scheduler.add_job(2, 3)
    busy = _saturate(scheduler, {1: 0.004, 2: 0.001}, 4000)  # job 2's requests are 4x cheaper
    assert abs(busy[2] / busy[1] - 3) < 0.05


def test_an_idle_job_banks_no_credit():
    scheduler = Scheduler()
    scheduler.add_job(1, 1)
    scheduler.add_job(2, 1)
    _saturate(scheduler, {1: 0.001}, 1000)  # job 2 asks nothing meanwhile
    busy = _saturate(scheduler, {1: 0.001, 2: 0.001}, 100)
    assert busy[1] == busy[2]  # no burst of 1000 for the late job


def test_ties_go_to_the_model_on_the_device():
    scheduler = Scheduler()
    scheduler.add_job(1, 1)
    scheduler.add_job(2, 1)
    scheduler.submit(1, "a", "first")
    scheduler.submit(2, "b", "second")
    assert scheduler.pick("b")[2] == "second"
    assert scheduler.remove_job(1) == ["first"]
