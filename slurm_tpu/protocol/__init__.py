"""Every format that crosses a process or privilege boundary, one module each.

Each format has named constants (file names, field names, event names, its
version), one writer and one reader. Readers treat their input as hostile:
anything that is not exactly the format raises :class:`FormatError` with one
line naming the file or field, what is wrong, and (where there is one) what to
do. Stored formats carry a version; readers keep accepting what older releases
wrote (a node upgraded while a job runs) and refuse newer versions by name.

Format, its module, where it lives, writer -> readers (each module's docstring says more):

- **job environment** -- :mod:`.jobenv`: the ``SLURM_TPU_*`` variables of each task.
  The task-prolog -> the runner and job scripts.
- **job environment file** -- :mod:`.envfile`: ``<state_dir>/jobs/<id>.env`` and
  ``no-devices.env``. The prolog (root, through :mod:`slurm_tpu.access.ledger`) -> the task-prolog (the
  job's user: its native entry, or the sh ``prolog/slurm-tpu-task-prolog``).
- **hooks' snapshot** -- :mod:`.hooks_snapshot`: ``<state_dir>/hooks.snapshot``. The
  first hook after any change (root) -> every hook (root).
- **node inventory** -- :mod:`.inventory`: ``<state_dir>/inventory.json``. ``gres-conf
  --output``, ``boot``, the udev hook (root) -> every hook.
- **node agent** -- :mod:`.agent_wire`: ``<state_dir>/agent.sock`` and ``agent.pid``. The
  hooks' C client (``hook_client/``, root) -> the agent (root); its workers -> its scontrol helper.
- **lease files** -- :mod:`.leases`: ``<state_dir>/leases/<identity>``. The hooks,
  ``leases --clear``, health (root, through :mod:`slurm_tpu.access.ledger`) -> the same,
  ``slurm-tpu leases``, ``metrics``.
- **audit events** -- :mod:`.audit`: ``<state_dir>/audit.log``. Every hook (root) ->
  ``report``, ``metrics``, the demo, the isolation tests.
- **usage records** -- :mod:`.usage`: ``<state_dir>/job-usage/<job>/<identity>.json``
  (the job's own tmpfs). The runner (the job's user: hostile input) -> the epilog (root).
- **job records** -- :mod:`.job_record`: ``<accounting_spool>/<job>`` and the
  job's ``AdminComment``. The epilog (root) -> ``accounting-collect`` (root) -> ``report``.
- **server address** -- :mod:`.serve_address`: ``~/.slurm-tpu/serve/<job>.json``.
  ``slurm-tpu serve`` -> ``infer --server`` and the user's scripts.
- **install manifest** -- :mod:`.install_manifest`:
  ``<prefix>/libexec/slurm-tpu/install-manifest.json``. ``install`` -> ``uninstall`` (root).

The state directory (``state_dir``, default ``/run/slurm-tpu``; root's, never followed
through a link) holds the files above and one without a format, ``.lock``: the
``flock`` that serialises lease and ownership changes (every hook). This list is the
one of its files (docs/architecture.md points here).

Formats that cross a boundary but have their own home, named here so this list
is the one place to look: the runner's per-device lock files (:mod:`slurm_tpu.runner.lock`, a pid), the site config
(:mod:`slurm_tpu.config`) and the inference server's HTTP API
(:mod:`slurm_tpu.runner.serve.codec`, TF Serving's REST format).

Root hooks import all of these but the server address and the install manifest on every
job: they are on the hooks' fast path and keep its rule (slurm_tpu/hooks/__init__.py
FAST_PATH); readers that need json import it inside the function. No module here imports
anything of slurm_tpu above this package (tests/test_import_graph.py).
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


class Record:
    """A value class of a format, compared, hashed and shown by its ``__slots__``.

    Plain classes with slots (no dataclasses: the root hooks import these modules);
    a subclass lists its fields in ``__slots__`` and writes its ``__init__``.
    """

    __slots__: tuple[str, ...] = ()

    def _values(self) -> tuple:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._values() == other._values()

    def __hash__(self) -> int:
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{type(self).__name__}({fields})"
