"""Runner results on Coral-style models, written on one architecture and compared on another.

The arm64 leg (scripts/ci-arm64.sh) runs ``results`` on the x86_64 host and in the emulated arm64
root over the same model and image files, then ``compare``: the runner must give the same answers
on a Raspberry Pi as on a server. Each record is, per model and input, the SHA-256 of the input
tensor the runner prepared (decoding and resizing), of every raw output tensor (LiteRT's kernels
differ per architecture: XNNPACK/ruy on arm64, x86 SIMD on the host), and the task's result as
text (classes, objects, a class map's digest). The models and images are hashed too, so a
difference can only come from the runtime, not from the files.

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


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _result_text(result: Any) -> str:
    """A task result as stable text: a class map by its digest, anything else by its repr."""
    class_map = getattr(result, "class_map", None)
    if class_map is not None:
        return f"class_map {class_map.shape} {_digest(class_map.tobytes())}"
    return repr(result)


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
                    "outputs": [f"{o.dtype}{list(o.shape)} {_digest(o.tobytes())}" for o in outputs],
                    "result": _result_text(runner.run(str(path))),
                }
        record["models"][name] = {"model": _digest(model.read_bytes()), "inputs": entries}
    return record


def compare(first: dict[str, Any], second: dict[str, Any]) -> list[str]:
    """Every difference between two records, one line each (empty: identical results)."""
    where = f"{first.get('machine')} vs {second.get('machine')}"
    lines = []
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
            for key in ("image", "input", "outputs", "result"):
                if x[key] != y[key]:
                    lines.append(f"{name} {image}: {key} differs ({where}): {x[key]} != {y[key]}")
    return lines


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
    differences = compare(first, second)
    for line in differences:
        print(f"parity: {line}", file=sys.stderr)
    total = sum(len(m["inputs"]) for m in first["models"].values())
    if differences:
        print(f"parity: {len(differences)} differences in {total} results", file=sys.stderr)
        return 1
    print(f"parity: {total} results identical on {first['machine']} and {second['machine']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
