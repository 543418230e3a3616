"""Run inside a Pyxis container, one task of a step: this task's share of a batch on its node's TPU.

``python3 pyxis_batch.py MODEL LABELS IMAGES OUT`` (with slurm_tpu on PYTHONPATH: the runner's
API needs only numpy, Pillow and LiteRT, which the image has) takes every Nth input by
SLURM_PROCID / SLURM_STEP_NUM_TASKS (the runner's step sharding, what `slurm-tpu infer` does
in a multi-task step), classifies them into OUT/part-<rank>.jsonl on the job's Edge TPU through
the node's libedgetpu, and prints one JSON line: the node, rank, the devices the runner used,
the inputs it took and how many it processed.
"""

import json
import os
import sys

from slurm_tpu.runner.api import Runner
from slurm_tpu.runner.inputs import list_inputs, shard, step_share


def main() -> None:
    model, labels, images, out = sys.argv[1:5]
    rank, tasks = step_share(os.environ) or (0, 1)
    keys = shard(list_inputs([images]), rank, tasks)
    with Runner(model, labels) as runner:
        summary = runner.run_batch(keys, os.path.join(out, f"part-{rank}.jsonl"), expand=False)
        devices = runner.device_labels
    print(
        json.dumps(
            {
                "node": os.environ.get("SLURMD_NODENAME"),
                "rank": rank,
                "tasks": tasks,
                "devices": devices,
                "inputs": [os.path.basename(key) for key in keys],
                "processed": summary.processed,
                "errors": summary.errors,
            }
        )
    )


if __name__ == "__main__":
    main()
