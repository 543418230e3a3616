"""A real Slurm cluster on this one machine, for tests and the demo.

munge (own socket and key), one slurmctld and several ``slurmd -N <name>`` on
127.0.0.1, all under one base directory. Each node's hardware is *simulated* at
the hardware boundary only: a umockdev description is detected by the real
``slurm-tpu detect`` (real libudev), its device nodes are made real with mknod
under the node's directory, and gres.conf / NodeName lines come from the
project's own ``gres-conf`` / ``node-conf``. Where the hooks need a driver's
behaviour, a small emulator plays it: the USB core's port ``disable``
(usbcore.py) and the apex driver's ``write_open_count`` over a pty node (apex.py).
Everything above that is real Slurm.
"""

from .cluster import LocalCluster, NodeSpec

__all__ = ["LocalCluster", "NodeSpec"]
