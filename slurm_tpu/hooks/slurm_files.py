"""The Slurm files the hooks read: slurm.conf (with its Includes) and gres.conf.

From them the slow path of ``settings.py`` builds the hooks' GRES index (IDX ->
gres.conf ``File=``, numbered as slurmd numbers them: ``slurm.gres_index``), and
the list of files whose versions key the hooks' snapshot. ``ops/doctor.py``
checks the same files. Standard library only: the hooks import it.
"""

from __future__ import annotations

import os

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence


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


def _slurm_conf_texts(path: str, depth: int = 0) -> list[tuple[str, str]]:
    """(path, text) of slurm.conf and the files it Includes, three levels deep, in reading order."""
    from ..slurm.parse import include_paths

    text = _read(path) or ""
    texts = [(path, text)]
    if depth < 3:
        for included in include_paths(text, os.path.dirname(path)):
            if "*" not in included:
                texts += _slurm_conf_texts(included, depth + 1)
    return texts


def slurm_conf_files(path: str) -> list[str]:
    """slurm.conf and the files it Includes (their versions key the hooks' snapshot)."""
    return [name for name, _ in _slurm_conf_texts(path)]


def gres_index(
    node: str, names: Sequence[str], environ: Mapping[str, str]
) -> dict[str, list[tuple[str | None, str | None]]]:
    """name -> [(type, file) per IDX] for this node, from slurm.conf + gres.conf."""
    from ..slurm.gres_index import device_order
    from ..slurm.parse import parse_gres_conf, parse_node_gres

    slurm_conf, gres_conf = conf_paths(environ)
    gres_text = _read(gres_conf)
    if gres_text is None:
        return {}
    records = parse_gres_conf(gres_text, node)
    # slurm.conf with its Include files appended (NodeName lines may live there).
    node_gres = parse_node_gres("\n".join(text for _, text in _slurm_conf_texts(slurm_conf)), node)
    return {name: device_order(name, records, node_gres) for name in names if any(r.name == name for r in records)}
