"""A private MariaDB + slurmdbd for one LocalCluster: Slurm's own accounting (sacct, sreport, QOS limits).

Everything lives under ``<base>/accounting/`` and on two free ports of 127.0.0.1:
the database's datadir, socket, pid file and error log (in a directory owned by
``mysql``, which the server runs as), and ``<base>/etc/slurmdbd.conf``, which
slurmdbd finds beside ``SLURM_CONF``. Nothing here reads or touches a site's
``/etc/mysql``, ``/var/lib/mysql`` or ``/etc/slurm``: the server runs with
``--no-defaults`` and every path on its command line, so the cluster's leftovers
check finds it by its ``--datadir`` under the base (leftovers.py).

Facts this relies on (measured with Debian's MariaDB 10.11 and Slurm 22.05, and with
Slurm 25.11's own slurmdbd built against libmariadb):

- slurmdbd connects over TCP: ``StorageHost=localhost`` would make libmariadb take
  the default unix socket and ignore ``StoragePort``, so the host is ``127.0.0.1``
  and the database user is ``'slurm'@'127.0.0.1'`` with a password (root's
  ``unix_socket`` authentication is for local socket connections only).
- slurmdbd.conf must be 0600 and owned by ``SlurmUser`` (root here, the same user
  as slurmctld's, which slurmdbd requires of the controller's RPCs).
- ``AccountingStoragePass``/``AuthInfo`` name the cluster's private munge socket.
- slurmdbd must answer before slurmctld's first start: the controller registers
  its cluster with slurmdbd when it starts (and would otherwise queue its records).
- mariadbd refuses to create its socket, pid or log in a directory its user cannot
  write, so they live in the ``mysql``-owned ``<base>/accounting/run``.
- ``mariadb-install-db`` with the default InnoDB log makes a 114 MB datadir; with
  an 8 MB log and a 32 MB buffer pool it is 26 MB and takes about a second. Once
  slurmdbd made its tables it was 93 MB with InnoDB's default 64 MB growth steps of
  the system tablespace; with 4 MB steps (and a 4 MB temporary tablespace) about 40 MB.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Callable

DB_USER = "slurm"
DB_NAME = "slurm_acct_db"
MYSQL_USER = "mysql"  # Debian's mariadb-server makes it; the server runs as it
# Small enough that a test cluster costs ~26 MB of disk and little memory.
SERVER_OPTIONS = (
    "--innodb-log-file-size=8M",
    "--innodb-buffer-pool-size=32M",
    # the system tablespace grows by 64 MB at a time by default (77 MB for slurmdbd's tables)
    "--innodb-autoextend-increment=4",
    "--innodb-temp-data-file-path=ibtmp1:4M:autoextend",
    # slurmdbd warns below 900 s (long rollups wait on row locks)
    "--innodb-lock-wait-timeout=900",
    "--skip-name-resolve",
)
# What slurm.conf enforces when accounting is on: jobs need an association (user in an
# account), association and QOS limits hold, and `safe` refuses at submit a job that
# could not finish within a GrpTRESMins budget.
DEFAULT_ENFORCE = "associations,limits,qos,safe"


def free_port() -> int:
    """A TCP port of 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _port_answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


@dataclass
class AccountingDB:
    """MariaDB + slurmdbd owned by the cluster under ``base``.

    ``spawn(name, argv, user)`` and ``wait(predicate, timeout, what)`` are the
    cluster's own: daemons spawned through them are recorded beside its other
    daemons and stopped by its ``stop()``.
    """

    base: str
    cluster_name: str
    munge_socket: str
    slurmdbd: str  # the program, from the cluster's Slurm release
    enforce: str = DEFAULT_ENFORCE
    tres: Sequence[str] = ()  # AccountingStorageTRES entries beyond Slurm's default ones
    db_port: int = field(default_factory=free_port)
    dbd_port: int = field(default_factory=free_port)
    # A password only the cluster's root-owned slurmdbd.conf holds (the server listens on 127.0.0.1).
    password: str = field(default_factory=lambda: os.urandom(12).hex())

    def path(self, *parts: str) -> str:
        return os.path.join(self.base, "accounting", *parts)

    @property
    def socket(self) -> str:
        return self.path("run", "mysql.sock")

    @property
    def slurmdbd_conf(self) -> str:
        return os.path.join(self.base, "etc", "slurmdbd.conf")

    # ---- configuration ---------------------------------------------------------
    def configure(self) -> None:
        """Make the datadir (``mariadb-install-db``) and write slurmdbd.conf (0600, root)."""
        top = self.path()
        if os.path.isdir(top):
            shutil.rmtree(top)
        os.makedirs(top, mode=0o755)
        for sub in ("data", "run"):
            os.mkdir(self.path(sub), 0o750)
            shutil.chown(self.path(sub), MYSQL_USER, MYSQL_USER)
        completed = subprocess.run(
            [
                "mariadb-install-db",
                "--no-defaults",
                f"--datadir={self.path('data')}",
                f"--user={MYSQL_USER}",
                "--auth-root-authentication-method=socket",
                "--skip-test-db",
                *SERVER_OPTIONS,
            ],
            capture_output=True,
            text=True,
            check=False,
            stdin=subprocess.DEVNULL,
            timeout=300,
        )
        if completed.returncode != 0:
            raise RuntimeError(
                f"mariadb-install-db failed ({completed.returncode}): "
                f"{(completed.stderr or completed.stdout).strip()[-2000:]}"
            )
        lines = [
            "# Generated by harness.localcluster.accounting_db",
            "AuthType=auth/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "DbdHost=localhost",
            "DbdAddr=127.0.0.1",
            f"DbdPort={self.dbd_port}",
            "SlurmUser=root",
            "DebugLevel=info",
            f"LogFile={os.path.join(self.base, 'log', 'slurmdbd.log')}",
            f"PidFile={os.path.join(self.base, 'run', 'slurmdbd.pid')}",
            "StorageType=accounting_storage/mysql",
            "StorageHost=127.0.0.1",  # not localhost: that takes the default socket, ignoring StoragePort
            f"StoragePort={self.db_port}",
            f"StorageUser={DB_USER}",
            f"StoragePass={self.password}",
            f"StorageLoc={DB_NAME}",
        ]
        fd = os.open(self.slurmdbd_conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            os.fchmod(handle.fileno(), 0o600)  # slurmdbd refuses a readable one
            handle.write("\n".join(lines) + "\n")

    def slurm_conf_lines(self) -> list[str]:
        """What slurm.conf says so that slurmctld records jobs through this slurmdbd."""
        lines = [
            "AccountingStorageType=accounting_storage/slurmdbd",
            "AccountingStorageHost=127.0.0.1",
            f"AccountingStoragePort={self.dbd_port}",
            f"AccountingStoragePass={self.munge_socket}",  # the cluster's munged, not the site's
            f"AccountingStorageEnforce={self.enforce}",
        ]
        if self.tres:
            lines.append(f"AccountingStorageTRES={','.join(self.tres)}")
        return lines

    # ---- processes -------------------------------------------------------------
    def start(self, spawn: Callable[..., None], wait: Callable[..., None], run: Callable[..., object]) -> None:
        """Start MariaDB, make slurmdbd's database user, start slurmdbd; return once it answers.

        ``run(argv, check=...)`` runs a command with the cluster's environment.
        """
        spawn(
            "mariadbd",
            [
                "/usr/sbin/mariadbd",
                "--no-defaults",
                f"--datadir={self.path('data')}",
                f"--socket={self.socket}",
                f"--pid-file={self.path('run', 'mariadbd.pid')}",
                f"--log-error={self.path('run', 'mariadbd.err')}",
                f"--port={self.db_port}",
                "--bind-address=127.0.0.1",
                *SERVER_OPTIONS,
            ],
            user=MYSQL_USER,
        )
        wait(lambda: os.path.exists(self.socket), 60, "MariaDB did not create its socket")
        # The password goes on stdin, never on a command line (visible in /proc to every user).
        sql = (
            f"CREATE USER IF NOT EXISTS '{DB_USER}'@'127.0.0.1' IDENTIFIED BY '{self.password}';\n"
            f"GRANT ALL ON {DB_NAME}.* TO '{DB_USER}'@'127.0.0.1';\n"
        )
        self._wait_sql(sql, wait)
        spawn("slurmdbd", [self.slurmdbd, "-D"])
        wait(lambda: _port_answers(self.dbd_port), 90, "slurmdbd did not listen")

    def _wait_sql(self, sql: str, wait: Callable[..., None]) -> None:
        """Run ``sql`` as the server's root over its socket (retried: the socket appears before it serves)."""
        last: list[str] = []

        def attempt() -> bool:
            completed = subprocess.run(
                ["mariadb", "--no-defaults", f"--socket={self.socket}", "--user=root"],
                input=sql,
                capture_output=True,
                text=True,
                check=False,
                timeout=60,
            )
            last[:] = [completed.stderr.strip()]
            return completed.returncode == 0

        try:
            wait(attempt, 60, "MariaDB did not accept slurmdbd's user")
        except RuntimeError as exc:
            raise RuntimeError(f"{exc}: {last[0] if last else ''}") from None
