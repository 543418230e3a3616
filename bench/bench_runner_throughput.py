#!/usr/bin/env python3
"""(a) Batch throughput: the runner vs a minimal hand-written interpreter loop.

Same model (the generated MobileNet-v1-shaped uint8 model), same JPEG inputs, same
runtime (LiteRT) and thread count, same work per image (decode, resize to 224x224 with
LANCZOS as pycoral's classify_image.py, invoke, top-3, one JSON line appended to a file). Rounds alternate A/B so machine
noise hits both; model loading is outside the timed region for both. Prints the
median images/s of each and ratio = runner / hand loop (goal >= 0.95).

    /tmp/venv/bin/python bench/bench_runner_throughput.py [--images 300] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from slurm_tpu.modelgen import images, mobilenet  # noqa: E402
from slurm_tpu.runner import OpenOptions, Runner  # noqa: E402


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
            out.write(json.dumps({"input": path, "classes": [{"index": int(i), "score": float(scores[i])}
                                                             for i in top]}) + "\n")
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

    rates: dict[str, list[float]] = {"runner": [], "hand": []}
    for r in range(args.rounds):
        for name in (("runner", "hand") if r % 2 == 0 else ("hand", "runner")):
            out = work / f"{name}-{r}.jsonl"
            start = time.perf_counter()
            if name == "runner":
                runner.run_batch(paths, str(out), options=runner.options(top_k=3), expand=False)
            else:
                hand_loop(interpreter, paths, str(out))
            rates[name].append(len(paths) / (time.perf_counter() - start))
            assert sum(1 for _ in out.open()) == len(paths)
    runner.close()
    a, b = statistics.median(rates["runner"]), statistics.median(rates["hand"])
    ratio = a / b
    print(json.dumps({"images": len(paths), "rounds": args.rounds, "threads": threads,
                      "runner_per_s": round(a, 1), "hand_loop_per_s": round(b, 1), "ratio": round(ratio, 3),
                      "runner_rounds": [round(x, 1) for x in rates["runner"]],
                      "hand_rounds": [round(x, 1) for x in rates["hand"]]}, indent=2))
    verdict = "PASS" if ratio >= 0.95 else "FAIL"
    print(f"{verdict}: runner batch throughput is {ratio:.2f}x the hand-written loop (goal >= 0.95)")


if __name__ == "__main__":
    main()
