"""A job's energy on its accelerators, read from the devices: NVIDIA's NVML (``nvml``: the energy
counter and power), AMD's hwmon power file (``hwmon``), and the node agent's power sampler
(``sampler``), which integrates polled power for devices without a counter.

The vocabulary (methods, start and poll files) is :mod:`slurm_tpu.protocol.energy`. These modules
are imported by root hooks: nothing happens at import time, and each imports only the standard
library's cheapest modules at module level (ctypes inside the function that loads NVML).
"""
