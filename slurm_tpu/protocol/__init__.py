"""Every format that crosses a process or privilege boundary, one module each.

Each format has named constants, one writer and one reader. Readers treat their
input as hostile: anything that is not exactly the format raises
:class:`FormatError` with one line naming the file or field. Stored formats carry
a version; readers keep accepting what older releases wrote (a node upgraded
while a job runs) and refuse newer versions by name.

The formats (module: file; writer -> readers):

- :mod:`.jobenv`: the ``SLURM_TPU_*`` variables of each task; the task-prolog -> the runner, job scripts.
- :mod:`.envfile`: ``<state_dir>/jobs/<id>.env`` and ``no-devices.env``; the prolog (root) ->
  the task-prolog (the job's user: its native entry or the sh ``prolog/slurm-tpu-task-prolog``).
- :mod:`.hooks_snapshot`: ``<state_dir>/hooks.snapshot``; the first hook after a change -> every hook.
- :mod:`.inventory`: ``<state_dir>/inventory.json``; ``gres-conf --output``, ``boot``, the udev hook -> every hook.
- :mod:`.agent_wire`: ``<state_dir>/agent.sock`` and ``agent.pid``; the hooks' C client
  (``hook_client/``) -> the node agent; its workers -> its scontrol helper.
- :mod:`.leases`: ``<state_dir>/leases/<identity>``; the hooks, ``leases --clear``, health ->
  the same, ``slurm-tpu leases``, ``metrics``.
- :mod:`.audit`: ``<state_dir>/audit.log``; every hook -> ``report``, ``metrics``, the demo, the isolation tests.
- :mod:`.usage`: ``<state_dir>/job-usage/<job>/<identity>.json`` (the job's own tmpfs); the runner
  (the job's user: hostile input) -> the epilog.
- :mod:`.job_record`: ``<accounting_spool>/<job>`` and the job's ``AdminComment``; the
  epilog -> ``accounting-collect`` -> ``report``.
- :mod:`.energy`: ``<state_dir>/energy/<job>`` (start readings) and ``<job>.poll`` (polled power);
  the prolog and the node agent's power sampler (root) -> the epilog, ``metrics``.
- :mod:`.serve_address`: ``~/.slurm-tpu/serve/<job>.json``; ``slurm-tpu serve`` -> ``infer --server``.
- :mod:`.install_manifest`: ``<prefix>/libexec/slurm-tpu/install-manifest.json``; ``install`` -> ``uninstall``.

The state directory (``state_dir``, default ``/run/slurm-tpu``; root's, never followed
through a link) holds the files above and ``.lock``, the ``flock`` that serialises lease
and ownership changes. Formats with their own home: :mod:`slurm_tpu.runner.lock`,
:mod:`slurm_tpu.config`, :mod:`slurm_tpu.runner.serve.codec` (the server's HTTP API).
All but the server address and the install manifest are on the hooks' fast path.
"""

from __future__ import annotations

from ..errors import SlurmTpuError


class FormatError(SlurmTpuError, ValueError):
    """Bytes that are not the format they claim to be (torn, forged, or from a newer version).

    ``source`` names what was read (a file name, ``audit.log line 12``).
    """

    def __init__(self, message: str, source: str = ""):
        super().__init__(message)
        self.source = source


def json_object(raw: str | bytes, source: str) -> dict:
    """The JSON object in ``raw``; :class:`FormatError` (naming ``source``) for anything else."""
    import json

    try:
        data = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: "[[[[..." nested past the stack
        raise FormatError(f"{source}: not a JSON object (not JSON, or a torn line)", source) from None
    if not isinstance(data, dict):
        raise FormatError(f"{source}: not a JSON object", source)
    return data


def decimal_text(value: float) -> str:
    """A figure as a key=value format writes it: at most 6 decimals, no trailing zeros (``0.25``, ``3``)."""
    text = f"{value:.6f}".rstrip("0").rstrip(".")
    return text or "0"


class Record:
    """A value class of a format, compared and shown by its ``__slots__`` (no dataclasses: the root
    hooks import these modules). Not hashable: most are changed in place (a lease's phase), and a
    value that changes under its hash is lost in a set; a record never changed after it is made
    opts in with ``__hash__ = Record.value_hash``."""

    __slots__: tuple[str, ...] = ()  # (defining __eq__ alone leaves __hash__ None)

    def _values(self) -> tuple:
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self._values() == other._values()

    def value_hash(self) -> int:
        """The hash of a record that never changes (its values')."""
        return hash(self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self.__slots__)
        return f"{type(self).__name__}({fields})"
