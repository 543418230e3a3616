"""Coral's own example, unmodified (jobs/coral_example.sbatch), as shard jobs of real Slurm: two users'
``sbatch --gres=tpu_shard:1`` on a node whose one Edge TPU is shared (4 shares), with a compiled model
(an ``edgetpu-custom-op``). Each job's code loads the node's REAL libedgetpu (our patches) with no
option; the Prolog put ``broker:<endpoint>`` in its EDGETPU_VISIBLE_DEVICES; the library forwarded the
op to the node's broker, which ran it. The broker runs in twin mode (SLURM_TPU_BROKER_TWIN=1): the
executable is the CPU model's own bytes (harness/modelgen/twin.py), run through real TFLite with the
device's delegate (the libedgetpu double) created on the device's node. The answer must be the CPU
model's; without the forwarding the op could not run in the job at all."""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest
from broker_support import temp_base

from harness.localcluster import NodeSpec
from harness.modelgen import write_models
from helpers import TESTS, USERS, real_libedgetpu, wait_until

pytestmark = pytest.mark.slurm

REPO = TESTS.parent
STICK = "usb-2-1.3"
STICK_PATH = "/sys/bus/usb/devices/2-1.3"


@pytest.fixture(scope="module")
def cluster(cluster_factory, users):
    from edgetpu_double.build import build_double
    from harness.localcluster.cluster import project_hooks

    library = real_libedgetpu()
    base = temp_base()
    double = build_double(base)
    started = cluster_factory(
        [NodeSpec("n4", str(TESTS / "isolation" / "hardware" / "n4_one_tpu.umockdev"), cpus=4)],
        hooks=project_hooks(),
        node_config_extra={"version": 2, "families": {"edgetpu": {"shared": [STICK], "shares_per_device": 4}}},
        broker_env={
            "SLURM_TPU_BROKER_TWIN": "1",
            "SLURM_TPU_LIBEDGETPU": str(double),
            "EDGETPU_DOUBLE_DEVICES": f"usb:{STICK_PATH}",
        },
    )
    out = os.path.join(started.base, "out")
    os.makedirs(out, exist_ok=True)
    os.chmod(out, 0o1777)
    models = write_models(os.path.join(started.base, "models"), image_count=2)
    os.chmod(os.path.join(started.base, "models"), 0o755)
    return started, models, library


def cpu_answer(model, image, labels) -> str:
    """What jobs/coral_example.sbatch prints last, computed here from the CPU model, no delegate."""
    from ai_edge_litert.interpreter import Interpreter
    from PIL import Image

    interpreter = Interpreter(model_path=str(model))
    interpreter.allocate_tensors()
    details = interpreter.get_input_details()[0]
    _, height, width, _ = details["shape"]
    pixels = np.asarray(Image.open(image).convert("RGB").resize((width, height)), dtype=details["dtype"])
    interpreter.set_tensor(details["index"], pixels[np.newaxis])
    interpreter.invoke()
    output = interpreter.get_output_details()[0]
    scores = interpreter.get_tensor(output["index"])[0]
    scale, zero = output["quantization"]
    top = int(np.argmax(scores))
    return f"{labels[top]}: {(float(scores[top]) - zero) * scale:.5f}"


def test_coral_example_on_a_shard_gives_the_cpu_models_answers(cluster):
    started, models, library = cluster
    images = sorted(p for p in models["images"].iterdir() if p.suffix == ".png")
    labels = models["classifier_labels"].read_text().splitlines()
    exports = ",".join(
        [
            f"PATH={os.path.dirname(sys.executable)}:/usr/bin:/bin",
            f"LD_LIBRARY_PATH={os.path.dirname(library)}",  # the node's libedgetpu, as `install --libedgetpu` puts it
            "HOME=/tmp",
        ]
    )
    out = os.path.join(started.base, "out")
    jobs = {}
    for user, image in zip(USERS, images):
        argv = [
            "sbatch", "--parsable", "--chdir=/tmp", "-w", "n4", "--gres=tpu_shard:1", f"--export={exports}",
            "-o", f"{out}/coral-%j.out", str(REPO / "jobs" / "coral_example.sbatch"),
            str(models["classifier_twin_edgetpu"]), str(image), str(models["classifier_labels"]),
        ]  # fmt: skip
        jobs[int(started.command(argv, user=user).stdout.strip().split(";")[0])] = image
    states = started.wait_for_jobs(list(jobs), timeout=180)
    outputs = {job: open(f"{out}/coral-{job}.out", encoding="utf-8").read() for job in jobs}
    assert set(states.values()) == {"COMPLETED"}, (states, outputs)
    state = started.state_dir("n4")
    for job, image in jobs.items():
        lines = outputs[job].splitlines()
        endpoint = f"{state}/broker/jobs/{job}.sock"
        assert lines[0] == f"job {job} on n4: EDGETPU_VISIBLE_DEVICES=broker:{endpoint}"
        assert f"Edge TPUs this job sees: usb:broker:{endpoint}" in lines
        assert lines[-1] == cpu_answer(models["classifier"], image, labels)
    # Each job's one invoke ran on the shared device, through the broker.
    from slurm_tpu.hooks.shards import ask

    devices = ask(state, {"op": "stats"}, timeout=30)["devices"]
    assert devices[STICK]["inferences"] == len(jobs)
    # The broker ran the op in twin mode, and said so once in its log.
    log = started.path("log", "broker-n4.out")
    wait_until(lambda: os.path.exists(log), 10, "the broker's log")
    with open(log, encoding="utf-8") as handle:
        assert "twin mode (tests)" in handle.read()
