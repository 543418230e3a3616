"""The seeds' experiment and a batch job, submitted with the scripts in jobs/.

As on the seeds' Raspberry Pi cluster: inference jobs that need a TPU and plain jobs
that do not, all submitted at once by an ordinary user; plus an array job that
classifies a few hundred images over the cluster's TPUs.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass

from slurm_tpu.slurm import installation

from .errors import DemoError
from .layout import JOBS_DIR, Layout
from .records import parse_jobcomp, select

TPU_JOBS = 5  # the seeds ran five
PLAIN_JOBS = 8
PLAIN_CPUS = 2  # CPU inference with two threads: eight such jobs need every node, as on the seeds' Pis
ARRAY_TASKS = 4


@dataclass(frozen=True)
class Submitted:
    """Job ids of one demo run, by kind (the array job's id for the batch)."""

    tpu: list[int]
    plain: list[int]
    batch: int
    array_tasks: int
    images: int
    user: str
    submitted_at: float

    @property
    def all_ids(self) -> list[int]:
        return [*self.tpu, *self.plain, self.batch]

    @property
    def expected_records(self) -> int:
        return len(self.tpu) + len(self.plain) + self.array_tasks


def sbatch(
    layout: Layout,
    user: str,
    env: Mapping[str, str],
    args: Sequence[str],
    script: str | None,
    script_args: Sequence[str],
) -> int:
    """Submit ``jobs/<script>`` (None: ``args`` has ``--wrap``) as ``user`` with exactly ``env``; the job id."""
    argv = [
        "runuser",
        "-u",
        user,
        "--",
        "env",
        "-i",
        *(f"{k}={v}" for k, v in env.items()),
        installation.find(use_daemons=False).program("sbatch"),
        "--parsable",
        f"--chdir={layout.out}",
        *args,
        *([str(JOBS_DIR / script), *script_args] if script else []),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, cwd="/")
    if done.returncode != 0:
        raise DemoError(f"sbatch jobs/{script or '--wrap'} failed: {done.stderr.strip() or done.stdout.strip()}")
    return int(done.stdout.strip().split(";")[0])


def submit_experiment(layout: Layout, user: str, env: Mapping[str, str], images: int) -> Submitted:
    """Submit the TPU jobs, the plain jobs and the batch array, in that order."""

    def image(i: int) -> str:
        return os.path.join(layout.images, f"img_{i % images:05d}.png")

    started = time.time()
    tpu = [
        sbatch(layout, user, env, [], "classify_tpu.sbatch", [layout.classifier, image(i), layout.labels])
        for i in range(TPU_JOBS)
    ]
    plain = [
        sbatch(
            layout,
            user,
            env,
            [f"--cpus-per-task={PLAIN_CPUS}"],
            "classify_cpu.sbatch",
            [layout.classifier, image(TPU_JOBS + i), layout.labels],
        )
        for i in range(PLAIN_JOBS)
    ]
    batch = sbatch(
        layout,
        user,
        env,
        [f"--array=0-{ARRAY_TASKS - 1}"],
        "batch_array.sbatch",
        [layout.classifier, layout.images, layout.results, layout.labels],
    )
    submitted = Submitted(tpu, plain, batch, ARRAY_TASKS, images, user, started)
    os.makedirs(layout.runs, exist_ok=True)
    with open(os.path.join(layout.runs, "last.json"), "w", encoding="utf-8") as handle:
        json.dump(asdict(submitted), handle)
    return submitted


def _queued(env: Mapping[str, str]) -> dict[int, str]:
    """Queued or running jobs (array tasks under their array job's id) -> squeue's reason."""
    done = subprocess.run(
        [installation.find(use_daemons=False).program("squeue"), "-h", "-o", "%F|%r"],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=30,
    )
    if done.returncode != 0:
        raise DemoError(f"squeue failed: {done.stderr.strip()}")
    queued = {}
    for line in done.stdout.splitlines():
        job, _, reason = line.partition("|")
        if job.isdigit():
            queued[int(job)] = reason
    return queued


def wait_for(layout: Layout, env: Mapping[str, str], submitted: Submitted, timeout: float = 300) -> float:
    """Wait until every job has left the queue and is in jobcomp; the seconds it took."""
    deadline = time.monotonic() + timeout
    while True:
        mine = {job: reason for job, reason in _queued(env).items() if job in submitted.all_ids}
        if not mine:
            break
        held = {job: reason for job, reason in mine.items() if "held" in reason.lower()}
        if held:  # a failed Prolog requeues and holds the job: waiting would not help
            job, reason = next(iter(held.items()))
            raise DemoError(
                f"job {job} is held ({reason}): a hook failed; see {layout.path('log')}/slurmd-*.log "
                "and `scontrol show node` for the drain reason"
            )
        if time.monotonic() > deadline:
            raise DemoError(f"jobs still queued after {timeout:g} s: see squeue (. {layout.env_file}; squeue)")
        time.sleep(0.5)
    while True:
        try:
            with open(layout.jobcomp, encoding="utf-8") as handle:
                found = select(parse_jobcomp(handle.read()), submitted.all_ids)
        except FileNotFoundError:
            found = []
        if len(found) >= submitted.expected_records:
            return time.time() - submitted.submitted_at
        if time.monotonic() > deadline:
            raise DemoError(f"only {len(found)} of {submitted.expected_records} jobs are in {layout.jobcomp}")
        time.sleep(0.3)


DETECT_NODES = 2  # one step, one task per node, each on its node's Edge TPU


def submit_detection(layout: Layout, user: str, env: Mapping[str, str]) -> int:
    """After the experiment: one detection step over two nodes (jobs/step_across_nodes.sbatch),
    on the generated scenes, drawing its boxes into ``results/annotated``."""
    models = layout.models
    return sbatch(
        layout,
        user,
        env,
        [f"--nodes={DETECT_NODES}"],
        "step_across_nodes.sbatch",
        [
            os.path.join(models, "detector.tflite"),
            os.path.join(models, "scenes"),
            layout.results,
            os.path.join(models, "detector_labels.txt"),
            "--annotate",
            annotated_dir(layout),
        ],
    )


def annotated_dir(layout: Layout) -> str:
    return os.path.join(layout.results, "annotated")


def wait_for_job(env: Mapping[str, str], job: int, timeout: float = 120) -> None:
    """Wait until ``job`` has left the queue (held: a hook failed, say so at once)."""
    deadline = time.monotonic() + timeout
    while True:
        reason = _queued(env).get(job)
        if reason is None:
            return
        if "held" in reason.lower():
            raise DemoError(f"job {job} is held ({reason}): a hook failed; see the slurmd logs")
        if time.monotonic() > deadline:
            raise DemoError(f"job {job} still queued after {timeout:g} s: see squeue")
        time.sleep(0.5)


CORAL_NODE = "node-pcie"  # two Edge TPUs: one kept busy, the example must get (and see) the other
CORAL_JOBS = 2
CORAL_HOLDER = "coral-holder"


def run_coral_examples(
    layout: Layout, user: str, env: Mapping[str, str], timeout: float = 120
) -> tuple[int, list[tuple[int, str]]]:
    """Coral's own example code, no device argument (jobs/coral_example.sbatch), twice on ``CORAL_NODE``
    while a holder job keeps one of its two cards: (the holder's job id, [(job, its output)]).

    With the holder running, Slurm can give the examples only the other card, whether they
    run at once or one after the other: a library that opened the node's first card (or the
    busy one) instead of the job's own would show here every time, not only when the two
    examples happen to overlap.
    """
    started = os.path.join(layout.out, f"{CORAL_HOLDER}-{os.getpid()}.started")
    marker = os.path.join(layout.out, f"{CORAL_HOLDER}-{os.getpid()}.done")
    holder = sbatch(
        layout,
        user,
        env,
        [
            f"--nodelist={CORAL_NODE}",
            "--gres=tpu:1",
            f"--job-name={CORAL_HOLDER}",
            "--output=/dev/null",
            f"--wrap=touch {started}; while [ ! -e {marker} ]; do sleep 0.2; done",
        ],
        None,
        [],
    )
    try:
        deadline = time.monotonic() + timeout
        while not os.path.exists(started):  # its prolog has leased it a card
            if holder not in _queued(env) or time.monotonic() > deadline:
                raise DemoError(f"job {holder} (holding one of {CORAL_NODE}'s cards) did not start: see squeue")
            time.sleep(0.2)
        jobs = [
            sbatch(
                layout,
                user,
                env,
                [f"--nodelist={CORAL_NODE}"],
                "coral_example.sbatch",
                [layout.classifier, os.path.join(layout.images, f"img_{i:05d}.png"), layout.labels],
            )
            for i in range(CORAL_JOBS)
        ]
        outputs = []
        for job in jobs:
            wait_for_job(env, job, timeout)
            with open(os.path.join(layout.out, f"classify-coral-{job}.out"), encoding="utf-8") as handle:
                outputs.append((job, handle.read()))
    finally:
        with open(marker, "w", encoding="utf-8"):
            pass
        wait_for_job(env, holder, timeout)
        for path in (marker, started):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    return holder, outputs


CONTAINER_NODES = ("node-usb", "node-pcie")  # one task and one Edge TPU each, each in its own container


@dataclass(frozen=True)
class Containerised:
    """The containerised step: its job and output, or why it did not run (no Pyxis, no image)."""

    job: int | None
    output: str
    skipped: str | None = None


def run_containers(layout: Layout, user: str, env: Mapping[str, str], timeout: float = 180) -> Containerised:
    """The multi-worker seed: one step over two nodes, each task in a Pyxis container of the suite's
    offline image (jobs/containers_across_nodes.sbatch) running Coral's example unmodified on its
    node's Edge TPU, which the enroot hook gave it (the device node and the node's libedgetpu)."""
    from ..localcluster.containers import DOUBLE_ROOT, enroot_image
    from .lifecycle import containers_missing

    why = containers_missing()
    if why:
        return Containerised(None, "", why)
    try:
        image = enroot_image()
    except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
        return Containerised(None, "", f"no container image ({exc})")
    job = sbatch(
        layout,
        user,
        {**env, "EDGETPU_DOUBLE_ROOT": DOUBLE_ROOT},  # the double's view of each node, inside the container
        [f"--nodelist={','.join(CONTAINER_NODES)}", f"--nodes={len(CONTAINER_NODES)}"],
        "containers_across_nodes.sbatch",
        [
            image,
            "python3",
            "/opt/coral/classify.py",
            layout.classifier,
            os.path.join(layout.images, "img_00000.png"),
            layout.labels,
        ],
    )
    wait_for_job(env, job, timeout)
    with open(os.path.join(layout.out, f"containers-tpu-{job}.out"), encoding="utf-8") as handle:
        return Containerised(job, handle.read())


SERVE_NODE, CLIENT_NODE = "node-usb", "node-plain"  # the server on a TPU node, its client elsewhere
SERVE_IMAGES = 3


@dataclass(frozen=True)
class Served:
    """The serving step: the server's job, what the client on another node printed, the server's log."""

    job: int
    client_output: str
    log: str


def serve_and_query(layout: Layout, user: str, env: Mapping[str, str], timeout: float = 120) -> Served:
    """Serve the classifier from ``SERVE_NODE``'s Edge TPU (jobs/serve.sbatch), send it a few
    images with ``slurm-tpu infer --server`` from a step on ``CLIENT_NODE``, then scancel it."""
    job = sbatch(layout, user, env, [f"--nodelist={SERVE_NODE}"], "serve.sbatch", [layout.classifier, layout.labels])
    log = os.path.join(layout.out, f"serve-tpu-{job}.out")
    address = os.path.join(env["HOME"], ".slurm-tpu", "serve", f"{job}.json")
    deadline = time.monotonic() + timeout
    while not os.path.exists(address):  # written once the server listens
        if job not in _queued(env) or time.monotonic() > deadline:
            raise DemoError(f"the serve job {job} did not publish its address: see {log}")
        time.sleep(0.3)
    images = [os.path.join(layout.images, f"img_{i:05d}.png") for i in range(SERVE_IMAGES)]
    slurm = installation.find(use_daemons=False)
    srun = slurm.program("srun")
    argv = [
        "runuser",
        "-u",
        user,
        "--",
        "env",
        "-i",
        *(f"{k}={v}" for k, v in env.items()),
        srun,
        f"--nodelist={CLIENT_NODE}",
        "--job-name=serve-client",
        f"--chdir={layout.out}",
        "slurm-tpu",
        "infer",
        "--server",
        str(job),
        "classifier",
        *images,
        "--no-progress",
    ]
    try:
        client = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd="/")
    finally:
        subprocess.run(
            [
                "runuser",
                "-u",
                user,
                "--",
                "env",
                "-i",
                *(f"{k}={v}" for k, v in env.items()),
                slurm.program("scancel"),
                str(job),
            ],
            capture_output=True,
            timeout=60,
        )
    if client.returncode != 0:
        raise DemoError(f"infer --server {job} from {CLIENT_NODE} failed: {client.stderr.strip()}")
    wait_for_job(env, job, timeout)
    with open(log, encoding="utf-8") as handle:
        return Served(job, client.stdout, handle.read())


SHARD_JOBS = 6  # three per user, on node-shard's one Edge TPU of SHARES shares: four at once, two wait
SHARD_IMAGES = 60  # each job classifies the same images, so their results can be compared


def shard_images(layout: Layout) -> str:
    """A directory with the first SHARD_IMAGES test images (hard links), for the shard jobs."""
    directory = os.path.join(layout.models, "shard-images")
    if not os.path.isdir(directory):
        os.makedirs(directory + ".new", exist_ok=True)
        for name in sorted(n for n in os.listdir(layout.images) if n.endswith(".png"))[:SHARD_IMAGES]:
            target = os.path.join(directory + ".new", name)
            if not os.path.exists(target):
                os.link(os.path.join(layout.images, name), target)
        os.chmod(directory + ".new", 0o755)
        os.rename(directory + ".new", directory)
    return directory


@dataclass(frozen=True)
class SharedRun:
    """The shard step: each job's id and user, in submission order."""

    jobs: list[tuple[int, str]]
    images: str


def run_shards(
    layout: Layout, users: Sequence[str], envs: Mapping[str, Mapping[str, str]], timeout: float = 300
) -> SharedRun:
    """SHARD_JOBS x jobs/classify_shard.sbatch (--gres=tpu_shard:1), the users taking turns, submitted
    held and released together: Slurm starts as many as node-shard has shares in one pass, and
    the rest as shares come free."""
    images = shard_images(layout)
    jobs = []
    for i in range(SHARD_JOBS):
        user = users[i % len(users)]
        job = sbatch(
            layout,
            user,
            envs[user],
            ["--hold"],
            "classify_shard.sbatch",
            [layout.classifier, images, layout.results, layout.labels],
        )
        jobs.append((job, user))
    env = envs[users[0]]
    release = [installation.find(use_daemons=False).program("scontrol"), "release", ",".join(str(j) for j, _ in jobs)]
    done = subprocess.run(  # as root (the demo's own user): the jobs are two users'
        release, env=dict(os.environ, SLURM_CONF=env["SLURM_CONF"]), capture_output=True, text=True, timeout=60
    )
    if done.returncode != 0:
        raise DemoError(f"scontrol release of the shard jobs failed: {done.stderr.strip()}")
    for job, _ in jobs:
        wait_for_job(env, job, timeout)
    return SharedRun(jobs, images)


def run_coral_shards(
    layout: Layout, envs: Mapping[str, Mapping[str, str]], library: str, timeout: float = 120
) -> list[tuple[int, str, str]]:
    """jobs/coral_example.sbatch, unmodified, as one shard job (--gres=tpu_shard:1) per user, with the
    node's real libedgetpu (``library``) and a compiled model: the library forwards the model's
    Edge TPU op to node-shard's broker. [(job, user, its output)]."""
    model = os.path.join(layout.models, "classifier_twin_edgetpu.tflite")
    jobs = []
    for i, (user, env) in enumerate(envs.items()):
        real = {**env, "LD_LIBRARY_PATH": os.path.dirname(library)}
        image = os.path.join(layout.images, f"img_{i:05d}.png")
        job = sbatch(layout, user, real, ["--gres=tpu_shard:1"], "coral_example.sbatch", [model, image, layout.labels])
        jobs.append((job, user))
    outputs = []
    for job, user in jobs:
        wait_for_job(envs[user], job, timeout)
        with open(os.path.join(layout.out, f"classify-coral-{job}.out"), encoding="utf-8") as handle:
            outputs.append((job, user, handle.read()))
    return outputs
