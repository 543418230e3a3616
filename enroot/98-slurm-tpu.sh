#!/usr/bin/python3 -IS
"""enroot hook (as the job's user, before its container starts): the job's Edge TPUs in its container.

Installed by `slurm-tpu install` into enroot's hooks.d (<sysconfdir>/enroot/hooks.d), which
writes the _ROOT and _SETTINGS lines: where slurm_tpu is, the node's config, its libedgetpu,
its device root and sysfs. Everything else, the environment above all, is the job's and is not
trusted: see slurm_tpu/hooks/enroot.py. Runs isolated (-I) and without site-packages (-S).
"""
import os
import sys

_ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
_SETTINGS = {"config": "/etc/slurm-tpu/config.yaml", "libedgetpu": "", "dev": "/dev", "sys": "/sys"}
if os.path.isfile(os.path.join(_ROOT, "slurm_tpu", "__init__.py")):
    sys.path.insert(0, _ROOT)
try:
    from slurm_tpu.hooks.enroot import main
except ImportError:  # installed as a package: look in site-packages too
    import site

    site.main()
    from slurm_tpu.hooks.enroot import main

sys.exit(main(_SETTINGS))
