"""The NVML test double (nvml_double.c): build it, and set a GPU's counters.

A GPU of the double is a file in its state directory named by the GPU's NVML PCI bus id
(``00000000:41:00.0``) holding ``key=value`` lines, read again at every NVML call: ``energy_mj``
(the total energy counter; absent: NOT_SUPPORTED, as on a pre-Volta GPU), ``power_mw`` (absent:
NOT_SUPPORTED, as on a Jetson), ``uuid``, ``name``, ``lost=1`` (every query: GPU_IS_LOST), ``hang=1``
(every query never returns). A ``driver`` file there (:func:`set_driver`) makes ``nvmlInit_v2`` slow,
hang or crash. The GPUs
themselves are found at the first ``nvmlInit_v2``, as the real library finds them; no state
directory at all reads as no driver (DRIVER_NOT_LOADED). The directory is
``$SLURM_TPU_NVML_DOUBLE_DIR``, else ``state`` beside the library.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("nvml_double.c")
LIBRARY = "libnvidia-ml.so.1"
STATE_VARIABLE = "SLURM_TPU_NVML_DOUBLE_DIR"


def build(out_dir: Path | str) -> Path:
    """Build ``libnvidia-ml.so.1`` (the double) in ``out_dir`` and make its default state directory
    (``state`` beside it, empty: a driver with no GPU yet); returns the library's path.

    Raises RuntimeError when no C compiler is available (callers skip the tests)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise RuntimeError("no C compiler (gcc/cc) on PATH: cannot build the NVML double")
    out = Path(out_dir) / LIBRARY
    out.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-pthread", "-o", str(out), str(SOURCE), "-ldl"],
        check=True,
        capture_output=True,
        text=True,
    )
    (out.parent / "state").mkdir(exist_ok=True)
    return out


def build_or_skip(tmp_path_factory) -> str:
    """The double built for a test module (pytest's ``tmp_path_factory``), or the test skipped where no C
    compiler can build it: the body of each module's ``library`` fixture."""
    import pytest

    try:
        return str(build(tmp_path_factory.mktemp("nvml")))
    except RuntimeError as exc:
        pytest.skip(str(exc))


def set_gpu(
    state_dir: Path | str,
    bus_id: str,
    energy_mj: int | None = None,
    power_mw: int | None = None,
    uuid: str | None = None,
    name: str | None = None,
    lost: bool = False,
    hang: bool = False,
) -> Path:
    """Write GPU ``bus_id``'s file in ``state_dir`` atomically (a reader sees the old or the new
    readings, never half); a reading left None is absent (NVML says NOT_SUPPORTED). Returns its path."""
    lines = []
    for key, value in (("energy_mj", energy_mj), ("power_mw", power_mw), ("uuid", uuid), ("name", name)):
        if value is not None:
            lines.append(f"{key}={value}")
    if lost:
        lines.append("lost=1")
    if hang:
        lines.append("hang=1")
    return _write_state(state_dir, bus_id, lines)


def remove_gpu(state_dir: Path | str, bus_id: str) -> None:
    """GPU ``bus_id`` falls off the bus: its file goes (NVML then says GPU_IS_LOST for it)."""
    (Path(state_dir) / bus_id).unlink()


def set_driver(state_dir: Path | str, init_delay_ms: int = 0, hang: bool = False, crash: bool = False) -> Path:
    """How the double's ``nvmlInit_v2`` misbehaves from now on (all off: as a sound driver): it waits
    ``init_delay_ms``, never returns (``hang``), or aborts its process (``crash``). Returns the file's path."""
    lines = []
    if init_delay_ms:
        lines.append(f"init_delay_ms={int(init_delay_ms)}")
    if hang:
        lines.append("hang=1")
    if crash:
        lines.append("crash=1")
    return _write_state(state_dir, "driver", lines)


def _write_state(state_dir: Path | str, name: str, lines: list[str]) -> Path:
    """The state file ``name`` with ``lines``, replaced atomically (a reader sees the old or the new
    one, never half); the temporary is a dot file, never taken for a GPU."""
    state = Path(state_dir)
    state.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{name}-", dir=state)
    with os.fdopen(fd, "w") as out:
        out.write("".join(line + "\n" for line in lines))
    target = state / name
    os.replace(temporary, target)
    return target
