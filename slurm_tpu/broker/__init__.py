"""The TPU broker: one root process per node that owns the node's shared Edge TPUs and runs
every shard job's inferences on them, fairly by shares (issue 32; files and frames:
:mod:`slurm_tpu.protocol.broker_wire`).

- :mod:`.scheduler`: which job's request a device runs next (start-time fair queuing). Pure.
- :mod:`.models`: the models jobs loaded, by sha256, and who refers to each.
- :mod:`.executor`: one thread per device running the runner's InterpreterEngine.
- :mod:`.state`: the broker's directories, grant files and figure files (never a symlink followed).
- :mod:`.peers`: who is at the other end of a connection (SO_PEERCRED, the peer's job).
- :mod:`.server`: the control socket and the jobs' endpoints.
- ``python -m slurm_tpu.broker``: :mod:`.__main__`.
"""
