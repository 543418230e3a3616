"""Run inside a umockdev testbed: our view of the node and the real libedgetpu's, as JSON.

``python probe.py LIBEDGETPU`` prints one JSON object:
  inventory  what ``slurm-tpu detect`` finds (real libudev),
  exported   SLURM_TPU_EDGETPU_PATHS as the task-prolog would export it for a job that
             leased every usable Edge TPU (the hooks' own code: settings.apply_families,
             envfile.render, then the runner's jobenv.parse_environment),
  listed     edgetpu_list_devices() of the library, in its order, as "type:path",
  visible    the same with the EDGETPU_VISIBLE_DEVICES that task-prolog exports set (the
             node's libedgetpu, patched, lists exactly those then, in that order).
"""

import json
import os
import sys
from types import SimpleNamespace

from slurm_tpu.config import Config
from slurm_tpu.detect import detect_inventory
from slurm_tpu.hooks.settings import HookSettings, apply_families
from slurm_tpu.protocol import envfile, jobenv
from slurm_tpu.protocol.inventory import parse_inventory
from slurm_tpu.runner.engines import EdgeTpuLibrary


def main() -> None:
    document = detect_inventory(use_nvml=False).to_json()
    known = parse_inventory(document)
    settings = HookSettings("/nonexistent", devices=known)
    apply_families(settings, Config())
    leases = [
        SimpleNamespace(identity=d.identity, kind=d.kind)
        for d in known.values()
        if d.kind == "edgetpu" and jobenv.EDGETPU_PATHS in settings.values.get(d.identity, {})
    ]
    environ = dict(
        line.removeprefix("export ").split("=", 1)
        for line in envfile.render(leases, settings).splitlines()
        if line.startswith("export ")
    )
    handles = jobenv.parse_environment(environ)
    library = EdgeTpuLibrary(sys.argv[1])
    listed = [f"{t}:{p}" for t, p in library.list_devices()]
    os.environ[jobenv.EDGETPU_VISIBLE] = environ[jobenv.EDGETPU_VISIBLE]  # libedgetpu reads it at each call
    print(
        json.dumps(
            {
                "inventory": document,
                "exported": {h.identity: f"{h.device_type}:{h.path}" for h in handles},
                "listed": listed,
                "visible": [f"{t}:{p}" for t, p in library.list_devices()],
            }
        )
    )


if __name__ == "__main__":
    main()
