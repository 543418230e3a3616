"""The demo: a real Slurm cluster on this machine with simulated accelerators.

``python -m harness.demo`` (what ``./demo.sh`` runs after setting up) describes a
small heterogeneous cluster like the seeds' (a controller and four nodes: one USB
Edge TPU, two PCIe Edge TPUs, a GPU, a plain node), detects each node's hardware
through real libudev under umockdev, starts real munge/slurmctld/slurmd with the
generated gres.conf and the project's hooks, runs the seeds' experiment and a
batch array job with the scripts in ``jobs/``, serves a model from one node's TPU to
a client on another, prints what happened from Slurm's own records, and leaves the
cluster running.

Modules, one concern each:

- ``layout``     where everything lives, and the cluster's description
- ``preflight``  refusing to run: not root, tools missing, someone else's Slurm
- ``provision``  the job user, the job-side ``slurm-tpu``, libedgetpu double, models
- ``lifecycle``  start, reuse or restart the demo's own cluster; stop it
- ``experiment`` submitting the jobs and waiting for them
- ``records``    parsing Slurm's job records and the hooks' audit log
- ``timeline``   the per-node timeline and its properties (pure)
- ``report``     what the demo prints
"""
