"""Compile the libedgetpu test double (edgetpu_double.c) with gcc."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

SOURCE = Path(__file__).with_name("edgetpu_double.c")


def build_double(out_dir: Path, ignores_visible: bool = False) -> Path:
    """Build ``libedgetpu.so.1`` (the double) in ``out_dir``; returns its path.

    ``ignores_visible``: a double of Coral's own library, which knows no EDGETPU_VISIBLE_DEVICES.

    Raises RuntimeError when no C compiler is available (callers skip the tests).
    """
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise RuntimeError("no C compiler (gcc/cc) on PATH: cannot build the libedgetpu double")
    out = Path(out_dir) / "libedgetpu.so.1"
    flags = ["-DEDGETPU_DOUBLE_IGNORES_VISIBLE"] if ignores_visible else []
    subprocess.run(
        [cc, "-shared", "-fPIC", "-O1", "-Wall", "-Werror", *flags, "-o", str(out), str(SOURCE)],
        check=True,
        capture_output=True,
        text=True,
    )
    return out
