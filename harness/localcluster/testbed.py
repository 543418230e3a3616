"""Run a command inside a umockdev testbed, with extra /proc and /dev files.

umockdev's device files describe sysfs and udev; files that no udev device
announces (the NVIDIA driver's /proc/driver/nvidia/gpus/*/information, its
/dev/nvidiaN nodes) are copied from a ``<name>.extra/`` tree into the testbed
before the command starts, so the program under test reads them through the same
redirection.  Usage (inside ``umockdev-run``)::

    python -m harness.localcluster.testbed EXTRA_DIR -- COMMAND ARGS...

A missing EXTRA_DIR is allowed (nothing is copied).
"""

import os
import shutil
import sys


def main() -> None:
    separator = sys.argv.index("--")
    extra, command = sys.argv[1], sys.argv[separator + 1 :]
    root = os.environ["UMOCKDEV_DIR"]
    if os.path.isdir(extra):
        shutil.copytree(extra, root, dirs_exist_ok=True)
    os.execvp(command[0], command)


if __name__ == "__main__":
    main()
