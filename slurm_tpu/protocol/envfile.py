"""The job environment file ``<state_dir>/jobs/<job>.env``: the prolog (root) -> the task-prolog (the job's user).

The task-prolog runs before *every* task, as the job's user: reading the ledger there would
cost a Python start per task. So the root prolog writes the lines once (from the hooks'
snapshot) and ``prolog/slurm-tpu-task-prolog`` (POSIX sh, built-ins only) prints them.

Grammar: one line per variable, ``export NAME=value`` or ``unset NAME``, in the
snapshot's variable order, then :data:`~slurm_tpu.protocol.jobenv.CDI_DEVICES` (every leased device's
CDI name, for ``podman run --device``), then :data:`~slurm_tpu.protocol.jobenv.USAGE_DIR`, then for a job
holding TPU shares here its broker endpoint and share count (protocol/broker_wire.py
``SLURM_TPU_BROKER``, ``SLURM_TPU_SHARDS``: printed under the ``export SLURM_TPU_`` pattern); such a
job's :data:`~slurm_tpu.protocol.jobenv.EDGETPU_VISIBLE` ends with ``broker:<endpoint>`` (after its
whole Edge TPUs' paths, if any), which the node's patched libedgetpu lists and forwards to the
broker (scripts/libedgetpu-broker.patch), so unmodified pycoral/tflite code runs on the shard. Values
never hold a comma, quote or newline (``slurm_tpu.identity``). The reader prints only
lines that begin with one of :data:`PRINTED` (its ``case`` patterns), so a line a family
could add under another name never reaches the job's shell. ``<state_dir>/no-devices.env``
(:func:`render_unset`) is what it prints for a job with no device here. Writing the
files safely is ``Ledger.write_job_env``'s (slurm_tpu/access/ledger.py).
"""

from __future__ import annotations

from .jobenv import CDI_DEVICES, EDGETPU_VISIBLE, USAGE_DIR, cdi_name

TYPE_CHECKING = False  # annotations only: importing typing costs the hooks milliseconds per job
if TYPE_CHECKING:
    from collections.abc import Sequence

    from .hooks_snapshot import HookSnapshot
    from .leases import Lease

DIR = "jobs"  # under the state directory: one file per job with devices on this node
NO_DEVICES = "no-devices.env"  # beside jobs/, not in it (jobs/ holds one file per running job)
# The line beginnings the task-prolog prints (prolog/slurm-tpu-task-prolog's case patterns).
PRINTED = ("export SLURM_TPU_", "unset SLURM_TPU_", f"export {EDGETPU_VISIBLE}=")
# A TPU shard's entry in EDGETPU_VISIBLE_DEVICES: "broker:<endpoint>" (no device path begins so).
BROKER_ENTRY = "broker:"


def file_name(job_id: int) -> str:
    """The job's file under :data:`DIR`."""
    return f"{job_id}.env"


def render(
    leases: Sequence[Lease],
    settings: HookSnapshot,
    usage_dir: str | None = None,
    broker: tuple[str, int] | None = None,
) -> str:
    """The export lines for a job's leases (in allocation order) and its usage box, if any, from
    the hooks' snapshot's ``variables`` and per-device ``values`` (a device without an entry is
    left out: the prolog refuses such a device before leasing it). ``broker``: (endpoint, shares)
    of a job holding TPU shares on this node (its endpoint path holds no comma, quote or newline:
    the state directory's path and a job id)."""
    if broker is not None and (any(c in broker[0] for c in "\n'\",") or not broker[0].isprintable()):
        raise ValueError(f"broker endpoint {broker[0]!r} cannot go into a job's environment file")
    lines = []
    for variable in settings.variables:
        found = [
            settings.values.get(lease.identity, {}).get(variable.name)
            for lease in leases
            if lease.kind == variable.kind
        ]
        entries = [entry for entry in found if entry is not None]
        if broker is not None and variable.name == EDGETPU_VISIBLE:
            # After the whole devices: their indexes (":0", "usb:0") and the default device stay
            # the job's own silicon; the shard is what the job has besides (or alone).
            entries.append(BROKER_ENTRY + broker[0])
        if entries or not variable.unset_when_empty:
            lines.append(f"export {variable.name}={','.join(entries)}")
        else:
            lines.append(f"unset {variable.name}")
    # Every leased device is in this node's CDI spec (``slurm-tpu cdi``) under this name.
    names = [cdi_name(lease.kind, lease.identity) for lease in leases]
    lines.append(f"export {CDI_DEVICES}={','.join(names)}" if names else f"unset {CDI_DEVICES}")
    lines.append(f"export {USAGE_DIR}={usage_dir}" if usage_dir else f"unset {USAGE_DIR}")
    if broker is not None:
        from .broker_wire import ENDPOINT_ENV, SHARDS_ENV

        endpoint, shares = broker
        lines += [f"export {ENDPOINT_ENV}={endpoint}", f"export {SHARDS_ENV}={int(shares)}"]
    return "\n".join(lines) + "\n"


def render_unset(settings: HookSnapshot) -> str:
    """:data:`NO_DEVICES`: every variable of the contract unset (a job with no device on this node),
    except a library's view of the devices, which reads unset as "all of them": that one is exported empty."""
    lines = [f"export {v.name}=" if v.never_unset else f"unset {v.name}" for v in settings.variables]
    return "\n".join([*lines, f"unset {CDI_DEVICES}", f"unset {USAGE_DIR}"]) + "\n"
