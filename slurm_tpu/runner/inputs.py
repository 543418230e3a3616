"""Which inputs a run covers: listing (directory, glob, list file), sharding over array
tasks and the tasks of a job step, and sbatch-style patterns in the output name."""

from __future__ import annotations

import getpass
import glob
import os
import re
import socket
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypeVar

from .errors import InputError, UsageError
from .preprocess import is_input_file

T = TypeVar("T")
_GLOB_CHARS = set("*?[")


def _list_file(path: Path) -> list[str]:
    """One input per line; blank lines and #comments skipped; relative paths as written."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise InputError(f"list file {path} cannot be read ({exc}): give one input path per line", str(path)) from None
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
            entries = sorted(str(p) for p in path.iterdir() if p.is_file() and is_input_file(p.name))
            if not entries:
                raise InputError(f"input directory {spec} has no .jpg/.png/.npy files", spec)
            found.extend(entries)
        elif _GLOB_CHARS & set(spec) and not path.exists():
            matches = sorted(m for m in glob.glob(spec) if os.path.isfile(m))
            if not matches:
                raise InputError(
                    f"input pattern {spec} matches no files (quote it so the shell does not expand it)", spec
                )
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


def array_share(environ: Mapping[str, str]) -> tuple[int, int] | None:
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
        raise UsageError(
            "SLURM_ARRAY_TASK_ID is set but SLURM_ARRAY_TASK_COUNT/_MIN are missing or "
            "not numbers: pass --shard-index and --shard-count"
        ) from None
    offset = task - first
    if step <= 0 or offset < 0 or offset % step or offset // step >= count:
        raise UsageError(
            f"array task {task} (min {first}, step {step}, count {count}) is not a regular "
            "range member: pass --shard-index and --shard-count explicitly"
        )
    return offset // step, count


def step_share(environ: Mapping[str, str]) -> tuple[int, int] | None:
    """(SLURM_PROCID, tasks) for a task of a job step with several tasks (``srun -n 4 ...``).

    Keyed on ``SLURM_STEP_NUM_TASKS``, which srun sets for the tasks of a step: a batch
    script has ``SLURM_NTASKS`` (the job's --ntasks) and ``SLURM_PROCID=0`` too, but it is
    one process, and must not take a quarter of the inputs because the job asked for 4.
    """
    if "SLURM_STEP_NUM_TASKS" not in environ or "SLURM_PROCID" not in environ:
        return None
    try:
        tasks, rank = int(environ["SLURM_STEP_NUM_TASKS"]), int(environ["SLURM_PROCID"])
    except ValueError:
        raise UsageError(
            "SLURM_STEP_NUM_TASKS/SLURM_PROCID are not numbers: pass --shard-index and --shard-count"
        ) from None
    if tasks <= 1:
        return None
    if not 0 <= rank < tasks:
        raise UsageError(
            f"SLURM_PROCID {rank} is not below SLURM_STEP_NUM_TASKS {tasks}: pass --shard-index and --shard-count"
        )
    return rank, tasks


def shard_from_environment(environ: Mapping[str, str]) -> tuple[int, int] | None:
    """This process's share of the inputs under Slurm: array task x step task.

    Shares combine: array index ``a`` of ``A`` and step task ``t`` of ``T`` take share
    ``a * T + t`` of ``A * T``, so an array of multi-task steps still covers every input
    exactly once. None outside arrays and multi-task steps.
    """
    array, step = array_share(environ), step_share(environ)
    if array is None and step is None:
        return None
    a_index, a_count = array or (0, 1)
    t_index, t_count = step or (0, 1)
    return a_index * t_count + t_index, a_count * t_count


_PATTERN = re.compile(r"%(\d*)([AaJjNnstux%])")


def expand_output_pattern(path: str, environ: Mapping[str, str]) -> str:
    """sbatch-style patterns in --output: ``%A %a %J %j %N %n %s %t %u %x`` and ``%%``, as they
    stand in this process (see ``man sbatch``); a number after % zero-pads numeric values
    (``%3t`` -> ``007``). Others are kept as written."""
    job = environ.get("SLURM_JOB_ID", "0")
    step = environ.get("SLURM_STEP_ID")
    node = environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]
    try:
        user = environ.get("SLURM_JOB_USER") or getpass.getuser()
    except (KeyError, OSError):  # no passwd entry for this uid
        user = str(os.getuid())
    values = {
        "A": environ.get("SLURM_ARRAY_JOB_ID") or job,  # array master job id
        "a": environ.get("SLURM_ARRAY_TASK_ID", "0"),  # array task id
        "j": job,
        "J": f"{job}.{step}" if step is not None else job,  # job id.step id
        "N": node,  # this task's node (sbatch: the first node; here each task its own)
        "n": environ.get("SLURM_NODEID", "0"),  # node index in the job
        "s": step if step is not None else "batch",
        "t": environ.get("SLURM_PROCID", "0"),  # task rank in the step
        "u": user,
        "x": environ.get("SLURM_JOB_NAME", ""),
        "%": "%",
    }

    def substitute(match: re.Match) -> str:
        width, key = match.group(1), match.group(2)
        value = values[key]
        return value.zfill(int(width)) if width and value.isdigit() else value

    return _PATTERN.sub(substitute, path)
