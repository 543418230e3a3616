"""Which of this node's accelerators Slurm gave a job, in Slurm's order.

Slurm 22.05 tells the prolog nothing about a ``tpu`` GRES, so the prolog asks
once (pyslurm when an importable build matches the running Slurm, otherwise
``squeue --json -j JOB``; JSON because ``scontrol show job -d`` text can be
forged by a job name holding a newline and a fake ``GRES=...(IDX:n)`` line),
turns each ``IDX`` into a gres.conf ``File=`` path exactly as slurmd numbers
them (see ``slurm.gres_index``), and that path into an identity: for Edge TPUs
the file must be ``<slot_dir>/<identity>``, for GPUs a node the inventory lists.
The device nodes to chown always come from the inventory file, never from
gres.conf or the job.
"""

from __future__ import annotations

import os
from typing import Mapping, Sequence

from ..config import Config
from ..locks.node_inventory import KnownDevice
from ..slurm.parse import GresAlloc
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
    import importlib.util

    if importlib.util.find_spec("pyslurm") is None:
        return None
    try:
        import pyslurm  # type: ignore[import-not-found]
        from ..slurm.parse import expand_hostlist, parse_gres_detail

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


def query_job_gres(job_id: int, node: str) -> list[GresAlloc] | None:
    """The job's GRES on this node: one Slurm query. None if Slurm does not list it here."""
    from ..errors import SlurmCommandError
    from ..slurm.commands import find_program, run
    from ..slurm.parse import parse_squeue_job_json

    via_pyslurm = _query_pyslurm(job_id, node)
    if via_pyslurm is not None:
        return via_pyslurm
    try:
        text = run([find_program("squeue"), "--json", "-j", str(job_id)], timeout=20)
        return parse_squeue_job_json(text, job_id, node)
    except SlurmCommandError as exc:
        raise HookError(f"job {job_id}: cannot ask Slurm for its devices: {exc}") from exc
    except ValueError as exc:
        raise HookError(f"job {job_id}: cannot parse squeue --json output ({exc})") from exc


def resolve(job_id: int, allocs: Sequence[GresAlloc], index: Mapping[str, list[tuple[str | None, str | None]]],
            known: Mapping[str, KnownDevice], config: Config) -> list[KnownDevice]:
    """The job's devices on this node, in allocation order (pure).

    Raises HookError (the node cannot serve the job) when an index has no
    device, names a path that is no known device, or disagrees with its type.
    """
    slot_dir = os.path.normpath(config.slot_dir)
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
            device = _device_for(path, alloc.name, config, slot_dir, known)
            if device is None:
                raise HookError(f"job {job_id}: gres.conf names {path!r} for {alloc.name} IDX {idx}, which "
                                "is not a device this node's inventory knows; fix gres.conf "
                                "(slurm-tpu gres-conf --output ...)")
            if device not in devices:
                devices.append(device)
    return devices


def _device_for(path: str | None, name: str, config: Config, slot_dir: str,
                known: Mapping[str, KnownDevice]) -> KnownDevice | None:
    if not path:
        return None
    path = os.path.normpath(path)
    if name == config.tpu_gres_name:
        if os.path.dirname(path) != slot_dir:
            return None
        device = known.get(os.path.basename(path))
        return device if device is not None and device.kind == "edgetpu" else None
    for device in known.values():
        if device.kind == "gpu" and path in device.device_nodes:
            return device
    return None
