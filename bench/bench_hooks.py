#!/usr/bin/env python3
"""Job throughput with the slurm-tpu hooks versus ``/bin/true`` hooks.

One real local cluster (node n1 with two simulated Edge TPUs). Rounds of trivial
``--gres=tpu:1`` jobs (a job array) alternate between the two hook sets, so
machine noise hits both alike; the hooks are switched by a mode file that the
timing wrappers read, not by reconfiguring Slurm. Every hook run is timed inside
its wrapper (bash ``$EPOCHREALTIME``) to report median prolog/epilog wall time.

    sudo /tmp/venv/bin/python bench/bench_hooks.py [--jobs-per-round 25] [--rounds 4] [--no-revoke] [--no-energy]

With revocation on (the default), every job on the USB stick ends with its port
power-cycled; the emulated USB core (harness/localcluster/usbcore.py) and the
udev hook bring it back, and the next job on that stick waits for that in its
prolog. The emulated core is no measure of real hardware (a real stick takes
about a second to re-enumerate); what this measures is the hooks' own cost.

Prints one JSON document; ``ratio`` = throughput(slurm-tpu) / throughput(/bin/true), each round
from its submit to its end; ``window_ratio`` the same from each round's first Prolog to its last
Epilog (without the scheduler's pick-up wait, which biases ``ratio``: see window_seconds);
``steady_ratio`` from each round's first to its last Prolog.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from harness.localcluster.cluster import Hooks, LocalCluster, NodeSpec, project_hooks  # noqa: E402
from slurm_tpu.ops.hook_client import shipped_hook  # noqa: E402

HARDWARE = os.path.join(REPO, "tests", "isolation", "hardware", "n1_two_tpus.umockdev")
BENCH_USER = "stpu_bench"
HOOKS = {
    "prolog": "prolog/slurm-tpu-prolog",
    "epilog": "epilog/slurm-tpu-epilog",
    "task_prolog": "prolog/slurm-tpu-task-prolog",
}

WRAPPER = """#!/bin/bash
# Timing wrapper: run the slurm-tpu hook or /bin/true, as the mode file says.
read -r mode < "{mode_file}"
start=$EPOCHREALTIME
{profile}case $mode in
    hooks) "{hook}"; rc=$? ;;
    baseline) "{baseline}"; rc=$? ;;
    *) /bin/true; rc=$? ;;
esac
end=$EPOCHREALTIME
[ "{kind}" = task_prolog ] || echo "$mode {kind} $start $end $rc" >> "{times}"
exit $rc
"""


def make_wrappers(
    directory: str,
    mode_file: str,
    times: str,
    profile: str | None = None,
    baseline: str | None = None,
    hooks: Hooks | None = None,
) -> Hooks:
    # --profile: slurm_tpu/hooks/probe.py appends each hook's per-step times to ``profile``.
    exports = (
        (
            f'SLURM_TPU_HOOK_PROFILE="{profile}" SLURM_TPU_PROFILE_T0=$start; '
            "export SLURM_TPU_HOOK_PROFILE SLURM_TPU_PROFILE_T0\n"
        )
        if profile
        else ""
    )
    paths = {}
    hooks = hooks or project_hooks()  # this tree's native entries where built, else its hooks themselves
    for kind, hook in HOOKS.items():
        path = os.path.join(directory, f"timed-{kind}")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(
                WRAPPER.format(
                    mode_file=mode_file,
                    hook=getattr(hooks, kind),
                    kind=kind,
                    times=times,
                    profile=exports,
                    baseline=os.path.join(baseline or REPO, hook),
                )
            )
        os.chmod(path, 0o755)
        paths[kind] = path
    return Hooks(**paths)


def run_round(cluster: LocalCluster, jobs: int, user: str | None) -> float:
    """Submit one array of ``jobs`` trivial TPU jobs; seconds until all have ended."""
    start = time.monotonic()
    array = cluster.sbatch(
        [f"--array=0-{jobs - 1}", "--gres=tpu:1", "-o", "/dev/null", "-e", "/dev/null"], "#!/bin/sh\ntrue\n", user=user
    )
    while True:
        out = cluster.command(
            ["squeue", "-h", "-r", "-j", str(array), "-t", "PD,CF,R,CG", "-o", "%i"], check=False
        ).stdout
        if not out.strip():
            return time.monotonic() - start
        time.sleep(0.05)


def steady_ms_per_job(prolog_starts: list[tuple[str, float]], jobs_per_round: int) -> dict[str, float]:
    """Hook set -> median over its rounds of ms per job between the round's first and last prolog start.

    Rounds run one at a time, so the wrappers' records come in runs of one hook set;
    the warm-up round (fewer jobs) is left out.
    """
    rounds: list[tuple[str, list[float]]] = []
    for mode, start in prolog_starts:
        if rounds and rounds[-1][0] == mode and len(rounds[-1][1]) < jobs_per_round:
            rounds[-1][1].append(start)
        else:
            rounds.append((mode, [start]))
    per_job: dict[str, list[float]] = {}
    for mode, starts in rounds:
        if len(starts) == jobs_per_round and jobs_per_round > 1:
            per_job.setdefault(mode, []).append((max(starts) - min(starts)) * 1000 / (jobs_per_round - 1))
    return {mode: statistics.median(values) for mode, values in per_job.items()}


def window_seconds(records: list[tuple[str, str, float, float]], jobs_per_round: int) -> dict[str, list[float]]:
    """Hook set -> per round, seconds from its first Prolog's start to its last Epilog's end (the wrappers'
    own clocks, ``records``: (mode, kind, start, end) in the order they were written).

    A round's submit-to-done time also holds the scheduler's pick-up of the new array: here the
    backfill scheduler starts it, on its tick once a second (bf_interval=1), so the wait is the tick's
    phase at the submit, and with rounds of about two seconds that phase stays with a hook set round
    after round instead of averaging out. This window leaves it out, and the squeue polling too.
    Rounds run one at a time, so a hook set's n-th run of ``jobs_per_round`` Prologs and of Epilogs
    belong to one round; a hook set with a missing record (a failed hook) has no windows.
    """
    by_mode: dict[str, dict[str, list[tuple[float, float]]]] = {}
    for mode, kind, start, end in records:
        by_mode.setdefault(mode, {}).setdefault(kind, []).append((start, end))
    windows: dict[str, list[float]] = {}
    for mode, kinds in by_mode.items():
        prologs, epilogs = kinds.get("prolog", []), kinds.get("epilog", [])
        if mode == "warmup" or len(prologs) != len(epilogs) or len(prologs) % jobs_per_round:
            continue
        windows[mode] = [
            max(end for _, end in epilogs[at : at + jobs_per_round])
            - min(start for start, _ in prologs[at : at + jobs_per_round])
            for at in range(0, len(prologs), jobs_per_round)
        ]
    return windows


def profile_medians(path: str, ends: dict[tuple[str, str], float]) -> tuple[dict[str, dict[str, float]], int]:
    """hook -> step -> median ms over the runs that had the step (probe.py's lines), with ``tail``: from
    the hook's last line to its wrapper's end (``ends``: (hook, wrapper start as written) -> end; an
    Epilog's line comes after its early answer, so it has none); and how many processes ran them."""
    steps: dict[str, dict[str, list[float]]] = {}
    workers: set[str] = set()  # the processes that ran the hooks (the agent's workers serve many)
    try:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                hook, *fields = line.split()
                values = dict(field.partition("=")[::2] for field in fields)
                end = ends.get((hook, values.pop("t0", "")))
                at = values.pop("at", None)
                workers.add(values.pop("pid", ""))
                if end is not None and at is not None and end > float(at):
                    values["tail"] = str((end - float(at)) * 1000)
                for step, value in values.items():
                    steps.setdefault(hook, {}).setdefault(step, []).append(float(value))
    except FileNotFoundError:
        return {}, 0
    medians = {
        hook: {step: round(statistics.median(values), 2) for step, values in by_step.items()}
        for hook, by_step in steps.items()
    }
    return medians, len(workers - {""})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs-per-round", type=int, default=25)
    parser.add_argument("--rounds", type=int, default=6, help="rounds per hook set (interleaved)")
    parser.add_argument("--keep", action="store_true", help="keep the cluster directory")
    parser.add_argument(
        "--no-revoke",
        action="store_true",
        help="devices.revoke: false (no USB port power-cycle at job end), to measure its cost",
    )
    parser.add_argument(
        "--no-energy",
        action="store_true",
        help="energy.enabled: false (no start file, no figures at job end), to measure what energy adds",
    )
    parser.add_argument(
        "--baseline",
        metavar="CHECKOUT",
        help="a third hook set, interleaved with the other two: the hooks of another checkout "
        "(e.g. /work/main, the hooks before the node agent); ratio_vs_baseline in the report",
    )
    parser.add_argument(
        "--no-gres-plugin",
        action="store_true",
        help="run the cluster without our gres/tpu plugin even where one is built (the Prolog asks scontrol)",
    )
    parser.add_argument(
        "--python-hooks",
        action="store_true",
        help="run this tree's hooks themselves (Python), not their native entries (the C client)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="per-step medians of each hook (slurm_tpu/hooks/probe.py) in the report"
    )
    parser.add_argument(
        "--user",
        default=BENCH_USER,
        help=f"submit as this user (created and removed if it is {BENCH_USER}); 'root' for root",
    )
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_hooks: must run as root (it starts Slurm daemons)", file=sys.stderr)
        return 2
    base = tempfile.mkdtemp(prefix="slurm-tpu-bench-", dir="/tmp")
    os.chmod(base, 0o755)
    mode_file, times = os.path.join(base, "mode"), os.path.join(base, "hook-times.txt")
    profile = os.path.join(base, "hook-profile.txt") if args.profile else None
    with open(mode_file, "w", encoding="utf-8") as handle:
        handle.write("warmup\n")  # /bin/true hooks, recorded apart from the measured rounds
    # Production keeps the ledger in /run (tmpfs); keep the bench's there too, not on
    # the test machine's disk (each lease and env file is fsync'ed).
    tmpfs = tempfile.mkdtemp(prefix="slurm-tpu-bench-", dir="/dev/shm") if os.path.isdir("/dev/shm") else base
    os.chmod(tmpfs, 0o755)
    hooks = project_hooks(native=not args.python_hooks)
    native = hooks.prolog != shipped_hook("slurm-tpu-prolog")
    cluster = LocalCluster(
        base=base,
        nodes=[NodeSpec("n1", HARDWARE)],
        hooks=make_wrappers(base, mode_file, times, profile, args.baseline, hooks),
        node_config_extra={
            "state_dir": os.path.join(tmpfs, "state"),
            "devices": {"revoke": not args.no_revoke},
            "energy": {"enabled": not args.no_energy},
        },
        gres_plugin=not args.no_gres_plugin,
    )
    results: dict[str, list[float]] = {"true": [], "hooks": []}
    if args.baseline:
        results["baseline"] = []
    user = None if args.user == "root" else args.user
    made_user = False
    if user == BENCH_USER and subprocess.run(["id", "-u", user], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "--no-create-home", "--shell", "/bin/sh", user], check=True)
        made_user = True
    try:
        cluster.configure()
        cluster.start()
        run_round(cluster, 4, user)  # warm-up: first jobs pay for cold caches
        modes = list(results)
        for number in range(args.rounds):
            # Each round runs every hook set once, in an order that rotates, so drift hits all alike.
            shift = number % len(modes)
            order = modes[shift:] + modes[:shift]
            for mode in order if number % 2 == 0 else order[::-1]:
                with open(mode_file, "w", encoding="utf-8") as handle:
                    handle.write(mode + "\n")
                results[mode].append(run_round(cluster, args.jobs_per_round, user))
        states = cluster.node_states()
        leases = subprocess.run(
            [*cluster.slurm_tpu, "leases", "--json"],
            capture_output=True,
            text=True,
            env=dict(os.environ, SLURM_TPU_CONFIG=cluster.node_config("n1")),
        ).stdout
    finally:
        cluster.stop()
        if made_user:
            subprocess.run(["userdel", user], capture_output=True)
    durations: dict[str, list[float]] = {}
    prolog_starts: list[tuple[str, float]] = []
    ends: dict[tuple[str, str], float] = {}
    records: list[tuple[str, str, float, float]] = []
    failures = 0
    with open(times, encoding="utf-8") as handle:
        for line in handle:
            mode, kind, start, end, rc = line.split()
            failures += rc != "0"
            durations.setdefault(f"{mode}_{kind}", []).append((float(end) - float(start)) * 1000)
            ends[(kind, start)] = float(end)
            records.append((mode, kind, float(start), float(end)))
            if kind == "prolog":
                prolog_starts.append((mode, float(start)))
    jobs = args.jobs_per_round * args.rounds
    throughput = {mode: jobs / sum(seconds) for mode, seconds in results.items()}
    steady = steady_ms_per_job(prolog_starts, args.jobs_per_round)
    windows = window_seconds(records, args.jobs_per_round)
    report = {
        "jobs_per_hook_set": jobs,
        "user": args.user,
        "revoke": not args.no_revoke,
        "energy": not args.no_energy,
        "native_entries": native,
        "gres_plugin": cluster.gres_plugin_dir,
        "round_seconds": {mode: [round(s, 2) for s in seconds] for mode, seconds in results.items()},
        "jobs_per_second": {mode: round(value, 2) for mode, value in throughput.items()},
        "ratio": round(throughput["hooks"] / throughput["true"], 3),
        # Per round (the hook sets of one round ran back to back): less exposed to one slow stretch.
        "ratio_of_medians": round(statistics.median(results["true"]) / statistics.median(results["hooks"]), 3),
        # Without each round's start (the scheduler picks the new array up 0.2 to 1 s after the
        # submit, the same wait for every hook set) and end: the steady state of the round.
        "steady_ms_per_job": {mode: round(value, 1) for mode, value in steady.items()},
        "steady_ratio": round(steady["true"] / steady["hooks"], 3) if steady.get("hooks") else None,
        # Each round from its first Prolog to its last Epilog: without the scheduler's pick-up
        # (window_seconds says why that wait biases ``ratio``) and the polling.
        "window_seconds": {mode: [round(w, 3) for w in values] for mode, values in windows.items()},
        "window_ratio": (
            round(sum(windows["true"]) / sum(windows["hooks"]), 3) if "true" in windows and "hooks" in windows else None
        ),
        "median_ms": {key: round(statistics.median(values), 1) for key, values in sorted(durations.items())},
        "hook_failures": failures,
        "node_states_after": states,
        "leases_left": json.loads(leases or "[]"),
    }
    if args.baseline:
        report["baseline"] = args.baseline
        report["ratio_vs_baseline"] = round(throughput["hooks"] / throughput["baseline"], 3)
        report["baseline_ratio"] = round(throughput["baseline"] / throughput["true"], 3)
    if profile:
        report["profile_median_ms"], report["profile_processes"] = profile_medians(profile, ends)
    print(json.dumps(report, indent=2))
    if not args.keep:
        shutil.rmtree(base, ignore_errors=True)
        shutil.rmtree(tmpfs, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
