"""Runner results on Coral-style models, written on one architecture and compared on another.

The arm64 leg (scripts/ci-arm64.sh) runs ``results`` on the x86_64 host and in the emulated arm64
root over the same model and image files, then ``compare``: the runner must give the same answers
on a Raspberry Pi as on a server. Each record holds, per model and input, the SHA-256 of the input
tensor the runner prepared (decoding and resizing: must be equal), every raw output tensor, and
the task's result as text (classes with scores, objects with boxes, a class map's digest: must be
equal). The models and images are hashed too, so a difference can only come from the runtime.

Raw quantized outputs are NOT bit-identical across architectures, and this is LiteRT's doing, not
ours: its kernels requantize with per-architecture rounding (seen here on MobileNet-v1 uint8:
XNNPACK, the default, differs by 1 in a few of the 1001 outputs for half the images; TFLite's own
builtin kernels by up to 2 in more). So an integer output may differ by at most one quantization
step (:data:`RAW_STEPS`), each difference is reported, and anything more fails.

Usage::

    python -m harness.arm64.parity results --models DIR --out FILE.json
    python -m harness.arm64.parity compare A.json B.json      # exit 1 and one line per difference
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import sys
from pathlib import Path
from typing import Any

# The models every Coral example task has (classify, detect, segment) as harness.modelgen writes
# them, with the inputs each is run on (directories under the models directory).
# (model, its labels, the folder of its inputs)
CASES = [
    ("mobilenet_v1_224_quant.tflite", "mobilenet_labels.txt", "images"),
    ("classifier.tflite", "classifier_labels.txt", "images"),
    ("detector.tflite", "detector_labels.txt", "scenes"),
    ("segmenter.tflite", "segmenter_labels.txt", "scenes"),
    ("segmenter_argmax.tflite", "segmenter_labels.txt", "scenes"),
]
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp")
RAW_STEPS = 1  # the most an integer output may differ across architectures (see above)


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _result_text(result: Any) -> str:
    """A task result as stable text: a class map by its digest, anything else by its repr."""
    class_map = getattr(result, "class_map", None)
    if class_map is not None:
        return f"class_map {class_map.shape} {_digest(class_map.tobytes())}"
    return repr(result)


def _output(tensor: Any) -> dict[str, Any]:
    """One output tensor, whole: compare() measures how far two are apart, not only whether."""
    return {"dtype": str(tensor.dtype), "shape": list(tensor.shape), "hex": tensor.tobytes().hex()}


def results(models: Path) -> dict[str, Any]:
    """Run every case's model on its inputs on the CPU; the record :func:`compare` reads."""
    import os

    from slurm_tpu.runner import Runner

    # The CPU, one thread: no device variables, and thread count does not change a result but
    # keeps the emulated run predictable.
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "EDGETPU_"))}
    record: dict[str, Any] = {"machine": platform.machine(), "models": {}}
    for name, labels, folder in CASES:
        model = models / name
        inputs = sorted(p for p in (models / folder).iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        entries: dict[str, Any] = {}
        with Runner(str(model), str(models / labels), environ=environ) as runner:
            for path in inputs:
                prepared = runner.prepare(str(path))
                outputs = runner.infer([prepared.tensor])
                entries[path.name] = {
                    "image": _digest(path.read_bytes()),
                    "input": _digest(prepared.tensor.tobytes()),
                    "outputs": [_output(o) for o in outputs],
                    "result": _result_text(runner.run(str(path))),
                }
        record["models"][name] = {"model": _digest(model.read_bytes()), "inputs": entries}
    return record


def _output_difference(a: dict[str, Any], b: dict[str, Any]) -> tuple[int, float]:
    """(elements that differ, the largest difference) between two recorded output tensors."""
    import numpy as np

    x = np.frombuffer(bytes.fromhex(a["hex"]), dtype=a["dtype"]).astype(np.float64)
    y = np.frombuffer(bytes.fromhex(b["hex"]), dtype=b["dtype"]).astype(np.float64)
    if a["dtype"] != b["dtype"] or a["shape"] != b["shape"] or x.shape != y.shape:
        return -1, float("inf")
    delta = np.abs(x - y)
    return int(np.count_nonzero(delta)), float(delta.max(initial=0.0))


def compare(first: dict[str, Any], second: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(failures, notes) between two records, one line each: failures are differences in the files,
    the input tensors, the task results, a float output or an integer output by more than
    :data:`RAW_STEPS`; notes are integer outputs within it."""
    where = f"{first.get('machine')} vs {second.get('machine')}"
    lines: list[str] = []
    notes: list[str] = []
    for name in sorted(set(first["models"]) | set(second["models"])):
        a, b = first["models"].get(name), second["models"].get(name)
        if a is None or b is None:
            lines.append(f"{name}: only in one record ({where})")
            continue
        if a["model"] != b["model"]:
            lines.append(f"{name}: the model files differ, the comparison means nothing")
            continue
        for image in sorted(set(a["inputs"]) | set(b["inputs"])):
            x, y = a["inputs"].get(image), b["inputs"].get(image)
            if x is None or y is None:
                lines.append(f"{name} {image}: only in one record")
                continue
            for key in ("image", "input", "result"):
                if x[key] != y[key]:
                    lines.append(f"{name} {image}: {key} differs ({where}): {x[key]} != {y[key]}")
            if len(x["outputs"]) != len(y["outputs"]):
                lines.append(f"{name} {image}: {len(x['outputs'])} outputs != {len(y['outputs'])}")
                continue
            for index, (a_out, b_out) in enumerate(zip(x["outputs"], y["outputs"])):
                count, largest = _output_difference(a_out, b_out)
                if not count:
                    continue
                text = f"{name} {image}: output {index} ({a_out['dtype']}): {count} elements differ, by at most "
                text += f"{largest:g}"
                within = a_out["dtype"].startswith(("uint", "int")) and largest <= RAW_STEPS
                (notes if within else lines).append(text)
    return lines, notes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.arm64.parity", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("results", help="run the models, write the record")
    run.add_argument("--models", type=Path, required=True, help="a directory harness.modelgen wrote")
    run.add_argument("--out", type=Path, required=True)
    check = commands.add_parser("compare", help="compare two records; exit 1 on any difference")
    check.add_argument("first", type=Path)
    check.add_argument("second", type=Path)
    args = parser.parse_args(argv)
    if args.command == "results":
        record = results(args.models)
        args.out.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        count = sum(len(m["inputs"]) for m in record["models"].values())
        print(f"parity: {count} results of {len(record['models'])} models on {record['machine']} -> {args.out}")
        return 0
    first, second = (json.loads(p.read_text()) for p in (args.first, args.second))
    failures, notes = compare(first, second)
    for line in notes:
        print(f"parity: within {RAW_STEPS} step: {line}")
    for line in failures:
        print(f"parity: {line}", file=sys.stderr)
    total = sum(len(m["inputs"]) for m in first["models"].values())
    if failures:
        print(f"parity: {len(failures)} differences in {total} results", file=sys.stderr)
        return 1
    print(
        f"parity: {total} results identical on {first['machine']} and {second['machine']} (inputs, classes, "
        f"scores, boxes, class maps); raw outputs: {len(notes)} within {RAW_STEPS} quantization step, none beyond"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
