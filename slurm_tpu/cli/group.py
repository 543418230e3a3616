"""The ``slurm-tpu`` click group, its exit codes and per-invocation state.

Apart from ``cli/__init__.py`` so that the command modules can import the group
they register on without importing the package that imports them.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import click

from .. import __version__
from ..defaults import CONFIG_ENV, CONFIG_PATH
from ..errors import SlurmTpuError

if TYPE_CHECKING:
    from ..config import Config  # imported lazily (Obj.config): start-up stays small

EXIT_DIFFERS = 1
EXIT_ERROR = 2


class _Group(click.Group):
    """A group that turns our errors into one line and exit status 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except SlurmTpuError as exc:
            click.echo(f"slurm-tpu: error: {exc}", err=True)
            ctx.exit(EXIT_ERROR)
        except KeyboardInterrupt:
            click.echo("slurm-tpu: interrupted", err=True)
            ctx.exit(130)


class Obj:
    """Per-invocation state: the --config path and the config, loaded once."""

    def __init__(self, config_path: str | None):
        self.config_path = config_path

    def node_name(self, node: str | None, from_slurmd: bool = False) -> str:
        """--node, else (for commands slurmd runs) $SLURMD_NODENAME, else the config's
        node_name, else the short hostname."""
        import os
        import socket

        slurmd = os.environ.get("SLURMD_NODENAME") if from_slurmd else None
        return node or slurmd or self.config.node_name or socket.gethostname().split(".")[0]

    @functools.cached_property
    def config(self) -> Config:  # imported lazily to keep start-up small
        from ..config import load_config

        return load_config(self.config_path)


# A command's ``obj`` parameter: this invocation's :class:`Obj`.
pass_obj = click.make_pass_decorator(Obj)


def table(rows: Sequence[Sequence[str]], numbers: bool = False) -> str:
    """``rows`` (the header first) in columns two spaces apart, the last one unpadded; with ``numbers``,
    every column but the first right-aligned (the tables of detect, leases and report)."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    last = len(widths) - 1

    def fit(i: int, cell: str) -> str:
        return cell.rjust(widths[i]) if numbers and i else cell if i == last else cell.ljust(widths[i])

    return "".join("  ".join(fit(i, cell) for i, cell in enumerate(row)) + "\n" for row in rows)


# Every option shows its default in its help ("[default: ...]"; none for an unset option or a flag off).
@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.version_option(__version__, prog_name="slurm-tpu")
@click.option(
    "--config",
    "config_path",
    metavar="FILE",
    envvar=CONFIG_ENV,
    help=f"Site config (YAML). Default: {CONFIG_PATH} if present; env {CONFIG_ENV}.",
)
@click.pass_context
def main(ctx: click.Context, config_path: str | None) -> None:
    """Make Edge TPUs, GPUs and Hailo NPUs allocatable, isolated Slurm resources.

    \b
    Install a node: install, doctor, uninstall
    Set up a node:  detect, gres-conf, node-conf, udev-rules, boot
    Operate:        health, watch, metrics, report, leases, accounting-collect
    In jobs:        infer, serve
    Run by udev:    udev-event (the installed rules run its -I -S twin,
                    PREFIX/libexec/slurm-tpu/slurm-tpu-udev-event)
    """
    ctx.obj = Obj(config_path)
    if ctx.invoked_subcommand is not None and not ctx.resilient_parsing:
        _ = ctx.obj.config  # a broken config is reported by every command, not just some
