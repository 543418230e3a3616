"""Who may reach a device node: the lease ledger, ownership changes, slot nodes,
the holder scan, revocation, the state directory and the node inventory's reader.

(Named for what it controls, device access; the runner's per-device lock files are
:mod:`slurm_tpu.runner.lock`, a different thing.)
"""
