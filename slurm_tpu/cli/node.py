"""Node set-up commands: install, uninstall, doctor."""

from __future__ import annotations

import json
import os
import sys

import click

from ..defaults import PREFIX, SYSCONFDIR
from .group import EXIT_DIFFERS, Obj, main, pass_obj
from .options import libedgetpu_option, node_option, options

# --prefix and --sysconfdir: install, uninstall and doctor must agree on them.
layout_options = options(
    click.option(
        "--prefix",
        default=PREFIX,
        metavar="DIR",
        help="The hooks are in DIR/libexec/slurm-tpu (root-owned; slurm.conf names them there).",
    ),
    click.option(
        "--sysconfdir",
        default=SYSCONFDIR,
        metavar="DIR",
        help="udev rules, systemd units and the slurm-tpu config are under DIR (udev and systemd "
        "read only /etc; another DIR is for staging and tests).",
    ),
)
_slurm_conf_option = click.option(
    "--slurm-conf",
    metavar="FILE",
    help="The node's slurm.conf (default: $SLURM_CONF, else the running slurmd's, else /etc/slurm/slurm.conf).",
)


def _slurm_conf(given: str | None) -> str:
    from ..slurm.installation import slurm_conf

    return given or slurm_conf()


@main.command()
@layout_options
@click.option("--dry-run", is_flag=True, help="Print what would be done; change nothing.")
@_slurm_conf_option
@click.option(
    "--libedgetpu",
    metavar="FILE",
    help="Install this libedgetpu.so.1 (built by scripts/build-libedgetpu.sh: it shows each job only "
    "its own Edge TPUs through EDGETPU_VISIBLE_DEVICES) as the node's Edge TPU runtime.",
)
@click.option(
    "--libdir",
    metavar="DIR",
    help="Where --libedgetpu goes (default: /usr/lib/<multiarch>, where "
    "Coral's libedgetpu1-std puts its own, which it replaces).",
)
@click.option(
    "--enroot-config",
    metavar="DIR",
    help="enroot's system config directory, whose hooks.d gets the enroot hook (default: SYSCONFDIR/enroot, "
    "where enroot's packages put it; scripts/build-containers.sh's: /opt/enroot-<version>/etc/enroot).",
)
@pass_obj
def install(
    obj: Obj,
    prefix: str,
    sysconfdir: str,
    dry_run: bool,
    slurm_conf: str | None,
    libedgetpu: str | None,
    libdir: str | None,
    enroot_config: str | None,
) -> None:
    """Put this node's pieces in place (as root): hooks, udev rules, systemd units, config skeleton.

    \b
    DIR/libexec/slurm-tpu/   Prolog, Epilog, TaskProlog, HealthCheckProgram and the
                             udev hook (root's, run by this Python with -I -S); with
                             a C compiler, the hooks' C client and their -native
                             entries (the same hooks without a shell)
    SYSCONFDIR/udev/rules.d/60-slurm-tpu.rules        (then udev is reloaded; its RUN+=
                             names DIR/libexec/slurm-tpu/slurm-tpu-udev-event)
    SYSCONFDIR/systemd/system/slurm-tpu-*, slurmd.service.d/slurm-tpu.conf
    SYSCONFDIR/slurm-tpu/config.yaml                  (only if there is none)
    LIBDIR/libedgetpu.so.1.0, libedgetpu.so.1        (with --libedgetpu; Coral's own
                             file is kept aside and put back by uninstall)
    ENROOT/hooks.d/98-slurm-tpu.sh                    (where enroot's config directory is:
                             Pyxis containers get the job's devices and the node's libedgetpu)

    Then prints the slurm.conf lines still to add (or says they are there).
    Running it again changes only what differs; `slurm-tpu uninstall` undoes it.
    """
    from ..ops.install import Layout, device_cgroup_note, install as run_install, layout_config

    layout = Layout(prefix, sysconfdir, libdir or "", enroot_config or "")
    config = layout_config(layout, obj.config_path)
    conf = _slurm_conf(slurm_conf)
    prefix_word = "would: " if dry_run else ""
    result = run_install(
        layout, config, conf, dry_run, say=lambda line: click.echo(prefix_word + line), libedgetpu=libedgetpu
    )
    if result.missing_lines:
        where = conf if result.slurm_conf_read else f"slurm.conf ({conf} cannot be read here)"
        click.echo(f"\nAdd to {where} on every node and the controller, then `scontrol reconfigure`:")
        for line in result.missing_lines:
            click.echo(f"  {line}")
    else:
        click.echo(f"\n{conf} has slurm-tpu's lines.")
    note = device_cgroup_note(config, conf)
    if note:
        click.echo(note)
    if layout.is_system and not dry_run:
        from ..ops.cdi import install_cdi_note

        install_cdi_note(config, click.echo)
    gres_dir = os.path.dirname(conf)
    click.echo(
        f"Then, on this node: slurm-tpu gres-conf --output {gres_dir}/gres.conf; "
        f"slurm-tpu node-conf --output {gres_dir}/nodes.conf; slurm-tpu doctor"
    )


@main.command()
@layout_options
@click.option("--purge", is_flag=True, help="Also remove the config install wrote (kept by default).")
@click.option("--dry-run", is_flag=True, help="Print what would be done; change nothing.")
def uninstall(prefix: str, sysconfdir: str, purge: bool, dry_run: bool) -> None:
    """Undo `slurm-tpu install` exactly (from its manifest), keeping the config unless --purge.

    Files install replaced get their previous version back; files changed since
    install are left in place and named. Remove slurm-tpu's lines from slurm.conf first.
    """
    from ..ops.install import Layout, uninstall as run_uninstall

    prefix_word = "would: " if dry_run else ""
    kept = run_uninstall(Layout(prefix, sysconfdir), purge, dry_run, say=lambda line: click.echo(prefix_word + line))
    for line in kept:
        click.echo(f"kept {line}")


@main.command()
@layout_options
@_slurm_conf_option
@node_option()
@click.option(
    "--inventory",
    "saved",
    metavar="FILE",
    help="Check against a saved `slurm-tpu detect --json` document instead of detecting.",
)
@libedgetpu_option("The libedgetpu.so.1 jobs load")
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@pass_obj
def doctor(
    obj: Obj,
    prefix: str,
    sysconfdir: str,
    slurm_conf: str | None,
    node: str | None,
    saved: str | None,
    libedgetpu: str | None,
    as_json: bool,
) -> None:
    """Check this node end to end; one line per check, each problem with its fix.

    slurm.conf names slurm-tpu's hooks (installed, root's, not writable by others);
    GresTypes; gres.conf block and NodeName Gres=/Feature= against the hardware;
    udev rules installed and applied (idle devices root 0600); the state directory;
    the hooks import slurm-tpu under python -I -S; slurmd is a tested release;
    libedgetpu, a TFLite runtime and Vulkan where the node has TPUs/GPUs; munge.
    Exit 0 only when every check passes (1: problems). Root or not.
    """
    from ..ops.doctor import Node, as_json as findings_json, diagnose
    from ..ops.install import Layout, layout_config
    from .inventory import _inventory

    layout = Layout(prefix, sysconfdir)
    config = layout_config(layout, obj.config_path)
    name = node or config.node_name or obj.node_name(None)
    findings = diagnose(Node(config, layout, _slurm_conf(slurm_conf), name, _inventory(saved), libedgetpu))
    if as_json:
        click.echo(json.dumps(findings_json(findings), indent=2))
    else:
        for finding in findings:
            click.echo(finding.line())
        problems = sum(not f.ok for f in findings)
        click.echo(f"{problems} problem(s)" if problems else f"all {len(findings)} checks pass")
    if not all(f.ok for f in findings):
        sys.exit(EXIT_DIFFERS)
