"""Where the demo keeps everything, and what its cluster looks like."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HARDWARE_DIR = REPO / "demo" / "hardware"
JOBS_DIR = REPO / "jobs"
DOUBLE_SOURCE = REPO / "tests" / "edgetpu_double" / "edgetpu_double.c"

DEFAULT_BASE = "/tmp/slurm-tpu-demo"
DEFAULT_USER = "tpudemo"


def second_user(user: str) -> str:
    """The other user whose shard jobs share node-shard's TPU with ``user``'s."""
    return f"{user}2"


MARKER = ".slurm-tpu-demo"  # in the base directory: "this directory is the demo's"


@dataclass(frozen=True)
class DemoNode:
    """One compute node of the demo cluster (a Raspberry Pi-sized machine)."""

    name: str
    hardware: str  # file name under demo/hardware/
    summary: str  # what it has, for the printout
    cpus: int = 4
    real_memory_mb: int = 1000

    @property
    def hardware_path(self) -> str:
        return str(HARDWARE_DIR / self.hardware)


NODES: tuple[DemoNode, ...] = (
    DemoNode("node-usb", "node-usb.umockdev", "1 Coral USB Accelerator, on USB 2 like the seeds' Pi"),
    DemoNode("node-pcie", "node-pcie.umockdev", "2 Coral PCIe Accelerators"),
    DemoNode("node-gpu", "node-gpu.umockdev", "1 NVIDIA Tesla T4"),
    DemoNode("node-plain", "node-plain.umockdev", "no accelerator (a USB mouse: detect ignores it)"),
    DemoNode("node-shard", "node-shard.umockdev", "1 Coral USB Accelerator shared by up to 4 jobs (tpu_shard)"),
)

# node-shard's one Edge TPU is shared (families.edgetpu.shared): Slurm counts SHARES tpu_shard on
# that node, and its TPU broker runs every shard job's inferences on the stick.
SHARD_NODE = "node-shard"
SHARED_STICK = "usb-1-1.2"
SHARES = 4

# LLN: the least-loaded node first, so plain jobs spread over the cluster as on the
# seeds' Pis instead of packing the first nodes' CPUs.
PARTITION_EXTRA = ("LLN=YES",)


@dataclass(frozen=True)
class Layout:
    """Paths under the demo's base directory."""

    base: str

    def path(self, *parts: str) -> str:
        return os.path.join(self.base, *parts)

    @property
    def marker(self) -> str:
        return self.path(MARKER)

    @property
    def models(self) -> str:
        return self.path("models")

    @property
    def images(self) -> str:
        """Generated test images (``expected.csv`` holds each one's known class)."""
        return os.path.join(self.models, "images")

    @property
    def out(self) -> str:
        """Job output files (the demo's jobs run with this as their working directory)."""
        return self.path("out")

    @property
    def results(self) -> str:
        return self.path("results")

    @property
    def bin(self) -> str:
        """The job-side ``slurm-tpu`` (on PATH in env.sh)."""
        return self.path("bin")

    @property
    def libedgetpu(self) -> str:
        return self.path("lib", "libedgetpu.so.1")

    @property
    def env_file(self) -> str:
        return self.path("env.sh")

    @property
    def runs(self) -> str:
        """One JSON file per demo run: the job ids it submitted."""
        return self.path("runs")

    @property
    def jobcomp(self) -> str:
        return self.path("log", "jobcomp.txt")

    def node_dir(self, node: str) -> str:
        return self.path("nodes", node)

    def audit_log(self, node: str) -> str:
        return os.path.join(self.node_dir(node), "state", "audit.log")

    @property
    def classifier(self) -> str:
        return os.path.join(self.models, "classifier.tflite")

    @property
    def labels(self) -> str:
        return os.path.join(self.models, "classifier_labels.txt")

    @property
    def slurm_conf(self) -> str:
        return self.path("etc", "slurm.conf")
