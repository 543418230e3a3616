"""Build hook: the wheel carries the node's files, so ``pip install slurm-tpu`` is the whole install.

``prolog/``, ``epilog/``, ``udev/``, ``systemd/`` and ``slurm_conf/`` stay at the top of
the repository: they are the source of truth, and a checkout's slurm.conf can name its
hooks there.
Every build (wheel, or a wheel built from the sdist) copies them into the package
as ``slurm_tpu/node_files/<dir>/``, where ``slurm_tpu.ops.node_files`` finds them
and ``slurm-tpu install`` takes them from. MANIFEST.in puts them into the sdist.
Everything else about the package is in pyproject.toml.
"""

import os

from setuptools import setup
from setuptools.command.build_py import build_py

# = slurm_tpu.ops.node_files.NODE_DIRS
NODE_DIRS = ("prolog", "epilog", "udev", "systemd", "slurm_conf", "hook_client", "enroot")
PACKAGE_DIR = os.path.join("slurm_tpu", "node_files")


def _node_files():
    """(source, path inside the package) of every shipped file, sorted."""
    for directory in NODE_DIRS:
        for name in sorted(os.listdir(directory)):
            source = os.path.join(directory, name)
            # slurm-tpu-hook-client and the hooks' native entries (<hook>-native, links to it): built
            # from its .c on the node (slurm_tpu/ops/hook_client.py), never shipped.
            if (
                os.path.isfile(source)
                and not name.endswith((".pyc", "~"))
                and name != "slurm-tpu-hook-client"
                and not name.endswith((".tmp", "-native"))
            ):
                yield source, os.path.join(PACKAGE_DIR, directory, name)


class BuildPyWithNodeFiles(build_py):
    """build_py, plus the node's files copied (modes kept) into the built package."""

    def run(self):
        super().run()
        if self.editable_mode:  # an editable install finds them in the checkout itself
            return
        for source, target in _node_files():
            destination = os.path.join(self.build_lib, target)
            self.mkpath(os.path.dirname(destination))
            self.copy_file(source, destination, preserve_mode=True)

    def get_outputs(self, include_bytecode=True):
        outputs = super().get_outputs(include_bytecode)
        if self.editable_mode:
            return outputs
        return outputs + [os.path.join(self.build_lib, target) for _, target in _node_files()]


setup(cmdclass={"build_py": BuildPyWithNodeFiles})
