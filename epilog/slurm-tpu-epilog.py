#!/usr/bin/python3 -IS
"""Slurm Epilog= worker (root): release the job's accelerators; run by epilog/slurm-tpu-epilog.

Thin entry point into slurm_tpu.hooks.epilog. Runs isolated (-I) and without
site-packages (-S) so start-up stays in the milliseconds; site-packages are
added only if slurm_tpu is not next to this file or a config file needs PyYAML.
Generated from slurm_tpu/ops/hook_entries.py (the template of every hook's entry
script): edit it there, then run `python -m slurm_tpu.ops.hook_entries`.
"""
import os
import sys
import time

_WALL = time.time()  # for slurm_tpu.hooks.probe (off unless SLURM_TPU_HOOK_PROFILE is set)

_ROOT = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
if os.path.isfile(os.path.join(_ROOT, "slurm_tpu", "__init__.py")):
    sys.path.insert(0, _ROOT)
try:
    from slurm_tpu.hooks import probe

    probe.begin(os.environ, _WALL)
    from slurm_tpu.hooks.epilog import main
except ImportError:  # installed as a package: look in site-packages too
    import site

    site.main()
    from slurm_tpu.hooks import probe

    probe.begin(os.environ, _WALL)
    from slurm_tpu.hooks.epilog import main

probe.mark("imports")
sys.exit(main())
