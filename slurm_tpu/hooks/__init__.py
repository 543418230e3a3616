"""Slurm and udev hooks: prolog, epilog, task-prolog, udev event.

They run as root on every job (the task-prolog as the job's user), so they
import little (no click, pyudev or yaml unless a config file exists), ask Slurm
at most once (the prolog, and only on nodes with leasable devices), never hand
job-controlled strings to a shell, never follow symlinks in the state
directory, and only touch device nodes the node's inventory file lists.
Each entry point returns an exit status; messages are one line each.
"""
