#!/usr/bin/env python3
"""(b) A 1000-image batch in one process vs one process per image (the seed cluster's way).

The seed jobs started ``python classify_image.py`` once per image: interpreter start,
imports, model load, one inference, exit. Here: ``slurm-tpu infer MODEL DIR -o FILE``
once over 1000 JPEGs, vs ``slurm-tpu infer MODEL IMAGE -c 1`` per image. Running
1000 processes would take many minutes, so a sample of per-image processes (30 by
default, interleaved with the batch runs) is timed and extrapolated to 1000:
ratio = 1000 * median(per-image process) / median(batch process), goal >= 30.

    /tmp/venv/bin/python bench/bench_runner_processes.py [--images 1000] [--samples 30] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from harness.modelgen import images, mobilenet

CLI = [sys.executable, "-c", "from slurm_tpu.cli import run; run()"]


def timed(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=1000)
    parser.add_argument("--samples", type=int, default=30)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-procs-"))
    model = work / "mobilenet.tflite"
    model.write_bytes(mobilenet.build_mobilenet())
    paths = [str(p) for p, _ in images.write_images(work / "img", args.images, size=256, fmt="jpg")]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_TPU_", "SLURM_ARRAY_"))}

    batch, single = [], []
    per_round = max(1, args.samples // args.rounds)
    for r in range(args.rounds):
        out = work / f"batch-{r}.jsonl"
        batch.append(timed([*CLI, "infer", str(model), str(work / "img"), "-o", str(out), "--no-progress"], env))
        assert sum(1 for _ in out.open()) == args.images
        for i in range(per_round):
            path = paths[(r * per_round + i) * 7 % len(paths)]
            single.append(timed([*CLI, "infer", str(model), path, "-c", "1"], env))
    per_image = statistics.median(single)
    one_batch = statistics.median(batch)
    ratio = args.images * per_image / one_batch
    print(
        json.dumps(
            {
                "images": args.images,
                "batch_runs_s": [round(b, 2) for b in batch],
                "per_image_samples": len(single),
                "per_image_median_s": round(per_image, 3),
                "per_image_extrapolated_s": round(args.images * per_image, 1),
                "batch_median_s": round(one_batch, 2),
                "ratio": round(ratio, 1),
            },
            indent=2,
        )
    )
    verdict = "PASS" if ratio >= 30 else "FAIL"
    print(
        f"{verdict}: one {args.images}-image process is {ratio:.0f}x faster than one process per image "
        f"(extrapolated from {len(single)} sampled processes; goal >= 30x)"
    )


if __name__ == "__main__":
    main()
