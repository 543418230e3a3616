"""Every format that crosses a process or privilege boundary, one module each.

Each format has named constants (file names, field names, event names, its
version), one writer and one reader. Readers treat their input as hostile:
anything that is not exactly the format raises :class:`FormatError` with one
line naming the file or field, what is wrong, and (where there is one) what to
do. Stored formats carry a version; a reader accepts every older version this
project ever wrote and refuses newer ones by name.

========================  ==============================  =========================  ============================
format                    where it lives                  writer (privilege)         readers
========================  ==============================  =========================  ============================
job environment           ``SLURM_TPU_*`` variables       task-prolog (root, via     the runner, job scripts
                          of each task                    ``jobs/<id>.env``)
                          -> :mod:`.jobenv`
``jobs/<id>.env``         ``<state_dir>/jobs/``           prolog (root)              task-prolog (the job's user,
                          -> ``hooks/envfile.py``                                    a ``sh`` script)
hooks' snapshot           ``<state_dir>/hooks.snapshot``  ``gres-conf``/udev-event/  prolog, epilog, udev-event
                          -> :mod:`.hooks_snapshot`       prolog (root)              (root)
lease files               ``<state_dir>/leases/<id>``     prolog, epilog, udev-event  hooks, ``leases``, health,
                          -> :mod:`.leases`               (root)                     ``metrics``, ``report``
audit events              ``<state_dir>/audit.log``       every hook (root)          ``report``, ``metrics``, the
                          -> :mod:`.audit`                                           demo, the stress tests
usage records             ``<state_dir>/job-usage/<job>   the runner (the job's      epilog (root)
                          /<identity>.json``              user: hostile)
                          -> :mod:`.usage`
========================  ==============================  =========================  ============================

Formats that cross a boundary but have their own home, named here so this list
is the one place to look: the node inventory ``<state_dir>/inventory.json``
(:mod:`slurm_tpu.locks.node_inventory`, the shape of ``slurm-tpu detect --json``),
the prolog's scontrol marker ``<state_dir>/prolog.query`` (one absolute path,
written next to the snapshot, read by ``prolog/slurm-tpu-prolog``), the runner's
per-device lock files (:mod:`slurm_tpu.runner.lock`, a pid), the site config
(:mod:`slurm_tpu.config`) and the inference server's HTTP API
(:mod:`slurm_tpu.runner.serve.codec`, TF Serving's REST format).

Root hooks import :mod:`.leases` and :mod:`.audit` on every job under
``python3 -I -S``: those two (and this package) import no json, re, typing or
dataclasses at module level; readers that need json import it inside the
function, off the hooks' path.
"""

from __future__ import annotations

from ..errors import SlurmTpuError


class FormatError(SlurmTpuError, ValueError):
    """Bytes that are not the format they claim to be (torn, forged, or from a newer version).

    ``source`` names what was read (a file name, ``audit.log line 12``); the
    message is one line and names it too.
    """

    def __init__(self, message: str, source: str = ""):
        super().__init__(message)
        self.source = source


def json_object(raw: str | bytes, source: str) -> dict:
    """The JSON object in ``raw``; :class:`FormatError` (naming ``source``) for anything else.

    json is imported here, in the readers, never by the writers the hooks use.
    """
    import json

    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: "[[[[..." nested past the stack
        raise FormatError(f"{source}: not a JSON object (not JSON, or a torn line)", source) from None
    if not isinstance(data, dict):
        raise FormatError(f"{source}: not a JSON object", source)
    return data
