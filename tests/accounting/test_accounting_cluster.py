"""A cluster with accounting owns its MariaDB and slurmdbd: found as its processes, ended by its stop().

The leftovers check (harness/localcluster/leftovers.py) must know both daemons: a
harness killed before stop() (its pid files lost) would otherwise leave a database
server and slurmdbd running for ever, unnoticed by the suite's end-of-run check.
"""

from __future__ import annotations

import os
import stat

import pytest

from harness.localcluster import leftovers
from helpers import TESTS

pytestmark = pytest.mark.slurm


def test_mariadb_and_slurmdbd_are_the_clusters_and_end_with_it(accounting_factory):
    from harness.localcluster import NodeSpec

    cluster = accounting_factory([NodeSpec("n1", str(TESTS / "isolation" / "hardware" / "n4_one_tpu.umockdev"))])
    daemons = cluster.running_pids()
    assert {"mariadbd", "slurmdbd"} <= set(daemons)
    # Private: its datadir under the base, slurmdbd.conf root's 0600, the server on 127.0.0.1 only.
    conf = os.stat(cluster.accounting_db.slurmdbd_conf)
    assert conf.st_uid == 0 and stat.S_IMODE(conf.st_mode) == 0o600
    with open(f"/proc/{daemons['mariadbd']}/cmdline", "rb") as handle:
        argv = handle.read().decode().split("\0")
    assert f"--datadir={cluster.base}/accounting/data" in argv and "--bind-address=127.0.0.1" in argv
    assert "--no-defaults" in argv  # never a site's /etc/mysql
    # The tracked TRES come from the node's Gres=.
    tres = cluster.command(["sacctmgr", "-n", "-P", "show", "tres", "format=type,name"]).stdout.split()
    assert {"gres|tpu", "gres|tpu:edgetpu_usb"} <= set(tres), tres
    # Both are found as the cluster's by what they name, even with their pid files gone.
    for name in ("mariadbd", "slurmdbd"):
        os.unlink(cluster.path("run", f"{name}.launcher.pid"))
    found = leftovers.processes_of([cluster.base])
    assert {daemons["mariadbd"], daemons["slurmdbd"]} <= set(found), found
    cluster.stop()
    assert leftovers.processes_of([cluster.base]) == {}
