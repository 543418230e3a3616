"""Which of this node's accelerators Slurm gave a job, in Slurm's order.

Slurm 22.05 tells the prolog nothing about a ``tpu`` GRES, so the prolog asks
once: pyslurm when an importable build matches the running Slurm, otherwise
``scontrol show job -d JOB`` (about 8 ms). That text can be forged by a job name
holding a newline and a fake ``Nodes=.. GRES=...(IDX:n)`` line, but Slurm's own
line is always there too: two lines for this node mean forgery, and only then a
second query asks ``squeue --json`` (about 20 ms, unforgeable). The prolog
turns each ``IDX`` into a gres.conf ``File=`` path exactly as slurmd numbers
them (see ``slurm.gres_index``), and that path into an identity: for Edge TPUs
the file must be ``<slot_dir>/<identity>``, for GPUs a node the inventory lists.
The device nodes to chown always come from the inventory file, never from
gres.conf or the job.
"""

from __future__ import annotations

# Annotations only: typing costs the hooks milliseconds per job at run time.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Mapping, Sequence

    from ..locks.node_inventory import KnownDevice
    from ..slurm.jobdetail import GresAlloc
    from .settings import HookSettings

import os

from .context import HookError


def conf_paths(environ: Mapping[str, str]) -> tuple[str, str]:
    """(slurm.conf, gres.conf): gres.conf always sits next to slurm.conf."""
    slurm_conf = environ.get("SLURM_CONF") or "/etc/slurm/slurm.conf"
    return slurm_conf, os.path.join(os.path.dirname(slurm_conf), "gres.conf")


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read(4 << 20)
    except OSError:
        return None


def slurm_conf_files(path: str, depth: int = 0) -> list[str]:
    """slurm.conf and the files it Includes (their versions key the hooks' snapshot)."""
    from ..slurm.parse import include_paths

    files = [path]
    if depth < 3:
        for included in include_paths(_read(path) or "", os.path.dirname(path)):
            if "*" not in included:
                files.extend(slurm_conf_files(included, depth + 1))
    return files


def _slurm_conf_text(path: str, depth: int = 0) -> str:
    """slurm.conf with its Include files appended (NodeName lines may live there)."""
    from ..slurm.parse import include_paths

    text = _read(path) or ""
    if depth < 3:
        for included in include_paths(text, os.path.dirname(path)):
            if "*" not in included:
                text += "\n" + _slurm_conf_text(included, depth + 1)
    return text


def gres_index(node: str, names: Sequence[str], environ: Mapping[str, str]
               ) -> dict[str, list[tuple[str | None, str | None]]]:
    """name -> [(type, file) per IDX] for this node, from slurm.conf + gres.conf."""
    from ..slurm.gres_index import device_order
    from ..slurm.parse import parse_gres_conf, parse_node_gres

    slurm_conf, gres_conf = conf_paths(environ)
    gres_text = _read(gres_conf)
    if gres_text is None:
        return {}
    records = parse_gres_conf(gres_text, node)
    node_gres = parse_node_gres(_slurm_conf_text(slurm_conf), node)
    return {name: device_order(name, records, node_gres) for name in names
            if any(r.name == name for r in records)}


def _query_pyslurm(job_id: int, node: str) -> list[GresAlloc] | None:
    """The job's GRES on ``node`` via pyslurm, or None when pyslurm is unusable here.

    Used only when pyslurm is importable *and* was built for the libslurm it
    loaded (same major.minor), since a mismatched build can misread structs.
    """
    import sys

    # A plain stat per sys.path entry: importlib.util costs ~5 ms per job. Under
    # the hooks' `python3 -IS` only the stdlib directories are searched, so a site
    # that wants this path installs pyslurm there (dist-packages is not searched).
    if not any(os.path.exists(os.path.join(entry or ".", "pyslurm")) for entry in sys.path):
        return None
    try:
        import pyslurm  # type: ignore[import-not-found]
        from ..slurm.jobdetail import expand_hostlist, parse_gres_detail

        built = tuple(str(pyslurm.version()).split(".")[:2])
        loaded = tuple(str(part) for part in pyslurm.slurm_api_version()[:2])
        if built != loaded:
            return None
        info = pyslurm.job().find_id(str(job_id))
        if not info:
            return None
        record = info[0] if isinstance(info, list) else info
        hosts = expand_hostlist(record.get("nodes") or "")
        details = record.get("gres_detail") or []
        if node not in hosts:
            return []
        position = hosts.index(node)
        return parse_gres_detail(details[position]) if position < len(details) else []
    except Exception:  # any pyslurm surprise: fall back to the command
        return None


def _piped_answer(job_id: int, environ: Mapping[str, str] | None) -> str | None:
    """The ``scontrol show job -d`` text prolog/slurm-tpu-prolog piped in, if any.

    The sh entry point starts the query concurrently with Python's start-up and
    says so with SLURM_TPU_JOB_ON_STDIN=<job id> (slurmd's hook environment is
    not job-controlled). Empty output means scontrol failed: ask again below.
    """
    if environ is None or environ.get("SLURM_TPU_JOB_ON_STDIN") != str(job_id):
        return None
    import sys

    try:
        text = sys.stdin.read(4 << 20)
    except (OSError, ValueError, UnicodeDecodeError):
        return None
    return text if text.strip() else None


def query_job_gres(job_id: int, node: str, environ: Mapping[str, str] | None = None) -> list[GresAlloc] | None:
    """The job's GRES on this node. None if Slurm does not list the job on this node."""
    from ..errors import SlurmCommandError
    from ..slurm import spawn
    from ..slurm.jobdetail import ForgedOutputError, parse_scontrol_job_detail

    via_pyslurm = _query_pyslurm(job_id, node)
    if via_pyslurm is not None:
        return via_pyslurm
    try:
        text = _piped_answer(job_id, environ)
        if text is None:
            text = spawn.run([spawn.find("scontrol"), "show", "job", "-d", str(job_id)])
        try:
            return parse_scontrol_job_detail(text, node)
        except ForgedOutputError:
            from ..slurm.parse import parse_squeue_job_json

            text = spawn.run([spawn.find("squeue"), "--json", "-j", str(job_id)])
            return parse_squeue_job_json(text, job_id, node)
    except SlurmCommandError as exc:
        raise HookError(f"job {job_id}: cannot ask Slurm for its devices: {exc}") from exc
    except ValueError as exc:
        raise HookError(f"job {job_id}: cannot parse Slurm's answer ({exc})") from exc


def resolve(job_id: int, allocs: Sequence[GresAlloc], settings: HookSettings) -> list[KnownDevice]:
    """The job's devices on this node, in allocation order (pure).

    Raises HookError (the node cannot serve the job) when an index has no
    device, names a path that is no known device, or disagrees with its type.
    """
    index, known = settings.index, settings.devices
    slot_dir = os.path.normpath(settings.slot_dir)
    devices: list[KnownDevice] = []
    for alloc in allocs:
        if alloc.name not in index:
            continue
        order = index[alloc.name]
        if not alloc.indices and alloc.count:
            raise HookError(f"job {job_id}: Slurm gave no device index for {alloc.name}:{alloc.count}; "
                            "gres.conf must name a File= for every device")
        for idx in alloc.indices:
            if idx >= len(order):
                raise HookError(f"job {job_id}: {alloc.name} IDX {idx} is beyond the {len(order)} "
                                "device(s) gres.conf lists for this node; regenerate gres.conf")
            kind, path = order[idx]
            if alloc.type and kind and alloc.type.lower() != kind.lower():
                raise HookError(f"job {job_id}: {alloc.name} IDX {idx} is type {alloc.type} in Slurm but "
                                f"{kind} in gres.conf; slurm.conf Gres= and gres.conf disagree")
            device = _device_for(path, alloc.name == settings.tpu_name, slot_dir, known)
            if device is None:
                raise HookError(f"job {job_id}: gres.conf names {path!r} for {alloc.name} IDX {idx}, which "
                                "is not a device this node's inventory knows; fix gres.conf "
                                "(slurm-tpu gres-conf --output ...)")
            if device not in devices:
                devices.append(device)
    return devices


def _device_for(path: str | None, is_tpu: bool, slot_dir: str,
                known: Mapping[str, KnownDevice]) -> KnownDevice | None:
    if not path:
        return None
    path = os.path.normpath(path)
    if is_tpu:
        if os.path.dirname(path) != slot_dir:
            return None
        device = known.get(os.path.basename(path))
        return device if device is not None and device.kind == "edgetpu" else None
    for device in known.values():
        if device.kind == "gpu" and path in device.device_nodes:
            return device
    return None
