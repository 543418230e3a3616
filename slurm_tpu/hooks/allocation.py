"""Which of this node's accelerators Slurm gave a job, in Slurm's order.

Slurm tells the prolog about a GRES only through that GRES's plugin. With our gres/tpu
plugin loaded (slurm_plugin/) slurmd sets ``SLURM_JOB_TPUS=<idx>,<idx>`` (this node's
``IDX`` numbers): when every GRES this node leases has such a variable (``PLUGIN_ENV``),
Slurm is not asked. Otherwise (no plugin, a malformed value, GPUs or Hailo NPUs leased
too) the prolog asks ``scontrol show job -d JOB`` (8 ms; importing pyslurm alone takes
45), whose text a job name holding newlines can forge: ``slurm.jobdetail`` detects a
forgery, which costs a second query, ``squeue --json`` (unforgeable).

Each ``IDX`` becomes a gres.conf ``File=`` path as slurmd numbers them
(``slurm.gres_index``), and that path an identity: for a family with slot nodes the file
must be ``<slot_dir>/<identity>``, for the others a node the inventory lists, of a device
of that family. The device nodes to chown always come from the inventory file, never
from gres.conf or the job.

Energy: where a family's devices are not leased but are read for energy (GPUs, by default; settings
``energy_gres``), the query names their GRES too and :func:`metered_devices` maps their IDX the same way.
"""

from __future__ import annotations

import os

from .context import HookError, say

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence

    from ..protocol.hooks_snapshot import FamilyPolicy
    from ..protocol.inventory import KnownDevice
    from ..slurm.jobdetail import GresAlloc
    from .context import HookRun
    from .settings import HookSettings


# GRES name -> the prolog variable our gres plugin (slurm_plugin/gres_tpu.c) sets to the job's indices
# on this node. Only GRES whose plugin is ours: Slurm's gres/gpu sets SLURM_JOB_GPUS, but overwrites
# it for each type a job asked for, so it cannot stand in for the query.
PLUGIN_ENV = {"tpu": "SLURM_JOB_TPUS"}
# GRES name -> the variable Slurm's own plugin sets for the Prolog only when the job holds that GRES on the
# node (gres_g_prep_set_env walks the job's GRES): its absence says the job has none, with no query; its
# value is not trusted for the indices (see above).
PRESENT_ENV = {"gpu": "SLURM_JOB_GPUS"}
# Longest value read: 1,000 indices of up to 4 digits and their commas; a node has far fewer.
MAX_ENV_VALUE = 5000


def parse_indices(value: str) -> tuple[int, ...] | None:
    """``"0,3"`` -> (0, 3): digits and commas only, no empty item, no repeat, bounded; else None."""
    if not value or len(value) > MAX_ENV_VALUE or value.strip("0123456789,"):
        return None
    items = value.split(",")
    if any(not item or len(item) > 4 for item in items):
        return None
    indices = tuple(int(item) for item in items)
    return indices if len(set(indices)) == len(indices) else None


def gres_from_env(job_id: int, names: Sequence[str], environ: Mapping[str, str]) -> list[GresAlloc] | None:
    """The job's GRES on this node from our gres plugin's variables, or None: ask Slurm.
    ``names``: the GRES this node leases. None unless every one of them has its
    variable set and well-formed (a malformed one says so in one line)."""
    from ..slurm.jobdetail import GresAlloc

    found: list[GresAlloc] = []
    for name in names:
        variable = PLUGIN_ENV.get(name)
        value = environ.get(variable) if variable else None
        if variable is None or value is None:
            return None
        indices = parse_indices(value)
        if indices is None:
            say(f"job {job_id}: {variable} from Slurm's gres plugin is malformed ({value[:40]!r}); asking Slurm")
            return None
        found.append(GresAlloc(name, None, len(indices), indices))
    return found


def query_job_gres(hook: HookRun, metered: Sequence[str] = ()) -> list[GresAlloc] | None:
    """The GRES of the hook's job on its node (None if Slurm does not list the job on this node):
    from our gres plugin's variables (:func:`gres_from_env`), else from Slurm. A node that shares
    devices asks Slurm: its shard GRES has no plugin variable (a count, not devices), and so does a job that
    holds GPUs read for energy (``metered``: HookSettings.energy_gres; :data:`PRESENT_ENV` says whether it does)."""
    job_id, node = hook.job.job_id, hook.job.node
    names = hook.settings.leasable_names()
    shards = hook.settings.shards  # None: the node shares nothing
    if shards is not None:
        names = [*names, shards.gres_name]
    from_env = gres_from_env(job_id, names, hook.environ)
    # A metered GRES (GPUs read for energy) the job does not hold here needs no query either.
    held = [n for n in metered if n not in names and (n not in PRESENT_ENV or PRESENT_ENV[n] in hook.environ)]
    if from_env is not None and not held:
        return from_env
    from ..errors import SlurmCommandError

    # Asked only for the GPUs read for energy (what is leased or shared came from the plugin's variables,
    # or there is none): a failure then costs the job's energy figure, never the job (MeteredQueryError).
    try:
        return hook.slurm().job_gres(job_id, node)
    except SlurmCommandError as exc:
        why = f"job {job_id}: cannot ask Slurm for its devices: {exc}"
    except ValueError as exc:
        why = f"job {job_id}: cannot parse Slurm's answer ({exc})"
    raise HookError(why) if from_env is None else MeteredQueryError(why, from_env)


class MeteredQueryError(HookError):
    """Slurm could not be asked for a job's GPUs read for energy, when nothing else needed the query:
    ``allocs`` is what the job holds otherwise (our gres plugin's variables). The Prolog goes on without
    the GPUs' energy; a caller that does not catch it fails closed, as for any HookError."""

    def __init__(self, message: str, allocs: list[GresAlloc] | None = None):
        super().__init__(message)
        self.allocs = allocs or []


def resolve(job_id: int, allocs: Sequence[GresAlloc], settings: HookSettings) -> list[KnownDevice]:
    """The job's devices on this node, in allocation order (pure).
    Raises HookError (the node cannot serve the job) when an index has no
    device, names a path that is no known device, or disagrees with its type. A device the site
    shares (``FamilyPolicy.shared``) is left out: it is never leased."""
    index, known = settings.index, settings.devices
    slot_dir = os.path.normpath(settings.slot_dir)
    devices: list[KnownDevice] = []
    for alloc in allocs:
        policy = settings.policy_of_gres(alloc.name)
        if alloc.name not in index or policy is None:
            continue
        order = index[alloc.name]
        if not alloc.indices and alloc.count:
            raise HookError(
                f"job {job_id}: Slurm gave no device index for {alloc.name}:{alloc.count}; "
                "gres.conf must name a File= for every device"
            )
        for idx in alloc.indices:
            if idx >= len(order):
                raise HookError(
                    f"job {job_id}: {alloc.name} IDX {idx} is beyond the {len(order)} "
                    "device(s) gres.conf lists for this node; regenerate gres.conf"
                )
            kind, path = order[idx]
            if alloc.type and kind and alloc.type.lower() != kind.lower():
                raise HookError(
                    f"job {job_id}: {alloc.name} IDX {idx} is type {alloc.type} in Slurm but "
                    f"{kind} in gres.conf; slurm.conf Gres= and gres.conf disagree"
                )
            device = _device_for(path, policy, slot_dir, known)
            if device is None:
                raise HookError(
                    f"job {job_id}: gres.conf names {path!r} for {alloc.name} IDX {idx}, which "
                    "is not a device this node's inventory knows; fix gres.conf "
                    "(slurm-tpu gres-conf --output ...)"
                )
            if device.identity in policy.shared:
                continue  # a shared device (a GPU that also serves gres/shard jobs) is never leased
            if device not in devices:
                devices.append(device)
    return devices


def metered_devices(allocs: Sequence[GresAlloc], settings: HookSettings, names: Sequence[str]) -> list[KnownDevice]:
    """The job's devices of the GRES ``names`` (families not leased, read for energy), mapped from their IDX
    as :func:`resolve` maps leased ones (pure). Never raises: an index that maps to no known device is
    left out (its energy goes unmeasured; leasing, not energy, is where a wrong gres.conf fails a job)."""
    slot_dir = os.path.normpath(settings.slot_dir)
    found: list[KnownDevice] = []
    for alloc in allocs:
        policy = next((p for p in settings.families.values() if p.gres_name == alloc.name), None)
        order = settings.index.get(alloc.name, [])
        if alloc.name not in names or policy is None:
            continue
        for idx in alloc.indices:
            device = _device_for(order[idx][1], policy, slot_dir, settings.devices) if idx < len(order) else None
            if device is not None and device not in found:
                found.append(device)
    return found


def _device_for(
    path: str | None, policy: FamilyPolicy, slot_dir: str, known: Mapping[str, KnownDevice]
) -> KnownDevice | None:
    """The known device of the GRES's family that gres.conf's File= names, or None."""
    if not path:
        return None
    path = os.path.normpath(path)
    if policy.slot:
        if os.path.dirname(path) != slot_dir:
            return None
        device = known.get(os.path.basename(path))
        return device if device is not None and device.kind == policy.kind else None
    for device in known.values():
        if device.kind == policy.kind and path in device.device_nodes:
            return device
    return None
