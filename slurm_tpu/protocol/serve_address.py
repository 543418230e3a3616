"""The inference server's address file ``~/.slurm-tpu/serve/<job>.json``: ``slurm-tpu serve`` -> its clients.

One JSON object, ``{"job_id": "12", "url": "http://host:port", "token": "...", "node":
"n1", "pid": 4242}`` (``node`` and ``pid`` optional), written and read by the job's user
through :mod:`slurm_tpu.runner.serve.auth`, which owns the I/O.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from . import FormatError, json_object

DIR_PARTS = (".slurm-tpu", "serve")  # under $HOME
SUFFIX = ".json"  # <job id>.json


@dataclass(frozen=True)
class Address:
    """Where a job's server listens and the token it wants (the address file's content)."""

    job_id: str
    url: str  # http://host:port
    token: str
    node: str = ""
    pid: int = 0

    @property
    def host_port(self) -> str:
        return self.url.split("://", 1)[-1].rstrip("/")


def file_name(job_id: str) -> str:
    return f"{job_id}{SUFFIX}"


def encode(address: Address) -> bytes:
    import json

    return (json.dumps(asdict(address)) + "\n").encode()


def decode(raw: bytes, source: str) -> Address:
    """The address in ``raw``; :class:`FormatError` naming ``source`` for anything else."""
    data = json_object(raw, source)
    try:
        return Address(
            str(data["job_id"]),
            str(data["url"]),
            str(data["token"]),
            str(data.get("node", "")),
            int(data.get("pid", 0)),
        )
    except (KeyError, TypeError, ValueError):
        raise FormatError(f"{source} is not a server address file (JSON with job_id, url, token)", source) from None
