"""What the demo prints: the cluster, the timeline and its checks, the batch, what next."""

from __future__ import annotations

import glob
import json
import os
import re
import string
from collections.abc import Sequence

from .experiment import (
    CLIENT_NODE,
    CONTAINER_NODES,
    CORAL_NODE,
    SERVE_IMAGES,
    SERVE_NODE,
    Containerised,
    Served,
    SharedRun,
    Submitted,
)
from .layout import JOBS_DIR, NODES, SHARD_NODE, SHARED_STICK, SHARES, Layout
from .records import JobRecord, Lease, parse_audit
from .timeline import Check, build_lanes, check_run, nice_step, render

INTRO = """\
slurm-tpu demo: a real Slurm cluster on this machine (slurmctld + 5 slurmd on 127.0.0.1)
  The accelerators are simulated at the hardware boundary only: umockdev describes each
  node's devices, the real `slurm-tpu detect` finds them through libudev, and real device
  nodes stand in for them. There is no Edge TPU here: "TPU" inference runs through the
  project's test-double libedgetpu, which runs the model on this machine's CPU."""

_DONE = re.compile(r"done: (\d+)/(\d+) inputs .*?, ([\d.]+)/s")


def node_devices(layout: Layout) -> dict[str, list[str]]:
    """Node -> its whole Edge TPUs' identities (from the inventory detect produced for it): a shared
    one is never leased, so it has no lane and counts for no ``tpu`` job."""
    result = {}
    for node in NODES:
        with open(os.path.join(layout.node_dir(node.name), "inventory.json"), encoding="utf-8") as handle:
            accelerators = json.load(handle)["accelerators"]
        result[node.name] = [
            a["identity"]
            for a in accelerators
            if a["kind"] == "edgetpu" and (node.name, a["identity"]) != (SHARD_NODE, SHARED_STICK)
        ]
    return result


def cluster_lines(layout: Layout) -> list[str]:
    """One line per node: its generated Gres= and what the node has."""
    gres = {}
    with open(layout.path("etc", "nodes.conf"), encoding="utf-8") as handle:
        for line in handle:
            if line.startswith("NodeName="):
                fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
                gres[fields["NodeName"]] = fields.get("Gres", "-")
    width = max(len(n.name) for n in NODES)
    gres_width = max(len(g) for g in gres.values()) if gres else 1
    return [f"  {n.name:{width}}  Gres={gres.get(n.name, '-'):{gres_width}}  {n.summary}" for n in NODES]


def symbols_for(submitted: Submitted, jobs: Sequence[JobRecord]) -> dict[int, str]:
    """A, B... for TPU jobs, a, b... for plain jobs, 0, 1... for array tasks."""
    symbols = {job: string.ascii_uppercase[i % 26] for i, job in enumerate(submitted.tpu)}
    symbols.update({job: string.ascii_lowercase[i % 26] for i, job in enumerate(submitted.plain)})
    for job in jobs:
        if job.array_job_id == submitted.batch and job.array_task_id is not None:
            symbols[job.job_id] = string.digits[job.array_task_id % 10]
    return symbols


def _span(ids: Sequence[int]) -> str:
    return f"{min(ids)}-{max(ids)}" if len(ids) > 1 else str(ids[0])


def timeline_lines(
    layout: Layout, submitted: Submitted, jobs: Sequence[JobRecord], leases: Sequence[Lease], columns: int = 56
) -> tuple[list[str], list[Check]]:
    """The chart, its legend, and the checks."""
    devices = node_devices(layout)
    symbols = symbols_for(submitted, jobs)
    mine = [lease for lease in leases if lease.job_id in symbols]
    starts = [j.start for j in jobs if j.start is not None] + [lease.start for lease in mine]
    ends = [j.end for j in jobs if j.end is not None] + [lease.end for lease in mine if lease.end is not None]
    if not starts or not ends:
        return ["no job of this run started"], check_run([], [], [], devices)
    t0 = min(starts)
    step = nice_step(max(ends) - t0, columns)
    lanes = build_lanes(jobs, mine, devices, symbols, step)
    columns = min(columns, int((max(ends) - t0) / step) + 2)
    lines = render(lanes, t0, step, columns)
    lines.append(
        f"A-{symbols[submitted.tpu[-1]]} classify_tpu jobs {_span(submitted.tpu)} (--gres=tpu:1), "
        f"a-{symbols[submitted.plain[-1]]} classify_cpu jobs {_span(submitted.plain)} (no GRES),"
    )
    lines.append(f"0-{submitted.array_tasks - 1} tasks of batch_array job {submitted.batch} (--gres=tpu:1 each)")
    lines.append(f"one column = {step:g} s. Device lanes: lease held, prolog to epilog (hooks' audit log);")
    lines.append("cpu lanes: jobs without a device, Slurm's start to end in whole seconds (jobcomp)")
    by_id = {j.job_id: j for j in jobs}
    tpu_jobs = [by_id[i] for i in submitted.tpu if i in by_id]
    tpu_jobs += [j for j in jobs if j.array_job_id == submitted.batch]
    plain_jobs = [by_id[i] for i in submitted.plain if i in by_id]
    return lines, check_run(tpu_jobs, plain_jobs, mine, devices)


def merge_batch(layout: Layout, submitted: Submitted) -> tuple[str, int, int]:
    """Merge the array tasks' result files; (merged file, lines, lines whose top-1 is the known answer)."""
    expected = {}
    with open(os.path.join(layout.images, "expected.csv"), encoding="utf-8") as handle:
        for line in handle:
            name, _, label = line.strip().partition(",")
            expected[name] = label
    records = []
    for path in sorted(glob.glob(os.path.join(layout.results, f"batch-{submitted.batch}_*.jsonl"))):
        with open(path, encoding="utf-8") as handle:
            records += [json.loads(line) for line in handle if line.strip()]
    records.sort(key=lambda r: r.get("input", ""))
    merged = os.path.join(layout.results, f"batch-{submitted.batch}.jsonl")
    with open(merged, "w", encoding="utf-8") as handle:
        handle.writelines(json.dumps(r) + "\n" for r in records)
    right = sum(
        1
        for r in records
        if r.get("classes") and r["classes"][0].get("label") == expected.get(os.path.basename(r.get("input", "")))
    )
    return merged, len(records), right


def batch_lines(layout: Layout, submitted: Submitted, jobs: Sequence[JobRecord], leases: Sequence[Lease]) -> list[str]:
    tasks = [j for j in jobs if j.array_job_id == submitted.batch]
    held = [lease for lease in leases if lease.job_id in {t.job_id for t in tasks} and lease.end is not None]
    merged, count, right = merge_batch(layout, submitted)
    rates = []
    for task in tasks:
        out = os.path.join(layout.out, f"batch-tpu-{submitted.batch}_{task.array_task_id}.out")
        try:
            with open(out, encoding="utf-8", errors="replace") as handle:
                found = _DONE.findall(handle.read())
        except OSError:
            found = []
        if found:
            rates.append(float(found[-1][2]))
    wall = (max(lease.end for lease in held) - min(lease.start for lease in held)) if held else 0.0  # type: ignore[type-var]
    devices = len({(lease.node, lease.identity) for lease in held})
    lines = [
        f"{count} images, {len(tasks)} array tasks on {devices} Edge TPUs: {wall:.1f} s from first lease to "
        f"last release,",
        f"  {count / wall if wall else 0:.0f} images/s including job start-up",
    ]
    if rates:
        lines[-1] += f"; inside the jobs {min(rates):.0f}-{max(rates):.0f} images/s per task (on the CPU)"
    lines.append(f"results: {merged}")
    lines.append(f"  {count} lines; top-1 is the generator's known answer for {right}/{count}")
    return lines


def next_steps(layout: Layout, user: str) -> list[str]:
    return [
        f"The cluster keeps running. Use it as any user (an unprivileged one: su - {user}):",
        f"  . {layout.env_file}; M=$SLURM_TPU_DEMO/models",
        "  sinfo -N -o '%N %t %G %f'; squeue",
        "  srun --gres=tpu:1 slurm-tpu infer $M/classifier.tflite $M/images/img_00004.png \\",
        "      --labels $M/classifier_labels.txt",
        "  cd ~ && sbatch $SLURM_TPU_JOBS/classify_tpu.sbatch $M/classifier.tflite $M/images/img_00001.png",
        f"Job scripts: {JOBS_DIR}/",
        f"Job output: {layout.out}/   Logs: {layout.path('log')}/",
        "Stop it: ./demo.sh stop   (re-running ./demo.sh reuses it)",
    ]


def detection_lines(layout: Layout, job: int) -> list[str]:
    """What the detection step found: per task, objects in how many scenes, and one picture."""
    records = []
    tasks = sorted(glob.glob(os.path.join(layout.results, f"step-{job}-*.jsonl")))
    for path in tasks:
        with open(path, encoding="utf-8") as handle:
            records += [json.loads(line) for line in handle if line.strip()]
    if not records:
        return [f"detection job {job} wrote no results (see {layout.out}/step-tpu-{job}.out)"]
    objects = sum(len(r.get("objects", [])) for r in records)
    drawn = sorted(r["annotated"] for r in records if r.get("objects") and r.get("annotated"))
    lines = [
        f"detection: job {job}, one srun step, {len(tasks)} tasks on {len(tasks)} nodes' Edge TPUs: "
        f"{objects} objects in {len(records)} scenes",
        f"  results: {layout.results}/step-{job}-<task>.jsonl",
    ]
    if drawn:
        lines.append(f"  annotated: {drawn[0]} (and {len(drawn) - 1} more)")
    return lines


def coral_lines(layout: Layout, holder: int, outputs: list[tuple[int, str]]) -> tuple[list[str], bool]:
    """The unmodified Coral code step, in one line: the TPU each job saw; ok when each saw exactly the
    card it was leased (the hooks' audit log), never the card the holder job kept busy."""
    with open(os.path.join(layout.node_dir(CORAL_NODE), "inventory.json"), encoding="utf-8") as handle:
        nodes = {a["identity"]: a["device_nodes"] for a in json.load(handle)["accelerators"]}
    with open(layout.audit_log(CORAL_NODE), encoding="utf-8") as handle:
        leases = parse_audit(handle.read(), CORAL_NODE)
    cards = {lease.job_id: nodes.get(lease.identity, [])[:1] for lease in leases}
    seen = [
        next(
            (line.split(": ", 1)[1] for line in output.splitlines() if line.startswith("Edge TPUs this job sees: ")),
            "nothing",
        )
        for _, output in outputs
    ]
    busy = cards.get(holder, [])
    ok = bool(busy) and all(
        "," not in s and s.startswith(("pci:", "usb:")) and [s.split(":", 1)[1]] == cards.get(job) != busy
        for (job, _), s in zip(outputs, seen)
    )
    shown = " | ".join(f"{s.split(':', 1)[0]} {os.path.basename(s)}" if ":" in s else s for s in seen)
    held = os.path.basename(busy[0]) if busy else "?"
    return [
        f"{'ok  ' if ok else 'FAIL'}  unmodified Coral code, no device argument: {len(outputs)} jobs on "
        f"{CORAL_NODE} saw {shown}",
        f"      each the card it was leased; {held} was another job's (job {holder})",
    ], ok


def container_lines(layout: Layout, run: Containerised) -> tuple[list[str], bool]:
    """The containerised step in two lines: what each container saw; ok when the two saw exactly the
    Edge TPUs the job was leased on the two nodes (their audit logs) and each classified its image."""
    from slurm_tpu.protocol.jobenv import libedgetpu_path

    if run.job is None:
        return [f"skip  containers (Pyxis + enroot): {run.skipped}"], True
    leased = []
    for node in CONTAINER_NODES:
        with open(os.path.join(layout.node_dir(node), "inventory.json"), encoding="utf-8") as handle:
            nodes = {a["identity"]: a["device_nodes"] for a in json.load(handle)["accelerators"]}
        with open(layout.audit_log(node), encoding="utf-8") as handle:
            for lease in parse_audit(handle.read(), node):
                if lease.job_id == run.job:
                    kind, path = libedgetpu_path(lease.identity, (nodes.get(lease.identity) or [None])[0])
                    leased.append(f"{kind}:{path}")
    seen = [
        line.split("Edge TPUs this job sees: ", 1)[1]
        for line in run.output.splitlines()
        if "Edge TPUs this job sees: " in line
    ]
    answers = [line for line in run.output.splitlines() if re.match(r"^\d+: \S+: [0-9.]+$", line)]
    ok = len(leased) == len(CONTAINER_NODES) and sorted(seen) == sorted(leased) and len(answers) == len(CONTAINER_NODES)
    shown = " | ".join(f"{s.split(':', 1)[0]} {os.path.basename(s)}" for s in seen) or "nothing"
    return [
        f"{'ok  ' if ok else 'FAIL'}  containers (Pyxis + enroot): job {run.job}, one per node on "
        + " and ".join(CONTAINER_NODES),
        f"      each saw its node's leased Edge TPU only ({shown}), through the enroot hook",
    ], ok


def serve_lines(served: Served) -> list[str]:
    """The serving step: where the server ran, what the client on another node got, how it stopped."""
    lines = [
        f"serve: job {served.job} holds the classifier on {SERVE_NODE}'s Edge TPU (jobs/serve.sbatch);",
        f"  from {CLIENT_NODE}: slurm-tpu infer --server {served.job} classifier <{SERVE_IMAGES} images>",
    ]
    for line in served.client_output.splitlines():
        record = json.loads(line)
        best = record.get("classes", [{}])[0]
        lines.append(
            f"    {os.path.basename(record['input'])}: {best.get('label', record.get('error'))} {best.get('score', '')}"
        )
    stopped = [line for line in served.log.splitlines() if "devices released" in line]
    lines.append("  scancel: " + (stopped[-1].split(": ", 1)[-1] if stopped else "no clean stop in the job's log"))
    return lines


def _max_overlap(records: Sequence[JobRecord]) -> tuple[int, list[int]]:
    """The most jobs running at one moment by Slurm's records, and which. The records hold whole
    seconds: two jobs overlap when each started no later than the other ended, so a job that started
    and ended within one second (a rerun's warm shard job) still counts as running in that second."""
    best: list[int] = []
    for record in records:
        if record.start is None or record.end is None:
            continue
        at = record.start  # every overlap peaks at some job's start
        running = [r.job_id for r in records if r.start is not None and r.end is not None and r.start <= at <= r.end]
        if len(running) > len(best):
            best = running
    return len(best), sorted(best)


def shard_lines(
    layout: Layout, run: SharedRun, records: Sequence[JobRecord], figures: dict[int, dict[str, float]]
) -> tuple[list[str], bool]:
    """The shard step: who ran, how many at once (Slurm's records), each job's results and its device
    time on the one TPU (the broker's figures, from the job's AdminComment)."""
    users = list(dict.fromkeys(user for _, user in run.jobs))
    mine = [r for r in records if r.job_id in {job for job, _ in run.jobs}]
    peak, together = _max_overlap(mine)
    expected = {}
    with open(os.path.join(layout.images, "expected.csv"), encoding="utf-8") as handle:
        for line in handle:
            name, _, label = line.strip().partition(",")
            expected[name] = label
    images = sorted(n for n in os.listdir(run.images) if n.endswith(".png"))
    lines = [
        f"shards: {len(run.jobs)} x classify_shard.sbatch (--gres=tpu_shard:1) of {' and '.join(users)},",
        f"  on {SHARD_NODE}'s one Edge TPU ({SHARES} shares): its TPU broker runs every job's inferences",
    ]
    completed = all(r.state == "COMPLETED" and r.node == SHARD_NODE for r in mine) and len(mine) == len(run.jobs)
    lines.append(
        f"  {'ok  ' if peak >= 2 else 'FAIL'}  up to {peak} ran at once on the one TPU (Slurm's records): "
        f"jobs {', '.join(map(str, together))}"
    )
    correct = []
    for job, _ in run.jobs:
        try:
            with open(os.path.join(layout.results, f"shard-{job}.csv"), encoding="utf-8") as handle:
                rows = [line.split(",") for line in handle.read().splitlines()[1:]]
        except FileNotFoundError:
            rows = []
        correct.append(
            sorted(os.path.basename(r[0]) for r in rows) == images
            and all(r[1] == expected.get(os.path.basename(r[0])) for r in rows)
        )
    lines.append(
        f"  {'ok  ' if completed and all(correct) else 'FAIL'}  each job classified the {len(images)} images "
        "as expected (results/shard-<job>.csv)"
    )
    lines.append("  job        user         on TPU  inferences  queue wait  swaps  (the broker's, in AdminComment)")
    for job, user in run.jobs:
        f = figures.get(job, {})
        busy, waited = f.get("shard_busy_ms"), f.get("shard_queue_wait_ms")
        lines.append(
            f"  {job:<10} {user:<11} "
            + (
                f"{busy:6.1f} ms  {int(f.get('shard_inferences', 0)):>10}  {waited:7.1f} ms  "
                f"{int(f.get('shard_model_swaps', 0)):>5}"
                if busy is not None and waited is not None
                else "(no figures)"
            )
        )
    figured = len(figures) == len(run.jobs) and all(f.get("shard_busy_ms", 0) > 0 for f in figures.values())
    return lines, completed and all(correct) and peak >= 2 and figured


def coral_shard_lines(layout: Layout, outputs: list[tuple[int, str, str]] | None) -> tuple[list[str], bool]:
    """Coral's example, unmodified, on shares: each job's answer, right when it is the image's known class."""
    if outputs is None:
        return [
            "skipped: unmodified Coral code on a share needs the real libedgetpu (scripts/setup.sh builds it)"
        ], True
    answers, ok = [], bool(outputs)
    with open(os.path.join(layout.images, "expected.csv"), encoding="utf-8") as handle:
        expected = dict(line.strip().partition(",")[::2] for line in handle)
    for i, (job, user, output) in enumerate(outputs):
        lines = output.strip().splitlines()
        answer = lines[-1] if lines else "(no output)"
        ok = ok and answer.split(":")[0] == expected.get(f"img_{i:05d}.png") and "broker:" in output
        answers.append(f"      {user} job {job}: {answer[:60]}")
    return [
        f"{'ok  ' if ok else 'FAIL'}  unmodified Coral code on a share (coral_example.sbatch --gres=tpu_shard:1):",
        "      the node's real libedgetpu forwarded each job's Edge TPU op to the broker",
        *answers,
    ], ok
