"""The install manifest ``<prefix>/libexec/slurm-tpu/install-manifest.json``: ``slurm-tpu install`` -> ``uninstall``.

What an install did, so that uninstall takes exactly that away: ``{"format": 1,
"slurm_tpu": <version>, "prefix": ..., "sysconfdir": ..., "dirs": [...], "files": [...]}``.
``dirs`` are the directories it created, parents first; each of ``files`` is
:func:`file_entry`'s: ``before`` is :data:`ABSENT`, :data:`SAME` (an identical file was
there, not ours to remove) or the backup of the file it replaced (uninstall puts it back);
``config`` marks the site's config (kept unless ``--purge``). The I/O is
slurm_tpu/ops/install.py's.
"""

from __future__ import annotations

from . import FormatError, json_object

NAME = "install-manifest.json"  # in the hooks directory
FORMAT_VERSION = 1
ABSENT, SAME = "absent", "same"  # ``before``: nothing was there; an identical file was


def file_entry(path: str, before: str, sha256: str | None = None, link: str | None = None, config: bool = False):
    """One of ``files``: a file (``sha256``) or a symbolic link (``link``) install wrote."""
    return {
        "path": path,
        **({"link": link} if link is not None else {"sha256": sha256}),
        "before": before,
        "config": config,
    }


def encode(version: str, prefix: str, sysconfdir: str, dirs: list[str], files: list[dict]) -> str:
    import json

    manifest = {"format": FORMAT_VERSION, "slurm_tpu": version, "prefix": prefix, "sysconfdir": sysconfdir}
    return json.dumps({**manifest, "dirs": dirs, "files": files}, indent=1) + "\n"


def decode(raw: str, source: str) -> tuple[list[str], dict[str, dict]]:
    """(dirs, path -> file entry); :class:`FormatError` naming ``source`` for anything else."""
    data = json_object(raw, f"install manifest {source}")
    if data.get("format") != FORMAT_VERSION:
        raise FormatError(
            f"install manifest {source} has format {data.get('format')!r}, this slurm-tpu reads "
            f"{FORMAT_VERSION}: uninstall with the version that wrote it",
            source,
        )
    try:
        return [str(d) for d in data["dirs"]], {str(entry["path"]): entry for entry in data["files"]}
    except (KeyError, TypeError):
        raise FormatError(
            f"install manifest {source} lacks its dirs or a file's path: remove it by hand", source
        ) from None
