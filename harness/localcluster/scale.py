"""The scale run: many nodes, many short jobs from several users, faults on purpose, nothing lost.

Used by bench/bench_scale.py (32 nodes x 10,000 jobs) and tests/scale (a small
run in CI). Built on LocalCluster and the hooks' entry points only, whatever the
hooks do inside.

A run starts one LocalCluster of mixed simulated nodes (scalenodes.py), whose
Prolog/Epilog/TaskProlog are small wrappers (:data:`WRAPPER`) that run either the
project's hooks or ``/bin/true``, as a mode file says, so the same cluster
measures both. Each *phase* submits a workload (arrays and single jobs,
``--gres=tpu:1``/``:2``, the users in turn) with a bounded backlog, and can
interleave *events*, each made deterministic by waiting on what it needs to see:

* **cancel in prolog**: a held job gets a pause file before it is released;
  the prolog wrapper, once the real prolog has returned (the job holds its
  leases, Slurm still runs its prolog), writes ``<job>.in-prolog`` and waits;
  the run sees the marker and the job's lease in the ledger, scancels it, then
  lets the prolog end. The job must end CANCELLED, its lease released.
* **slurmd restart**: a holder job (jobprobe.py ``holder``) on a one-TPU node
  opens its device and says so; slurmd is stopped and started again while it
  runs, the run waits for the new slurmd to register, then lets the job end:
  its epilog runs under the new slurmd.
* **hotplug**: a holder job on a one-stick node holds the stick; the run sets
  the hub port's ``disable`` (the emulated USB core unplugs the stick: udev
  remove) and clears it (the stick re-enumerates with a new node: udev add),
  waits until the new node belongs to the job's user, then lets the job open
  it again and end.

Every job records its opens (jobprobe.py). At the end :func:`check` finds
overlapping holders (per node and device, from the jobs' own stamps), leases
left (``slurm-tpu leases --json`` on each node), drained nodes, and accounts for
every job from squeue: COMPLETED with a record showing its devices opened with
permission, or CANCELLED by an event of the run; anything else is named.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import threading
import time
from dataclasses import dataclass, field

from . import scalenodes
from .cluster import Hooks, LocalCluster, project_hooks

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOOKS_MODE, TRUE_MODE = "hooks", "true"
# Above the test suite's job ids (tests/helpers.py first_job_id: < 60,000,000) and below Slurm's
# MaxJobId (0x03ff0000): a run's ids never meet another cluster's on this machine.
FIRST_JOB_IDS = range(61_000_000, 66_000_000, 100_000)
TOP_PRIORITY = 4_294_967_000  # above priority/basic's 0xffff0000 countdown: an event's job starts next
# How often the run counts the jobs' records (a listdir of up to --jobs names): often enough to keep
# the backlog full, seldom enough to leave the machine to the jobs.
POLL_S = 0.2
PAUSE_WAIT_S = 600  # a paused prolog whose run died ends anyway
ACTIVE = (
    "PENDING,RUNNING,CONFIGURING,COMPLETING,SUSPENDED,REQUEUED,RESIZING,REQUEUE_HOLD,REQUEUE_FED,SIGNALING,STAGE_OUT"
)

# Runs the project's hook or /bin/true, as the mode file says. The prolog pauses after the
# hook when the run asked for it (a pause file named by the job id), saying so by a marker.
# The epilog and task prolog are exec'ed (no process more than /bin/true costs): a failing
# epilog shows as a drained node, which the run checks, not in the failures file.
WRAPPER = """#!/bin/sh
read -r mode < "{mode_file}"
if [ "$mode" != hooks ]; then
    /bin/true
    rc=$?
elif [ "{kind}" = prolog ]; then
    "{hook}"
    rc=$?
else
    exec "{hook}"
fi
[ "$rc" = 0 ] || echo "{kind} job $SLURM_JOB_ID on $SLURMD_NODENAME: exit $rc" >> "{failures}"
if [ "{kind}" = prolog ] && [ -e "{pause}/$SLURM_JOB_ID" ]; then
    echo "$SLURMD_NODENAME" > "{pause}/$SLURM_JOB_ID.in-prolog.tmp"
    mv "{pause}/$SLURM_JOB_ID.in-prolog.tmp" "{pause}/$SLURM_JOB_ID.in-prolog"
    waited=0
    while [ ! -e "{pause}/$SLURM_JOB_ID.go" ] && [ $waited -lt {pause_ticks} ]; do
        sleep 0.05
        waited=$((waited + 1))
    done
fi
exit $rc
"""

JOB = "#!/bin/sh\nexec /usr/bin/python3 -I -S {probe} {out} {nodes} {hold}{holder}\n"


@dataclass(frozen=True)
class Unit:
    """One submission: a single job (``size`` 1, ``array`` False) or a job array."""

    user: str
    tpus: int
    size: int
    array: bool


def workload(
    jobs: int, users: list[str], seed: int, tpu2_share: float = 0.25, single_share: float = 0.35, array_max: int = 60
) -> list[Unit]:
    """Submissions adding up to ``jobs`` jobs: arrays of 5..array_max and single jobs (a share of the
    submissions), ``tpu2_share`` of them asking for two Edge TPUs, the users in turn. Same seed, same list."""
    rng = random.Random(seed)
    units: list[Unit] = []
    left = jobs
    while left > 0:
        single = left == 1 or rng.random() < single_share
        size = 1 if single else min(left, rng.randint(min(5, left), max(5, array_max)))
        units.append(Unit(users[len(units) % len(users)], 2 if rng.random() < tpu2_share else 1, size, not single))
        left -= size
    return units


@dataclass
class Submitted:
    unit: Unit
    job_id: int
    phase: str
    role: str = "workload"  # or cancel / restart / hotplug


@dataclass
class Phase:
    """What one phase did: its jobs, how long, the events, the controller's RPC counts."""

    name: str
    mode: str
    out: str
    submitted: list[Submitted] = field(default_factory=list)
    seconds: float = 0.0
    events: list[dict] = field(default_factory=list)
    cancelled: set[int] = field(default_factory=set)
    sdiag: dict = field(default_factory=dict)

    @property
    def jobs(self) -> int:
        return sum(s.unit.size for s in self.submitted)


class ScaleError(RuntimeError):
    """The run could not go on (a stall, an event whose effect never showed)."""


def wait_for(predicate, what: str, stall_s: float = 300.0, poll_s: float = 0.1):
    """Poll ``predicate`` until it returns something true; ScaleError after ``stall_s`` without it."""
    deadline = time.monotonic() + stall_s
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise ScaleError(f"{what}: not seen within {stall_s:g} s")
        time.sleep(poll_s)


def parse_sdiag(text: str) -> dict:
    """``sdiag`` output -> {"by_type": {RPC: count}, "by_user": {user: count}, plus the job counters}."""
    result: dict = {"by_type": {}, "by_user": {}}
    section = None
    for line in text.splitlines():
        if "statistics by message type" in line:
            section = "by_type"
        elif "statistics by user" in line:
            section = "by_user"
        elif line and not line.startswith((" ", "\t")):
            section = None
        found = re.match(r"\s+(\S+)\s+\(\s*\d+\)\s+count:(\d+)", line)
        if section and found:
            result[section][found.group(1)] = int(found.group(2))
            continue
        counter = re.match(r"(Jobs (?:submitted|started|completed|canceled|failed)):\s+(\d+)", line.strip())
        if counter:
            result[counter.group(1).lower().replace(" ", "_")] = int(counter.group(2))
    return result


class ScaleRun:
    """One cluster and the phases run on it. Use as a context manager (the cluster is always stopped)."""

    def __init__(
        self,
        nodes: int = 32,
        users: list[str] | None = None,
        hold_s: float = 0.02,
        seed: int = 22,
        backlog: int | None = None,
        pattern: tuple[str, ...] = scalenodes.PATTERN,
        keep: bool = False,
        log=None,
    ):
        if not users:
            raise ValueError("a scale run needs at least one user")
        self.users = list(users)
        self.hold_s, self.seed, self.keep = hold_s, seed, keep
        self.log = log or (lambda message: None)
        self.layout = scalenodes.layout(nodes, pattern)
        self.kinds = dict(self.layout)
        self.tpus = sum(scalenodes.TPUS[k] for _, k in self.layout)
        if not self.tpus:
            raise ValueError("no node of the layout has an Edge TPU")
        self.max_tpus = max(scalenodes.TPUS[k] for _, k in self.layout)
        self.backlog = backlog or max(40, 2 * self.tpus)
        self.base = ""
        self.cluster: LocalCluster | None = None
        self.phases: list[Phase] = []
        self._lock = threading.Lock()
        self._restarted: dict[str, float] = {}  # node -> when its slurmd was last started again (time.time())

    # ---- cluster ---------------------------------------------------------------------------
    def __enter__(self) -> ScaleRun:
        import tempfile

        self.base = tempfile.mkdtemp(prefix="slurm-tpu-scale-", dir="/tmp")
        os.chmod(self.base, 0o755)
        for sub in ("out", "pause"):
            os.makedirs(self.path(sub))
            os.chmod(self.path(sub), 0o1777 if sub == "out" else 0o755)
        shutil.copy(os.path.join(os.path.dirname(os.path.abspath(__file__)), "jobprobe.py"), self.path("jobprobe.py"))
        os.chmod(self.path("jobprobe.py"), 0o644)
        self.mode_file, self.failures = self.path("mode"), self.path("hook-failures.txt")
        self.set_mode(TRUE_MODE)
        open(self.failures, "w").close()
        specs = scalenodes.node_specs(self.layout, self.path("hardware"))
        self.cluster = LocalCluster(
            base=self.base,
            nodes=specs,
            hooks=self._wrappers(),
            first_job_id=random.Random().choice(FIRST_JOB_IDS),
            # Every job of the run stays listed to the end (squeue -t all accounts for each).
            slurm_conf_extra=["MinJobAge=86400", "MaxJobCount=200000"],
        )
        try:
            started = time.monotonic()
            self.cluster.configure()
            self.cluster.start(timeout=300)
            self.log(
                f"cluster of {len(specs)} nodes ({self.tpus} Edge TPUs) up in "
                f"{time.monotonic() - started:.1f} s: {self.base}"
            )
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.cluster is not None:
            for name in os.listdir(self.path("pause")) if os.path.isdir(self.path("pause")) else ():
                if name.isdigit():  # never leave a prolog waiting
                    open(self.path("pause", name + ".go"), "w").close()
            self.cluster.stop()
        if not self.keep and self.base:
            shutil.rmtree(self.base, ignore_errors=True)

    def path(self, *parts: str) -> str:
        return os.path.join(self.base, *parts)

    def set_mode(self, mode: str) -> None:
        with open(self.mode_file + ".tmp", "w", encoding="ascii") as handle:
            handle.write(mode + "\n")
        os.rename(self.mode_file + ".tmp", self.mode_file)

    def _wrappers(self) -> Hooks:
        paths = {}
        os.makedirs(self.path("wrappers"))
        hooks = project_hooks()
        for kind in ("prolog", "epilog", "task_prolog"):
            path = self.path("wrappers", kind)
            with open(path, "w", encoding="utf-8") as handle:
                handle.write(
                    WRAPPER.format(
                        mode_file=self.mode_file,
                        kind=kind,
                        hook=getattr(hooks, kind),
                        failures=self.failures,
                        pause=self.path("pause"),
                        pause_ticks=int(PAUSE_WAIT_S / 0.05),
                    )
                )
            os.chmod(path, 0o755)
            paths[kind] = path
        return Hooks(**paths)

    def nodes_of(self, *kinds: str) -> list[str]:
        return [name for name, kind in self.layout if kind in kinds]

    # ---- submitting ------------------------------------------------------------------------
    def _script(self, out: str, holder: bool = False) -> str:
        return JOB.format(
            probe=self.path("jobprobe.py"),
            out=out,
            nodes=self.path("nodes"),
            hold=self.hold_s,
            holder=" holder" if holder else "",
        )

    def submit(
        self, phase: Phase, unit: Unit, role: str = "workload", extra: tuple[str, ...] = (), holder: bool = False
    ) -> Submitted:
        assert self.cluster is not None
        args = [
            "-n",
            "1",
            f"--gres=tpu:{unit.tpus}",
            "-o",
            "/dev/null",
            "-e",
            "/dev/null",
            "-J",
            f"scale-{role}",
            *extra,
        ]
        if unit.array:
            args.append(f"--array=0-{unit.size - 1}")
        job_id = self.cluster.sbatch(args, self._script(phase.out, holder), user=unit.user)
        done = Submitted(unit, job_id, phase.name, role)
        with self._lock:
            phase.submitted.append(done)
        return done

    def _records(self, phase: Phase) -> int:
        return sum(1 for name in os.listdir(phase.out) if name.endswith(".json"))

    def _done(self, phase: Phase) -> int:
        with self._lock:
            return self._records(phase) + len(phase.cancelled)

    def _active(self, phase: Phase) -> set[int]:
        """Ids (array job ids for arrays) of the phase's jobs Slurm still runs or queues."""
        assert self.cluster is not None
        out = self.cluster.command(["squeue", "-h", "-r", "-t", ACTIVE, "-o", "%F"], timeout=120).stdout
        ours = {s.job_id for s in phase.submitted}
        return {int(word) for word in out.split() if word.isdigit() and int(word) in ours}

    def _stuck(self, phase: Phase) -> str:
        """What keeps the phase from ending on its own (held jobs, drained nodes), '' when nothing does.

        Asked once every job of the phase is submitted and its events are over: a job of the
        phase held by then was held by Slurm (a failed prolog: "launch failed requeued held").
        """
        assert self.cluster is not None
        ours = {s.job_id for s in phase.submitted}
        out = self.cluster.command(["squeue", "-h", "-r", "-t", "PD", "-o", "%F|%i|%r"], timeout=120).stdout
        held = [
            f"job {i} ({reason})"
            for f, i, reason in (line.split("|", 2) for line in out.splitlines() if line.count("|") == 2)
            if f.isdigit() and int(f) in ours and "held" in reason.lower()
        ]
        drained = self.cluster.command(["sinfo", "-h", "-R", "-o", "%n: %E"], timeout=120).stdout.split("\n")
        drained = [line.strip() for line in drained if line.strip()]
        if not held and not drained:
            return ""
        return f"held: {held[:10]}; drained: {drained}"

    def run_phase(self, name: str, mode: str, units: list[Unit], events: list[tuple[float, str]] = ()) -> Phase:
        """Submit ``units`` (at most ``backlog`` jobs waiting at once) with ``events`` at fractions of the
        work done; return once every job of the phase has ended."""
        assert self.cluster is not None
        phase = Phase(name, mode, self.path("out", name))
        os.makedirs(phase.out)
        os.chmod(phase.out, 0o1777)
        self.phases.append(phase)
        self.set_mode(mode)
        self.cluster.command(["sdiag", "-r"])
        expected = sum(u.size for u in units)
        errors: list[BaseException] = []
        thread = None
        if events:
            thread = threading.Thread(target=self._events, args=(phase, events, expected, errors), daemon=True)
        started = time.monotonic()
        if thread:
            thread.start()
        last_done, last_change = 0, time.monotonic()
        for unit in units:
            while phase.jobs - self._done(phase) >= self.backlog and not errors:
                done = self._done(phase)
                if done != last_done:
                    last_done, last_change = done, time.monotonic()
                elif time.monotonic() - last_change > 300:
                    raise ScaleError(f"phase {name}: no job ended for 300 s ({done} of {phase.jobs} submitted)")
                time.sleep(POLL_S)
            if errors:
                break
            self.submit(phase, unit)
        if thread:
            thread.join()
        if errors:
            raise ScaleError(f"phase {name}: event failed: {errors[0]}") from errors[0]
        # Every job's record (or cancel), then Slurm's word that each has ended (epilog included).
        # A job Slurm requeued and held, or a drained node, never ends by itself: say so at once.
        expected_done = phase.jobs
        last_done, last_change, polls = -1, time.monotonic(), 0
        while self._done(phase) < expected_done or self._active(phase):
            done = self._done(phase)
            if done != last_done:
                last_done, last_change = done, time.monotonic()
            elif time.monotonic() - last_change > 300:
                raise ScaleError(
                    f"phase {name}: no job ended for 300 s; still queued or running: {sorted(self._active(phase))[:20]}"
                )
            polls += 1
            if polls % 25 == 0:
                stuck = self._stuck(phase)
                if stuck:
                    raise ScaleError(f"phase {name} cannot end: {stuck}")
            time.sleep(POLL_S)
        phase.seconds = time.monotonic() - started
        phase.sdiag = parse_sdiag(self.cluster.command(["sdiag"]).stdout)
        self.log(
            f"phase {name} ({mode}): {phase.jobs} jobs in {phase.seconds:.1f} s "
            f"({phase.jobs / phase.seconds:.2f} jobs/s)"
        )
        return phase

    # ---- events ----------------------------------------------------------------------------
    def _events(self, phase: Phase, events: list[tuple[float, str]], expected: int, errors: list) -> None:
        try:
            counts: dict[str, int] = {}
            for fraction, kind in sorted(events):
                while self._done(phase) < fraction * expected:
                    time.sleep(POLL_S)
                index = counts.get(kind, 0)
                counts[kind] = index + 1
                event = getattr(self, f"_event_{kind.replace('-', '_')}")(phase, index)
                event.update(kind=kind, at_fraction=fraction)
                phase.events.append(event)
                self.log(f"event {kind}: {event}")
        except BaseException as exc:  # noqa: BLE001 - the main loop raises it
            errors.append(exc)

    def _top(self, job_id: int) -> None:
        assert self.cluster is not None
        self.cluster.command(["scontrol", "release", str(job_id)])
        self.cluster.command(["scontrol", "update", f"JobId={job_id}", f"Priority={TOP_PRIORITY}"])

    def _user(self, index: int) -> str:
        return self.users[index % len(self.users)]

    def _event_cancel(self, phase: Phase, index: int) -> dict:
        assert self.cluster is not None
        tpus = 1 + index % min(2, self.max_tpus)
        job = self.submit(phase, Unit(self._user(index), tpus, 1, False), "cancel", ("--hold",))
        job_id = job.job_id
        pause = self.path("pause", str(job_id))
        open(pause, "w").close()
        self._top(job_id)
        marker = pause + ".in-prolog"
        wait_for(lambda: os.path.exists(marker), f"job {job_id}'s prolog to pause")
        with open(marker, encoding="ascii") as handle:
            node = handle.read().strip()
        held = [row["identity"] for row in self.leases(node) if row.get("job_id") == job_id]
        self.cluster.command(["scancel", str(job_id)], user=job.unit.user)
        with self._lock:
            phase.cancelled.add(job_id)
        # scancel returns once the controller has taken the cancel (_slurm_rpc_kill_job): only then
        # may the prolog end. The job shows as still starting until its prolog has ended.
        state = self.cluster.job_state(job_id)
        open(pause + ".go", "w").close()
        return {"job": job_id, "node": node, "tpus": tpus, "leases_held_in_prolog": held, "state_when_cancelled": state}

    def _holder(self, phase: Phase, index: int, node: str, role: str) -> tuple[Submitted, str]:
        job = self.submit(phase, Unit(self._user(index), 1, 1, False), role, ("--hold", "-w", node), holder=True)
        self._top(job.job_id)
        wait_for(
            lambda: os.path.exists(os.path.join(phase.out, f"{job.job_id}.holding")),
            f"{role} job {job.job_id} to hold its device on {node}",
        )
        return job, os.path.join(phase.out, f"{job.job_id}.go")

    def _slurmd_started(self, node: str) -> str:
        assert self.cluster is not None
        text = self.cluster.command(["scontrol", "-o", "show", "node", node], check=False).stdout
        found = re.search(r"SlurmdStartTime=(\S+)", text)
        state = re.search(r"State=(\S+)", text)
        if not found or not state or "NOT_RESPONDING" in state.group(1) or state.group(1).endswith("*"):
            return ""
        return found.group(1)

    def _event_restart(self, phase: Phase, index: int) -> dict:
        assert self.cluster is not None
        candidates = self.nodes_of("pcie1") or self.nodes_of("usb1")
        node = candidates[index % len(candidates)]
        job, go = self._holder(phase, index, node, "restart")
        # Slurm gives SlurmdStartTime in whole seconds: the new start must fall in another second
        # than the last one for the run to tell them apart (one node restarted twice in a row).
        time.sleep(max(0.0, 1.1 - (time.time() - self._restarted.get(node, 0.0))))
        before = self._slurmd_started(node)
        started = time.monotonic()
        self.cluster.stop_slurmd(node)
        self.cluster.start_slurmd(node)
        after = wait_for(
            lambda: (lambda t: t if t and t != before else "")(self._slurmd_started(node)),
            f"slurmd of {node} to register again",
        )
        seconds = time.monotonic() - started
        self._restarted[node] = time.time()
        open(go, "w").close()
        return {
            "job": job.job_id,
            "node": node,
            "slurmd_start_before": before,
            "slurmd_start_after": after,
            "seconds_down": round(seconds, 2),
        }

    def _event_hotplug(self, phase: Phase, index: int) -> dict:
        assert self.cluster is not None
        candidates = self.nodes_of("usb1")
        if not candidates:
            raise ScaleError("a hotplug event needs a node with one USB stick (kind usb1)")
        node = candidates[index % len(candidates)]
        job, go = self._holder(phase, index, node, "hotplug")
        sysfs = os.path.join(self.cluster.node_dir(node), "sys", "bus", "usb", "devices")
        (port,) = os.listdir(sysfs)
        device = os.path.join(sysfs, port)
        disable = os.path.join(os.path.realpath(os.path.join(device, "port")), "disable")
        before = _devname(device)
        uid = os.lstat(before).st_uid
        started = time.monotonic()
        _write(disable, "1")  # the emulated USB core unplugs it (udev remove) ...
        wait_for(lambda: not os.path.lexists(device), f"{node}'s stick to go")
        _write(disable, "0")  # ... and plugs it back: a new device node (udev add)

        def handed_over() -> str:
            node_path = _devname(device) if os.path.exists(device) else ""
            try:
                return node_path if node_path != before and os.lstat(node_path).st_uid == uid else ""
            except OSError:
                return ""

        after = wait_for(handed_over, f"{node}'s re-plugged stick to be handed to the job's user (uid {uid})")
        seconds = time.monotonic() - started
        open(go, "w").close()
        return {
            "job": job.job_id,
            "node": node,
            "port": port,
            "node_before": before,
            "node_after": after,
            "seconds": round(seconds, 3),
        }

    # ---- checking --------------------------------------------------------------------------
    def leases(self, node: str) -> list[dict]:
        """`slurm-tpu leases --json` on the node, as its admin would run it."""
        assert self.cluster is not None
        done = subprocess.run(
            [*self.cluster.slurm_tpu, "leases", "--json"],
            capture_output=True,
            text=True,
            env=dict(self.cluster.env(), SLURM_TPU_CONFIG=self.cluster.node_config(node)),
            timeout=120,
            check=False,
        )
        if done.returncode != 0:
            raise ScaleError(f"slurm-tpu leases on {node} failed: {done.stderr.strip()}")
        return json.loads(done.stdout or "[]")

    def leases_left(self, settle_s: float = 120) -> dict[str, list[dict]]:
        """Leases on every node with an Edge TPU, once revoked sticks are back (their lease ends then)."""
        left: dict[str, list[dict]] = {}
        for node, kind in self.layout:
            if not scalenodes.TPUS[kind]:
                continue
            rows = self.leases(node)
            deadline = time.monotonic() + settle_s
            while rows and all(r.get("phase") == "revoking" for r in rows) and time.monotonic() < deadline:
                time.sleep(0.2)
                rows = self.leases(node)
            if rows:
                left[node] = rows
        return left

    def check(self) -> dict:
        """The invariants over every phase so far: overlaps, leases left, drained nodes, job accounting."""
        assert self.cluster is not None
        states = self._final_states()
        accounting = {
            "completed": 0,
            "cancelled_by_run": 0,
            "unaccounted": [],
            "records_missing": [],
            "denied_opens": [],
            "wrong_devices": [],
        }
        spans: dict[tuple[str, str], list[tuple[float, float, str]]] = {}
        for phase in self.phases:
            records = {}
            for entry in os.listdir(phase.out):
                if entry.endswith(".json"):
                    with open(os.path.join(phase.out, entry), encoding="utf-8") as handle:
                        records[entry[: -len(".json")]] = json.load(handle)
            for sub in phase.submitted:
                for job_id, state, reason in states.get(sub.job_id, []):
                    self._account(phase, sub, job_id, state, reason, records.get(job_id), accounting, spans)
                got = len(states.get(sub.job_id, []))
                if got != sub.unit.size:
                    accounting["unaccounted"].append(
                        f"{sub.role} job {sub.job_id}: squeue lists {got} of its {sub.unit.size} jobs"
                    )
        overlaps = []
        for (node, identity), held in spans.items():
            held.sort()
            for (_start_a, end_a, job_a), (start_b, _end_b, job_b) in zip(held, held[1:]):
                if start_b < end_a and job_a != job_b:
                    overlaps.append(
                        f"{node} {identity}: job {job_b} opened it at {start_b:.6f} while job {job_a} "
                        f"held it until {end_a:.6f}"
                    )
        node_states = self.cluster.node_states()
        drained = {n: s for n, s in node_states.items() if any(w in s for w in ("DRAIN", "DOWN", "FAIL"))}
        leases_left = self.leases_left()
        with open(self.failures, encoding="utf-8") as handle:
            hook_failures = [line.strip() for line in handle if line.strip()]
        audit_conflicts = self._audit_conflicts()
        accounting["events_unverified"] = self._verify_events()
        return {
            "overlaps": len(overlaps),
            "overlap_details": overlaps[:20],
            "leases_left": sum(len(rows) for rows in leases_left.values()),
            "leases_left_details": leases_left,
            "drained": len(drained),
            "drained_details": drained,
            "hook_failures": hook_failures,
            "audit_conflicts": audit_conflicts,
            "devices_used": len(spans),
            **accounting,
        }

    def _verify_events(self) -> list[str]:
        """What each event's job recorded agrees with the event: a re-plugged stick was opened again under
        its new node, the job that outlived a slurmd restart opened its device before and after."""
        problems = []
        for phase in self.phases:
            for event in phase.events:
                if event["kind"] not in ("hotplug", "restart"):
                    continue
                path = os.path.join(phase.out, f"{event['job']}.json")
                if not os.path.exists(path):
                    problems.append(f"{event['kind']} job {event['job']}: no record")
                    continue
                with open(path, encoding="utf-8") as handle:
                    opens = json.load(handle)["opens"]
                if len(opens) != 2:
                    problems.append(f"{event['kind']} job {event['job']}: {len(opens)} opens recorded, not 2")
                elif event["kind"] == "hotplug" and [o["node"] for o in opens] != [
                    event["node_before"],
                    event["node_after"],
                ]:
                    problems.append(
                        f"hotplug job {event['job']} opened {[o['node'] for o in opens]}, not "
                        f"{event['node_before']} then {event['node_after']}"
                    )
        return problems

    def _final_states(self) -> dict[int, list[tuple[str, str, str]]]:
        """Submission id (array job id or the job's own) -> [(job id, state, reason)] from squeue."""
        assert self.cluster is not None
        out = self.cluster.command(["squeue", "-h", "-r", "-t", "all", "-o", "%F|%A|%T|%r"], timeout=300).stdout
        states: dict[int, list[tuple[str, str, str]]] = {}
        for line in out.splitlines():
            parts = line.split("|")
            if len(parts) == 4 and parts[0].isdigit():
                states.setdefault(int(parts[0]), []).append((parts[1], parts[2], parts[3]))
        return states

    def _account(
        self,
        phase: Phase,
        sub: Submitted,
        job_id: str,
        state: str,
        reason: str,
        record: dict | None,
        accounting: dict,
        spans: dict,
    ) -> None:
        label = f"{sub.role} job {job_id} ({phase.name}, {sub.unit.user}, tpu:{sub.unit.tpus})"
        if state == "CANCELLED" and int(job_id) in phase.cancelled:
            accounting["cancelled_by_run"] += 1
            if record is not None:
                accounting["unaccounted"].append(f"{label}: cancelled in its prolog, yet its script ran")
            return
        if state != "COMPLETED":
            accounting["unaccounted"].append(f"{label}: {state} ({reason})")
            return
        if record is None:
            accounting["records_missing"].append(label)
            return
        accounting["completed"] += 1
        if phase.mode != HOOKS_MODE:
            return  # /bin/true hooks hand out nothing
        identities = [i for i in (record.get("devices_env") or "").split(",") if i]
        if len(identities) != sub.unit.tpus or len(set(identities)) != len(identities):
            accounting["wrong_devices"].append(f"{label}: SLURM_TPU_DEVICES={record.get('devices_env')!r}")
        for opened in record["opens"]:
            # ok: an fd (a PCIe card's pty); ENXIO: a simulated stick's node let the user in, no driver behind it.
            if opened["result"] not in ("ok", "ENXIO") or opened.get("uid") != record["uid"]:
                accounting["denied_opens"].append(
                    f"{label}: {opened['node']}: {opened['result']} "
                    f"(node owned by uid {opened.get('uid')}, job uid {record['uid']})"
                )
            spans.setdefault((record["node"], opened["identity"]), []).append(
                (opened["open"]["mono"], opened["close"]["mono"], job_id)
            )

    def _audit_conflicts(self) -> list[str] | None:
        """The product's own pairing of each node's audit log (None where the hooks keep none)."""
        assert self.cluster is not None
        from slurm_tpu.protocol.audit import pair_leases

        conflicts: list[str] = []
        found = False
        for node, _ in self.layout:
            path = os.path.join(self.cluster.node_dir(node), "state", "audit.log")
            if not os.path.exists(path):
                continue
            found = True
            with open(path, encoding="utf-8") as handle:
                records = [json.loads(line) for line in handle if line.strip()]
            pairing = pair_leases(sorted(records, key=lambda r: r["t"]))
            conflicts += [f"{node}: {c}" for c in pairing.conflicts]
        return conflicts if found else None


def _devname(device: str) -> str:
    try:
        with open(os.path.join(device, "uevent"), encoding="ascii") as handle:
            for line in handle:
                if line.startswith("DEVNAME="):
                    return line[len("DEVNAME=") :].strip()
    except OSError:
        pass
    return ""


def _write(path: str, value: str) -> None:
    with open(path, "w", encoding="ascii") as handle:
        handle.write(value + "\n")


def attributable_to_hooks(true_phase: Phase, hooks_phase: Phase) -> dict[str, float]:
    """RPC type -> (count with the hooks - count with /bin/true) per job, for two phases of the same jobs;
    types whose counts are equal are left out."""
    jobs = max(1, hooks_phase.jobs)
    true_counts, hooks_counts = true_phase.sdiag.get("by_type", {}), hooks_phase.sdiag.get("by_type", {})
    extra = {}
    for rpc in sorted(set(true_counts) | set(hooks_counts)):
        delta = hooks_counts.get(rpc, 0) - true_counts.get(rpc, 0)
        if delta:
            extra[rpc] = round(delta / jobs, 3)
    return extra


def rpc_figures(phases: list[Phase]) -> dict:
    """Per phase: the controller's RPC counts by type and user (sdiag, reset at the phase's start), and the
    job-information queries per job, which the prolog's Slurm query causes."""
    figures = {}
    for phase in phases:
        by_type = phase.sdiag.get("by_type", {})
        jobs = max(1, phase.jobs)
        figures[phase.name] = {
            "mode": phase.mode,
            "jobs": phase.jobs,
            "by_type": by_type,
            "by_user": phase.sdiag.get("by_user", {}),
            "REQUEST_JOB_INFO": by_type.get("REQUEST_JOB_INFO", 0),
            "REQUEST_JOB_INFO_SINGLE": by_type.get("REQUEST_JOB_INFO_SINGLE", 0),
            "job_info_per_job": round(
                (by_type.get("REQUEST_JOB_INFO", 0) + by_type.get("REQUEST_JOB_INFO_SINGLE", 0)) / jobs, 3
            ),
            "rpcs_per_job": round(sum(by_type.values()) / jobs, 3),
        }
    return figures


def event_plan(cancels: int, restarts: int, hotplugs: int) -> list[tuple[float, str]]:
    """Each kind's events spread over the run (at fractions of its jobs done), kinds apart from each other."""
    plan = []
    for count, kind, offset in ((cancels, "cancel", 0.0), (restarts, "restart", 0.1), (hotplugs, "hotplug", 0.2)):
        plan += [(round(min(0.9, (i + 1) / (count + 1) * 0.8 + offset), 3), kind) for i in range(count)]
    return sorted(plan)


def run_scale(
    nodes: int,
    jobs: int,
    users: list[str],
    ratio_jobs: int = 0,
    cancels: int = 1,
    restarts: int = 1,
    hotplugs: int = 1,
    hold_s: float = 0.02,
    seed: int = 22,
    keep: bool = False,
    log=None,
    pattern: tuple[str, ...] = scalenodes.PATTERN,
) -> dict:
    """Start the cluster, run warm-up, the /bin/true and hooks slices (``ratio_jobs`` each, if any) and the
    full run of ``jobs`` jobs with its events; check; return the report (one JSON-able dict)."""
    with ScaleRun(nodes=nodes, users=users, hold_s=hold_s, seed=seed, keep=keep, log=log, pattern=pattern) as run:
        tpu_nodes = sum(1 for _, kind in run.layout if scalenodes.TPUS[kind])
        run.run_phase("warmup", HOOKS_MODE, workload(2 * tpu_nodes, users, seed + 2, single_share=0.0))
        throughput = {}
        if ratio_jobs:
            same = workload(ratio_jobs, users, seed + 1)
            slices = {}
            for mode in (TRUE_MODE, HOOKS_MODE):
                slices[mode] = phase = run.run_phase(f"slice-{mode}", mode, same)
                throughput[mode] = phase.jobs / phase.seconds
        full = run.run_phase("full", HOOKS_MODE, workload(jobs, users, seed), event_plan(cancels, restarts, hotplugs))
        checks = run.check()
        layout_kinds: dict[str, int] = {}
        for _, kind in run.layout:
            layout_kinds[kind] = layout_kinds.get(kind, 0) + 1
        ok = (
            checks["overlaps"] == 0
            and checks["leases_left"] == 0
            and checks["drained"] == 0
            and not checks["unaccounted"]
            and not checks["records_missing"]
            and not checks["denied_opens"]
            and not checks["wrong_devices"]
            and not checks["hook_failures"]
            and not checks["audit_conflicts"]
            and not checks["events_unverified"]
        )
        report = {
            "ok": ok,
            "nodes": nodes,
            "node_kinds": layout_kinds,
            "edge_tpus": run.tpus,
            "usb_sticks": sum(scalenodes.USB_STICKS[k] for _, k in run.layout),
            "users": users,
            "jobs": full.jobs,
            "jobs_all_phases": sum(p.jobs for p in run.phases),
            "overlaps": checks["overlaps"],
            "leases_left": checks["leases_left"],
            "drained": checks["drained"],
            "jobs_per_s_hooks": round(throughput[HOOKS_MODE], 3) if throughput else None,
            "jobs_per_s_true": round(throughput[TRUE_MODE], 3) if throughput else None,
            "ratio": round(throughput[HOOKS_MODE] / throughput[TRUE_MODE], 3) if throughput else None,
            "slice_jobs": ratio_jobs,
            "full_run": {
                "jobs": full.jobs,
                "seconds": round(full.seconds, 1),
                "jobs_per_s": round(full.jobs / full.seconds, 3),
                "events": full.events,
            },
            "phases": {p.name: {"mode": p.mode, "jobs": p.jobs, "seconds": round(p.seconds, 1)} for p in run.phases},
            "sdiag": rpc_figures(run.phases),
            # Our gres/tpu plugin's directory when the cluster loaded it: the prolog then reads the job's
            # Edge TPUs from SLURM_JOB_TPUS and asks the controller nothing (None: one query per job).
            "gres_plugin": run.cluster.gres_plugin_dir if run.cluster else None,
            # Per job of the slice: what the hooks add to the controller's load.
            "rpcs_per_job_from_hooks": attributable_to_hooks(slices[TRUE_MODE], slices[HOOKS_MODE])
            if throughput
            else None,
            "checks": checks,
            "base": run.base if keep else None,
        }
    return report
