#!/usr/bin/env python3
"""(a) Batch throughput: the runner vs a minimal hand-written interpreter loop.

Same model (the generated MobileNet-v1-shaped uint8 model), same JPEG inputs, same
runtime (LiteRT) and thread count, same work per image (decode, resize to 224x224 with
LANCZOS as pycoral's classify_image.py, invoke, top-3, one JSON line appended to a file). Rounds
alternate A/B so machine
noise hits both; model loading is outside the timed region for both. Prints the
median images/s of each and ratio = runner / hand loop (goal >= 0.95).

    /tmp/venv/bin/python bench/bench_runner_throughput.py [--images 300] [--rounds 5]
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

from harness.modelgen import images, mobilenet
from slurm_tpu.runner import OpenOptions, Runner


def hand_loop(interpreter, paths: list[str], out_path: str) -> None:
    """What a user would write: the baseline."""
    from PIL import Image

    inp = interpreter.get_input_details()[0]["index"]
    outp = interpreter.get_output_details()[0]
    scale, zero = outp["quantization"]
    with open(out_path, "w") as out:
        for path in paths:
            with Image.open(path) as im:
                pixels = np.asarray(im.convert("RGB").resize((224, 224), Image.LANCZOS), dtype=np.uint8)
            interpreter.set_tensor(inp, pixels[np.newaxis])
            interpreter.invoke()
            scores = (interpreter.get_tensor(outp["index"])[0].astype(np.float32) - zero) * scale
            top = np.argsort(-scores, kind="stable")[:3]
            out.write(
                json.dumps({"input": path, "classes": [{"index": int(i), "score": float(scores[i])} for i in top]})
                + "\n"
            )
            out.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from ai_edge_litert.interpreter import Interpreter

    work = Path(tempfile.mkdtemp(prefix="bench-runner-"))
    model = work / "mobilenet.tflite"
    model.write_bytes(mobilenet.build_mobilenet())
    paths = [str(p) for p, _ in images.write_images(work / "img", args.images, size=256, fmt="jpg")]
    threads = len(os.sched_getaffinity(0))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_TPU_")}
    runner = Runner(str(model), options=OpenOptions(device=["cpu"], num_threads=threads), environ=env)
    interpreter = Interpreter(model_path=str(model), num_threads=threads)
    interpreter.allocate_tensors()
    hand_loop(interpreter, paths[:10], str(work / "warm.jsonl"))  # warm both paths
    runner.run_batch(paths[:10], str(work / "warm2.jsonl"), expand=False)

    rates = interleaved(
        args.rounds,
        work,
        {
            "runner": lambda out: runner.run_batch(paths, out, options=runner.options(top_k=3), expand=False),
            "hand": lambda out: hand_loop(interpreter, paths, out),
        },
        len(paths),
        lambda out: _check(out, len(paths), lambda rec: True),
    )
    runner.close()
    report(rates, "batch throughput", 0.95, images=len(paths), rounds=args.rounds, threads=threads)


def _check(out: Path, count: int, good) -> None:
    records = [json.loads(line) for line in out.open()]
    assert len(records) == count and all(good(rec) for rec in records), out


if __name__ == "__main__":
    main()
