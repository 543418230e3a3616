#!/usr/bin/env python3
"""Container start overhead of slurm-tpu's enroot hook (enroot/98-slurm-tpu.sh); prints JSON.

Two enroot configurations of the same node, made as the test clusters make them
(harness/localcluster/containers.py: enroot's own hooks, restricted /dev, the same mounts), one
with the hook and one without; the same container (the suite's offline image,
tests/containers/pyxis_support.image) is started with ``enroot start NAME true`` as a real
unprivileged user, alternating the two, ``--rounds`` times each. The hook's job is a USB stick
(a job env file as the Prolog writes it): it binds the node's /dev/bus/usb and libedgetpu (the
double) and writes the variables. Wall time of each ``enroot start`` (enroot's own bash start,
its hooks, the mounts and the switch into the container); medians and the difference, in ms;
and the hook alone (its file run as enroot runs it, through runuser: an upper bound), median ms.
Needs root (users, mknod), enroot (scripts/build-containers.sh) and the image.

    .venv/bin/python bench/bench_enroot_hook.py [--rounds 15]
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
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests"), str(REPO / "tests" / "containers")]

USER = "stpu_alice"
JOB_ENV = (
    "export SLURM_TPU_DEVICES=usb-2-1.3\n"
    "export SLURM_TPU_EDGETPU_PATHS=usb:/sys/bus/usb/devices/2-1.3\n"
    "export EDGETPU_VISIBLE_DEVICES=/sys/bus/usb/devices/2-1.3\n"
    "unset SLURM_TPU_USAGE_DIR\n"
)


def node(base: str, name: str, library: str, with_hook: bool) -> str:
    """A node's enroot (its wrapper's path), with or without slurm-tpu's hook."""
    from harness.localcluster import containers
    from slurm_tpu.hooks.enroot import HOOK_NAME

    node_dir = os.path.join(base, "nodes", name)
    state = os.path.join(node_dir, "state")
    os.makedirs(os.path.join(state, "jobs"), mode=0o755)
    for directory in (node_dir, state, os.path.join(state, "jobs")):
        os.chmod(directory, 0o755)
    with open(os.path.join(state, "jobs", "1.env"), "w", encoding="utf-8") as handle:
        handle.write(JOB_ENV)
    os.makedirs(os.path.join(node_dir, "dev", "bus", "usb", "002"))
    os.mknod(os.path.join(node_dir, "dev", "bus", "usb", "002", "005"), 0o600 | 0o020000, os.makedev(240, 0))
    config = os.path.join(node_dir, "config.yaml")
    with open(config, "w", encoding="utf-8") as handle:
        handle.write(f"state_dir: {state}\n")
    bin_dir = containers.configure_node(base, name, node_dir, config, library, sys.executable, None)
    if not with_hook:
        os.unlink(os.path.join(node_dir, "enroot", "etc", "hooks.d", HOOK_NAME))
    return os.path.join(bin_dir, "enroot")


def as_user(argv: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["runuser", "-u", USER, "--", "env", "-i", "PATH=/usr/bin:/bin", "SLURM_JOB_ID=1", "HOME=/tmp", *argv],
        capture_output=True,
        text=True,
        cwd="/",
        check=False,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    from pyxis_support import image

    from edgetpu_double.build import build_double
    from harness.localcluster.users import real_users

    squashfs = image()
    base = tempfile.mkdtemp(prefix="slurm-tpu-bench-enroot-", dir="/tmp")
    os.chmod(base, 0o755)
    try:
        os.makedirs(os.path.join(base, "lib"))
        library = str(build_double(Path(base, "lib")))
        with real_users((USER,)):
            arms = {"without_hook": node(base, "n0", library, False), "with_hook": node(base, "n1", library, True)}
            for wrapper in arms.values():
                done = as_user([wrapper, "create", "-n", "bench", squashfs])
                if done.returncode:
                    raise SystemExit(f"enroot create failed: {done.stderr.strip()[-500:]}")
            times: dict[str, list[float]] = {arm: [] for arm in arms}
            for _ in range(args.rounds):
                for arm, wrapper in arms.items():
                    started = time.perf_counter()
                    done = as_user([wrapper, "start", "bench", "true"])
                    elapsed = time.perf_counter() - started
                    if done.returncode:
                        raise SystemExit(f"enroot start ({arm}) failed: {done.stderr.strip()[-500:]}")
                    times[arm].append(elapsed * 1000)
            # The hook alone as enroot runs it (its file, the user, the job's env): interpreter start + work.
            hook = os.path.join(base, "nodes", "n1", "enroot", "etc", "hooks.d", "98-slurm-tpu.sh")
            alone = []
            for _ in range(args.rounds):
                scratch = tempfile.mkdtemp(dir=base)
                os.chmod(scratch, 0o777)
                for name in ("mounts", "environ"):
                    Path(scratch, name).write_text("")
                    os.chmod(os.path.join(scratch, name), 0o666)
                started = time.perf_counter()
                done = as_user(["env", f"ENROOT_MOUNTS={scratch}/mounts", f"ENROOT_ENVIRON={scratch}/environ", hook])
                alone.append((time.perf_counter() - started) * 1000)
                if done.returncode:
                    raise SystemExit(f"the hook failed: {done.stderr.strip()}")
            check = as_user(
                [arms["with_hook"], "start", "bench", "sh", "-c", "ls /dev/bus/usb/002; echo $EDGETPU_VISIBLE_DEVICES"]
            )
    finally:
        shutil.rmtree(base, ignore_errors=True)
    medians = {arm: statistics.median(values) for arm, values in times.items()}
    print(
        json.dumps(
            {
                "rounds": args.rounds,
                "start_ms_median": {arm: round(value, 1) for arm, value in medians.items()},
                "hook_overhead_ms": round(medians["with_hook"] - medians["without_hook"], 1),
                "hook_alone_ms_median": round(statistics.median(alone), 1),
                "start_ms_all": {arm: [round(v, 1) for v in values] for arm, values in times.items()},
                "with_hook_container_sees": check.stdout.split(),
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
