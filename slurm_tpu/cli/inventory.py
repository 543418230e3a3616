"""Admin commands: detect, gres-conf, node-conf, udev-rules, cdi."""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING

import click

from ..defaults import PREFIX
from ..errors import SlurmTpuError
from ..families import inventory_from_json
from ..hardware import Inventory
from .group import EXIT_DIFFERS, Obj, main, pass_obj, table
from .options import libedgetpu_option, node_option, options

if TYPE_CHECKING:
    from ..config import Config


def _inventory(saved: str | None = None) -> Inventory:
    """Detect this node's hardware, or load a saved ``detect --json`` document."""
    if saved is None:
        from ..detect import detect_inventory

        return detect_inventory()
    try:
        with open(saved, encoding="utf-8") as handle:
            return inventory_from_json(json.load(handle))
    except OSError as exc:
        raise SlurmTpuError(f"cannot read inventory {saved}: {exc.strerror}") from exc
    except (ValueError, KeyError, TypeError) as exc:
        raise SlurmTpuError(
            f"inventory {saved} is not the output of `slurm-tpu detect --json` "
            f"({type(exc).__name__}: {exc}); regenerate it"
        ) from exc


def format_table(
    inventory: Inventory, shares: Mapping[str, tuple[str, int]] | None = None, config: Config | None = None
) -> str:
    """The human-readable ``detect`` table; ``shares``: identity -> (shard GRES, shares) of the
    devices the config shares (their status says so); ``config``: the site's, for what a family
    says of a device under it (Family.status_notes)."""
    from ..families import family

    if not len(inventory):
        from ..families import FAMILIES

        kinds = ", ".join(f"{f.title}s" for f in FAMILIES)
        return f"No accelerators found on this node (looked for: {kinds}).\n"
    rows = [("IDENTITY", "KIND", "MODEL", "DEVICE NODE", "NUMA", "STATUS")]
    for a in inventory:
        numa = "-" if a.numa_node is None else str(a.numa_node)
        shared = (shares or {}).get(a.identity)
        notes = [f"shared: {shared[1]} shares of {shared[0]}"] if shared else []
        if config is not None and a.usable:
            notes += family(a.kind).status_notes(config.family(a.kind), a)
        status = ", ".join(["ok", *notes, *a.details.notes()]) if a.usable else f"UNUSABLE: {a.reason}"
        rows.append((a.identity, a.kind, a.model, a.primary_node or "-", numa, status))
    usable = len(inventory.usable())
    return table(rows) + f"{len(inventory)} accelerator(s), {usable} usable, {len(inventory) - usable} unusable\n"


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print the inventory (or the runtime check) as JSON.")
@click.option(
    "--check-runtime",
    is_flag=True,
    help="Also ask libedgetpu which Edge TPUs it sees (it lists, never opens) and report where it "
    "disagrees with this inventory; exit 1 when it does.",
)
@libedgetpu_option("libedgetpu.so.1 for --check-runtime")
@pass_obj
def detect(obj: Obj, as_json: bool, check_runtime: bool, libedgetpu: str | None) -> None:
    """List this node's accelerators (Edge TPUs, GPUs, Hailo NPUs...) through libudev (and NVML when
    present), and which of them the config shares (families.<kind>.shared) with how many shares."""
    from ..render import shared_devices

    inventory = _inventory()
    shares = {s.accelerator.identity: (s.gres_name, s.shares) for s in shared_devices(inventory, obj.config)}
    if check_runtime:
        from ..ops.edgetpu_runtime import check_runtime as run_check

        check = run_check(inventory, libedgetpu)
        click.echo(json.dumps(check.as_dict(), indent=2) if as_json else check.text(), nl=as_json)
        if not check.agrees:
            sys.exit(EXIT_DIFFERS)
    elif as_json:
        document = inventory.to_json()
        for item in document["accelerators"]:  # only a shared device has the key (gres, shares)
            if item["identity"] in shares:
                gres, count = shares[item["identity"]]
                item["shared"] = {"gres": gres, "shares": count}
        click.echo(json.dumps(document, indent=2))
    else:
        click.echo(format_table(inventory, shares, obj.config), nl=False)


def _emit_block(kind: str, node: str, body: str, output: str | None, diff: bool, check: bool) -> None:
    """Print, diff, check or write a node's managed block (see files.py)."""
    from ..files import changed_lines, merge_block, read_text, render_block, unified_diff, write_if_changed

    if output is None:
        if diff or check:
            raise click.UsageError("--diff and --check compare against a file: add --output FILE")
        click.echo(render_block(kind, node, body), nl=False)
        return
    old = read_text(output)
    new = merge_block(old, kind, node, body, path=output)
    if diff:
        click.echo(unified_diff(old, new, output), nl=False)
    if check and old != new:
        changed = changed_lines(old, new, output)
        message = f"{output} differs from this node's hardware ({changed} line(s)); rerun without --check to update it"
        click.echo(f"slurm-tpu: {message}", err=True)
        sys.exit(EXIT_DIFFERS)
    if diff or check:
        return
    result = write_if_changed(output, new)
    if result.changed:
        backup = f" (previous version in {result.backup})" if result.backup else ""
        click.echo(f"wrote {output}{backup}", err=True)
    else:
        click.echo(f"{output} is up to date", err=True)


# gres-conf and node-conf: which node, and where its block goes.
_with_output_options = options(
    node_option(),
    click.option(
        "--output",
        "-o",
        metavar="FILE",
        help="Update this node's block in FILE (atomic, with a .slurm-tpu.bak backup; "
        "other lines are kept). Default: print to stdout.",
    ),
    click.option("--diff", is_flag=True, help="Show what would change in --output FILE; write nothing."),
    click.option(
        "--check",
        is_flag=True,
        help="Exit 1 if --output FILE differs from the hardware; write nothing (for health checks).",
    ),
    click.option(
        "--inventory",
        "saved",
        metavar="FILE",
        help="Use a saved `slurm-tpu detect --json` document instead of detecting "
        "(e.g. to generate another node's lines centrally).",
    ),
)


@main.command("gres-conf")
@_with_output_options
@pass_obj
@click.option(
    "--no-slots",
    is_flag=True,
    help="Create no slot nodes and save no inventory (when writing a file for another node).",
)
def gres_conf(
    obj: Obj, node: str | None, output: str | None, diff: bool, check: bool, saved: str | None, no_slots: bool
) -> None:
    """Render gres.conf lines for this node's usable accelerators.

    Edge TPUs and Hailo NPUs are named by stable slot nodes (<slot_dir>/<identity>) that survive
    USB re-enumeration and unplugging. Writing --output (as root) creates them and saves the
    inventory the hooks and `slurm-tpu boot` read, unless --no-slots.
    """
    from ..render import render_gres_conf

    config = obj.config
    inventory = _inventory(saved)
    name = obj.node_name(node)
    if output and not (diff or check or no_slots):
        # Slot nodes and the hooks' inventory first: slurmd exits on a File= that does not exist.
        from ..ops.configure import prepare_node_state

        prepare_node_state(config, inventory)
    _emit_block("gres", name, render_gres_conf(inventory, config, name), output, diff, check)


@main.command("node-conf")
@_with_output_options
@click.option(
    "--set",
    "settings",
    multiple=True,
    metavar="KEY=VALUE",
    help="Extra NodeName attribute, e.g. --set NodeAddr=10.0.0.5 (repeatable).",
)
@click.option(
    "--slurmd",
    metavar="PATH",
    help="slurmd binary for `slurmd -C` (default: the node's Slurm, see slurm.sbin_dir in the config).",
)
@click.option("--no-hardware", is_flag=True, help="Leave out CPUs/RealMemory (do not run slurmd -C).")
@pass_obj
def node_conf(
    obj: Obj,
    node: str | None,
    output: str | None,
    diff: bool,
    check: bool,
    saved: str | None,
    settings: tuple[str, ...],
    slurmd: str | None,
    no_hardware: bool,
) -> None:
    """Render this node's slurm.conf NodeName line (hardware, Gres=, Feature=)."""
    from ..render import render_node_line
    from ..slurm.commands import Slurm

    extra = {}
    for setting in settings:
        key, sep, value = setting.partition("=")
        if not sep or not key or not value or any(c.isspace() for c in setting):
            raise click.BadParameter(f"'{setting}' is not KEY=VALUE", param_hint="--set")
        extra[key] = value
    hardware = None
    if not no_hardware:
        try:
            hardware = Slurm.for_config(obj.config).hardware(slurmd)
        except SlurmTpuError as exc:
            raise type(exc)(
                f"{exc} (or pass --no-hardware to leave CPUs/RealMemory out)", getattr(exc, "command", "slurmd")
            ) from exc
    name = obj.node_name(node)
    inventory = _inventory(saved)
    line = render_node_line(inventory, obj.config, name, hardware, extra)
    _emit_block("node", name, line, output, diff, check)
    if not (diff or check):
        from ..ops.install import accounting_tres_line

        # Slurm's accounting sees (and limits) only the GRES listed there: say what this node needs.
        for needed in accounting_tres_line(inventory, obj.config):
            click.echo(f"slurm.conf, where slurmdbd records jobs, needs: {needed}", err=True)


@main.command("udev-rules")
@click.option(
    "--output",
    "-o",
    metavar="FILE",
    help="Write the rules file (atomic, with backup; e.g. /etc/udev/rules.d/60-slurm-tpu.rules).",
)
@click.option(
    "--run-program",
    metavar="PATH",
    help="Absolute path udev runs on device events (default: config udev.run_program, else "
    "PREFIX/libexec/slurm-tpu/slurm-tpu-udev-event, which `slurm-tpu install` puts there). "
    "A program named slurm-tpu is run as `slurm-tpu udev-event`.",
)
@click.option(
    "--prefix",
    default=PREFIX,
    metavar="DIR",
    help="Where `slurm-tpu install --prefix` put the hooks (DIR/libexec/slurm-tpu).",
)
@pass_obj
def udev_rules(obj: Obj, output: str | None, run_program: str | None, prefix: str) -> None:
    """Render udev rules: idle ownership and the device-event hook.

    Every event on an accelerator runs the udev hook, by default the -I -S
    slurm-tpu-udev-event that `slurm-tpu install` puts beside the Prolog (the same
    work as `slurm-tpu udev-event`, without the CLI's start-up).
    """
    from ..files import write_if_changed
    from ..ops.install import Layout, udev_run_program
    from ..render import render_udev_rules

    text = render_udev_rules(obj.config, udev_run_program(Layout(prefix=prefix), obj.config, run_program))
    if output is None:
        click.echo(text, nl=False)
        return
    result = write_if_changed(output, text)
    click.echo(f"wrote {output}" if result.changed else f"{output} is up to date", err=True)


@main.command("cdi")
@click.option(
    "--output",
    "-o",
    metavar="DIR",
    help="Write the specs into DIR (e.g. /var/run/cdi: slurm-tpu-<kind>.json, atomic, with a "
    ".slurm-tpu.bak backup, untouched when unchanged; ours for families with no device here are "
    "removed). Default: print them as one JSON object (file name -> spec).",
)
@click.option(
    "--inventory",
    "saved",
    metavar="FILE",
    help="Use a saved `slurm-tpu detect --json` document instead of detecting.",
)
@click.option(
    "--libedgetpu",
    metavar="PATH",
    help="The node's libedgetpu.so.1 the containers get (default: /usr/lib/<multiarch>/libedgetpu.so.1, "
    "where `install --libedgetpu` puts the patched one, when it exists).",
)
@click.option(
    "--dev-root",
    default="/dev",
    show_default=True,
    metavar="DIR",
    help="Where the inventory's device nodes live; containers see them under /dev.",
)
@pass_obj
def cdi(obj: Obj, output: str | None, saved: str | None, libedgetpu: str | None, dev_root: str) -> None:
    """Render this node's CDI specs (kinds slurm-tpu.dev/edgetpu, slurm-tpu.dev/hailo; GPUs only
    where families.gpu.isolate leases them) for `podman run --device slurm-tpu.dev/edgetpu=<identity>`.

    Jobs find their devices' names in SLURM_TPU_CDI_DEVICES. Once written, `gres-conf --output`
    and the hotplug watcher keep them current.
    """
    import os

    from ..ops.cdi import default_libraries, write_cdi
    from ..ops.install import default_libdir
    from ..render.cdi import render_cdi, spec_file_name

    libraries = default_libraries()
    if libedgetpu is not None:
        if not os.path.isfile(libedgetpu):
            raise SlurmTpuError(f"--libedgetpu {libedgetpu}: no such file")
        libraries["edgetpu"] = (os.path.realpath(libedgetpu), os.path.join(default_libdir(), "libedgetpu.so.1"))
    inventory = _inventory(saved)
    if not obj.config.family("gpu").lease and any(a.kind == "gpu" for a in inventory.usable()):
        click.echo(
            "slurm-tpu: GPUs are not leased here (families.gpu.isolate is off): our spec lists none; "
            "NVIDIA's `nvidia-ctk cdi generate` writes theirs",
            err=True,
        )
    if "edgetpu" not in libraries and any(a.kind == "edgetpu" for a in inventory.usable()):
        click.echo(
            "slurm-tpu: no node libedgetpu found (install --libedgetpu, or --libedgetpu PATH): "
            "containers keep their image's, which ignores EDGETPU_VISIBLE_DEVICES",
            err=True,
        )
    if output is None:
        specs = render_cdi(inventory, obj.config, libraries, dev_root)
        click.echo(json.dumps({spec_file_name(kind): spec for kind, spec in specs.items()}, indent=1))
        return
    try:
        result = write_cdi(output, inventory, obj.config, libraries, dev_root)
    except OSError as exc:
        raise SlurmTpuError(f"cannot write CDI specs in {output}: {exc.strerror or exc}") from exc
    for path in result.written:
        click.echo(f"wrote {path}", err=True)
    for path in result.unchanged:
        click.echo(f"{path} is up to date", err=True)
    for path in result.removed:
        click.echo(f"removed {path} (no such device here now)", err=True)
    if not (result.written or result.unchanged):
        click.echo(f"no leased accelerator here: no CDI spec in {output}", err=True)
