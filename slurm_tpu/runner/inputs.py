"""Which inputs a run covers: listing (directory, glob, list file) and array-job sharding."""

from __future__ import annotations

import glob
import os
from pathlib import Path
from typing import Mapping, Sequence, TypeVar

from .errors import InputError, UsageError
from .preprocess import is_input_file

T = TypeVar("T")
_GLOB_CHARS = set("*?[")


def _list_dir(path: Path) -> list[str]:
    return sorted(str(p) for p in path.iterdir() if p.is_file() and is_input_file(p.name))


def _list_file(path: Path) -> list[str]:
    """One input per line; blank lines and #comments skipped; relative paths as written."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"list file {path} cannot be read ({exc}): give one input path per line",
                         str(path)) from None
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def list_inputs(specs: Sequence[str]) -> list[str]:
    """Expand inputs, keeping their order: a directory (its image/.npy files, sorted), a glob
    pattern (sorted matches), ``@FILE`` or a non-image file (a list of paths), or one file."""
    found: list[str] = []
    for spec in specs:
        if spec.startswith("@"):
            found.extend(_list_file(Path(spec[1:])))
            continue
        path = Path(spec)
        if path.is_dir():
            entries = _list_dir(path)
            if not entries:
                raise InputError(f"input directory {spec} has no .jpg/.png/.npy files", spec)
            found.extend(entries)
        elif _GLOB_CHARS & set(spec) and not path.exists():
            matches = sorted(m for m in glob.glob(spec) if os.path.isfile(m))
            if not matches:
                raise InputError(f"input pattern {spec} matches no files (quote it so the shell "
                                 "does not expand it)", spec)
            found.extend(matches)
        elif path.is_file() and not is_input_file(spec):
            found.extend(_list_file(path))
        elif path.is_file():
            found.append(spec)
        else:
            raise InputError(f"input {spec} does not exist: give a file, directory, glob or @list", spec)
    return found


def shard(items: Sequence[T], index: int, count: int) -> list[T]:
    """Round-robin share ``index`` of ``count``: every item lands in exactly one share,
    and shares differ in size by at most one."""
    if count < 1 or not 0 <= index < count:
        raise UsageError(f"shard {index} of {count} does not exist: need 0 <= index < count")
    return list(items[index::count])


def shard_from_environment(environ: Mapping[str, str]) -> tuple[int, int] | None:
    """(index, count) for a Slurm array task, or None outside array jobs.

    ``SLURM_ARRAY_TASK_ID`` is not an index: arrays may start anywhere (``--array=5-9``)
    and step (``--array=0-20:4``). The index is ``(ID - MIN) / STEP`` out of
    ``SLURM_ARRAY_TASK_COUNT``; arbitrary lists (``--array=1,4,9``) cannot be mapped
    and need explicit --shard-index/--shard-count.
    """
    if "SLURM_ARRAY_TASK_ID" not in environ:
        return None
    try:
        task = int(environ["SLURM_ARRAY_TASK_ID"])
        count = int(environ["SLURM_ARRAY_TASK_COUNT"])
        first = int(environ.get("SLURM_ARRAY_TASK_MIN", "0"))
        step = int(environ.get("SLURM_ARRAY_TASK_STEP", "1") or 1)
    except (KeyError, ValueError):
        raise UsageError("SLURM_ARRAY_TASK_ID is set but SLURM_ARRAY_TASK_COUNT/_MIN are missing or "
                         "not numbers: pass --shard-index and --shard-count") from None
    offset = task - first
    index = offset // step if step > 0 else -1
    if offset < 0 or offset % step or index >= count:
        raise UsageError(f"array task {task} (min {first}, step {step}, count {count}) is not a regular "
                         "range member: pass --shard-index and --shard-count explicitly")
    return index, count


def expand_output_pattern(path: str, environ: Mapping[str, str]) -> str:
    """sbatch-style ``%A`` (array job id) and ``%a`` (array task id) in --output; ``%%`` is %."""
    job = environ.get("SLURM_ARRAY_JOB_ID") or environ.get("SLURM_JOB_ID", "0")
    task = environ.get("SLURM_ARRAY_TASK_ID", "0")
    out, i = [], 0
    while i < len(path):
        if path[i] == "%" and i + 1 < len(path) and path[i + 1] in "Aa%":
            out.append({"A": job, "a": task, "%": "%"}[path[i + 1]])
            i += 2
        else:
            out.append(path[i])
            i += 1
    return "".join(out)
