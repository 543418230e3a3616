"""Slurm and udev hooks: prolog, epilog, task-prolog, udev event.

They run as root on every job, so they import little (no click, pyudev,
json, re, dataclasses, typing, enum or subprocess per job; yaml only when the
settings snapshot must be rebuilt, see settings.py: tests/test_hooks_import_budget.py
measures it), ask Slurm at most once (the prolog, and only
on nodes with leasable devices), never hand job-controlled strings to a shell,
never follow symlinks in the state directory, and only touch device nodes the
node's inventory file lists. The task-prolog is a POSIX sh script
(prolog/slurm-tpu-task-prolog) printing what the prolog prepared (protocol/envfile.py).
Each entry point returns an exit status; messages are one line each.
"""
