"""``python -m harness.modelgen --out DIR [--images N]``: write the generated models."""

from __future__ import annotations

import argparse
from pathlib import Path

from . import write_models


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m harness.modelgen", description=__doc__)
    parser.add_argument("--out", required=True, type=Path, help="directory to write into")
    parser.add_argument("--images", type=int, default=18, help="generated test images (default 18)")
    parser.add_argument("--mobilenet-width", type=float, default=1.0, help="width multiplier (default 1.0)")
    args = parser.parse_args()
    for name, path in write_models(args.out, args.images, args.mobilenet_width).items():
        print(f"{name}: {path}")


if __name__ == "__main__":
    main()
