"""An AMD GPU's power from its hwmon sensor file (``power1_average``, µW; ``power1_input`` on newer
kernels), read by the node agent's sampler for the ``hwmon-power`` source.

sysfs reaches a device's hwmon directory through links (``/sys/class/drm/card0/device`` is one),
so the path is resolved, and a path that resolves outside the sysfs root (a link planted in a
testbed, a configured path that is not sysfs) is refused, as is a final component that is a link
or not a power file. A file that is gone (the GPU unbound) or does not hold a number reads None.
"""

from __future__ import annotations

import os
import stat

from ..defaults import SYSFS_ROOT
from ..protocol.energy import MAX_WATTS


def _is_power_file(name: str) -> bool:
    """``power<N>_average`` or ``power<N>_input`` (hwmon's sysfs interface, in µW)."""
    stem, sep, kind = name.partition("_")
    return bool(sep) and kind in ("average", "input") and stem.startswith("power") and stem[5:].isdigit()


def power_w(path: str, root: str = SYSFS_ROOT) -> float | None:
    """The watts in hwmon power file ``path`` (µW), or None when it is absent, unreadable, not a
    number, or not a power file under ``root`` (sysfs, or a test's tree) once resolved."""
    if not os.path.isabs(path) or not _is_power_file(os.path.basename(path)):
        return None
    real_root = os.path.realpath(root)
    # The directories resolved (sysfs's own links), the file itself never followed (O_NOFOLLOW).
    real = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
    if os.path.commonpath([real_root, real]) != real_root:
        return None
    try:
        fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        # One read: sysfs makes an attribute's whole text at the first read (at most a page).
        microwatts = int(os.read(fd, 64).strip())
    except (OSError, ValueError):
        return None
    finally:
        os.close(fd)
    watts = microwatts / 1.0e6
    return watts if 0 <= watts <= MAX_WATTS else None
