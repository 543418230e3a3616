"""Run inside a umockdev testbed: open a model on the job's Edge TPU with the real libedgetpu.

``python open_probe.py LIBEDGETPU MODEL`` with the job's SLURM_TPU_DEVICES and
SLURM_TPU_EDGETPU_PATHS in the environment prints one JSON object: the runner's error
(type and one-line message; null when the device opened) and how long opening took.
"""

import json
import sys
import time

from slurm_tpu.errors import SlurmTpuError
from slurm_tpu.runner.session import OpenOptions, open_models


def main() -> None:
    library, model = sys.argv[1], sys.argv[2]
    started = time.perf_counter()
    try:
        open_models([model], OpenOptions(libedgetpu=library)).close()
        error = None
    except SlurmTpuError as exc:
        error = {"type": type(exc).__name__, "message": str(exc)}
    print(json.dumps({"error": error, "seconds": time.perf_counter() - started}))


if __name__ == "__main__":
    main()
