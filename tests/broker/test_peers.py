"""pid -> job (access/processes.py pid_in_job) on real processes whose cgroup or ancestry the test controls."""

from __future__ import annotations

import os
import shutil
import subprocess

from slurm_tpu.access import processes


def test_a_process_in_a_root_owned_job_cgroup_belongs_to_that_job_only(cgroups):
    child = subprocess.Popen(cgroups.command(91, ["sleep", "60"]))
    try:
        wait = 0
        while 91 not in processes.cgroup_job_ids(child.pid) and wait < 500:  # the sh execs sleep after joining
            wait += 1
            os.sched_yield()
        assert processes.pid_in_job(child.pid, 91)
        assert not processes.pid_in_job(child.pid, 92)
    finally:
        child.kill()
        child.wait()


def test_a_user_owned_job_cgroup_proves_nothing(cgroups, users):
    directory = cgroups.path(93)
    os.chown(directory, users[sorted(users)[0]], -1)  # as a delegated subtree would be
    child = subprocess.Popen(cgroups.command(93, ["sleep", "60"]))
    try:
        assert not processes.pid_in_job(child.pid, 93, known=set())
    finally:
        child.kill()
        child.wait()
        os.chown(directory, 0, -1)


def test_a_descendant_of_the_jobs_slurmstepd_belongs_to_it(tmp_path):
    stepd = tmp_path / "slurmstepd"
    shutil.copy("/bin/sh", stepd)
    known = {(os.stat(stepd).st_dev, os.stat(stepd).st_ino)}
    # argv[0] as slurmstepd titles itself; its child is the job's task
    parent = subprocess.Popen(["bash", "-c", f'exec -a "slurmstepd: [94.0]" {stepd} -c "sleep 60 & wait"'])
    try:
        child = None
        for _ in range(10000):
            kids = open(f"/proc/{parent.pid}/task/{parent.pid}/children").read().split()
            if kids:
                child = int(kids[0])
                break
            os.sched_yield()
        assert child is not None
        assert processes.pid_in_job(child, 94, known=known)
        assert not processes.pid_in_job(child, 95, known=known)
        other = os.stat("/bin/true")  # the node's real slurmstepd is another file: the title proves nothing
        assert not processes.pid_in_job(child, 94, known={(other.st_dev, other.st_ino)})
    finally:
        parent.kill()
        parent.wait()
