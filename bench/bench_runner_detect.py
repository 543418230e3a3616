#!/usr/bin/env python3
"""Detection batch throughput: the runner vs a minimal hand-written detect_image.py loop.

Same model (the generated SSD-style detector ending in TFLite_Detection_PostProcess),
same JPEG photos (640x480, coloured objects), same runtime (LiteRT) and threads, same
work per image: decode, pycoral's set_resized_input (fit, LANCZOS, zero padding),
invoke, get_objects at threshold 0.4 with boxes in source pixels, one JSON line
appended to a file. Rounds alternate A/B; model loading is outside the timed region.
Prints the median images/s of each and ratio = runner / hand loop (goal >= 0.95).

    .venv/bin/python bench/bench_runner_detect.py [--images 200] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from runner_ab import interleaved, report

from harness.modelgen import detector, images
from slurm_tpu.runner import OpenOptions, Runner


def hand_loop(interpreter, paths: list[str], out_path: str, threshold: float = 0.4) -> None:
    """What a user would write from detect_image.py: the baseline."""
    from PIL import Image

    details = interpreter.get_input_details()[0]
    _, height, width, _ = details["shape"]
    outputs = [d["index"] for d in interpreter.get_output_details()]
    with open(out_path, "w") as out:
        for path in paths:
            with Image.open(path) as image:
                image = image.convert("RGB")
                w, h = image.size
                scale = min(width / w, height / h)
                w, h = int(w * scale), int(h * scale)
                tensor = np.zeros((1, height, width, 3), dtype=np.uint8)
                tensor[0, :h, :w] = np.asarray(image.resize((w, h), Image.LANCZOS))
            interpreter.set_tensor(details["index"], tensor)
            interpreter.invoke()
            boxes, classes, scores, count = (interpreter.get_tensor(i) for i in outputs)
            sx, sy = width / scale, height / scale
            objects = []
            for i in range(int(count[0])):
                if scores[0][i] >= threshold:
                    ymin, xmin, ymax, xmax = boxes[0][i]
                    objects.append(
                        {
                            "id": int(classes[0][i]),
                            "score": float(scores[0][i]),
                            "bbox": [int(xmin * sx), int(ymin * sy), int(xmax * sx), int(ymax * sy)],
                        }
                    )
            out.write(json.dumps({"input": path, "objects": objects}) + "\n")
            out.flush()


def write_photos(directory: Path, count: int) -> list[str]:
    """640x480 JPEGs: the generated scenes' objects, recoloured noise per image."""
    from PIL import Image

    directory.mkdir(parents=True, exist_ok=True)
    scene = next(s for s in images.SCENES if s.name == "photo_640x480")
    paths = []
    for i in range(count):
        path = directory / f"photo_{i:05d}.jpg"
        Image.fromarray(scene.pixels(seed=i)).save(path, quality=90)
        paths.append(str(path))
    return paths


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from ai_edge_litert.interpreter import Interpreter

    work = Path(tempfile.mkdtemp(prefix="bench-detect-"))
    model = work / "detector.tflite"
    model.write_bytes(detector.build_detector())
    paths = write_photos(work / "photos", args.images)
    threads = len(os.sched_getaffinity(0))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_TPU_")}
    runner = Runner(str(model), options=OpenOptions(device=["cpu"], num_threads=threads), environ=env)
    assert runner.task.name == "detect"
    interpreter = Interpreter(model_path=str(model), num_threads=threads)
    interpreter.allocate_tensors()
    hand_loop(interpreter, paths[:10], str(work / "warm.jsonl"))  # warm both paths
    runner.run_batch(paths[:10], str(work / "warm2.jsonl"), expand=False)

    rates = interleaved(
        args.rounds,
        work,
        {
            "runner": lambda out: runner.run_batch(paths, out, expand=False),
            "hand": lambda out: hand_loop(interpreter, paths, out),
        },
        len(paths),
        lambda out: _check(out, len(paths), lambda rec: len(rec["objects"]) == 2),
    )
    runner.close()
    report(rates, "detection throughput", 0.95, images=len(paths), rounds=args.rounds, threads=threads)


def _check(out: Path, count: int, good) -> None:
    records = [json.loads(line) for line in out.open()]
    assert len(records) == count and all(good(rec) for rec in records), out


if __name__ == "__main__":
    main()
