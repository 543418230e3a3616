"""Operations commands: health, watch, metrics, report, accounting-collect, boot."""

from __future__ import annotations

import json
import os

import click

from ..defaults import ACCOUNTING_WINDOW_S
from .group import Obj, main, pass_obj, table
from .options import libedgetpu_option, node_option


@main.command()
@node_option(from_slurmd=True)
@click.option("--dry-run", is_flag=True, help="Report what would be done; do not drain or resume.")
@click.option(
    "--grace",
    type=float,
    default=1.5,
    metavar="SECONDS",
    help="Look again after this long before calling a USB stick missing (re-enumeration).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")
@pass_obj
def health(obj: Obj, node: str | None, dry_run: bool, grace: float, as_json: bool) -> None:
    """Drain this node when a configured accelerator is missing, unusable or too hot.

    For slurm.conf's HealthCheckProgram. Resumes the node once healthy, but only
    if slurm-tpu drained it (reason starting 'slurm-tpu:'); an admin's drain is
    never overridden. As root (not with --dry-run) it also ends the leases an
    epilog kept whose holder is gone, as `slurm-tpu leases --clear` does.
    """
    from ..ops.health_check import check_node

    result = check_node(obj.config, obj.node_name(node, from_slurmd=True), grace=grace, apply=not dry_run)
    decision = result.decision
    if as_json:
        record = {
            "node": result.node,
            "configured": list(result.configured),
            "problems": [{"identity": p.identity, "message": p.message} for p in result.problems],
            "action": decision.action.value,
            "reason": decision.reason,
            "applied": result.applied,
            "why": decision.why,
        }
        click.echo(json.dumps(record))
        return
    verb = {"drain": "drained", "resume": "resumed", "nothing": "no change"}[decision.action.value]
    if dry_run and decision.action.value != "nothing":
        verb = f"would be {verb} (dry run)"
    click.echo(
        f"{result.node}: {len(result.configured)} configured accelerator(s), "
        f"{len(result.problems)} problem(s); {verb}: {decision.reason or decision.why}"
    )


@main.command()
@node_option()
@click.option(
    "--gres-conf", metavar="FILE", default="/etc/slurm/gres.conf", help="gres.conf holding this node's slurm-tpu block."
)
@click.option(
    "--node-conf",
    metavar="FILE",
    help="File holding this node's NodeName block (from node-conf --output); its Gres=/Feature= are kept in line too.",
)
@click.option(
    "--stop-command",
    metavar="COMMAND",
    default="systemctl stop slurmd",
    help="Stops this node's slurmd (split like a shell would, run without one; the program is "
    "looked up in Slurm's directories, then PATH).",
)
@click.option("--start-command", metavar="COMMAND", default="systemctl start slurmd", help="Starts this node's slurmd.")
@click.option(
    "--controller-command",
    metavar="COMMAND",
    default="",
    show_default=False,
    help="Restarts slurmctld, needed when a GRES count changes (e.g. 'ssh ctl systemctl restart "
    "slurmctld'). Without it the node stays drained with a reason saying what to restart, "
    "and `slurm-tpu health` resumes it once slurmctld reports the new GRES.",
)
@click.option("--files-only", is_flag=True, help="Only rewrite the files; never drain or restart.")
@click.option(
    "--settle",
    type=float,
    default=5.0,
    metavar="SECONDS",
    help="Quiet time after the last udev event before acting (covers USB re-enumeration).",
)
@click.option("--duration", type=float, metavar="SECONDS", help="Stop after this long (default: run forever).")
@pass_obj
def watch(
    obj: Obj,
    node: str | None,
    gres_conf: str,
    node_conf: str | None,
    stop_command: str,
    start_command: str,
    controller_command: str,
    files_only: bool,
    settle: float,
    duration: float | None,
) -> None:
    """Follow udev hotplug events and keep gres.conf and Slurm in line with the hardware.

    A USB re-enumeration (the same stick back under its topology path) changes
    nothing. A real plug/unplug regenerates this node's gres.conf block (slot nodes
    first, so it never names a missing path) and NodeName line, then drains the
    node, waits for its accelerator jobs, restarts slurmd (and slurmctld when the
    GRES count changed and --controller-command is given) and resumes the node.
    """
    import shlex

    from ..ops.restart import RestartCommands
    from ..ops.watch import Watcher

    commands = (
        None
        if files_only
        else RestartCommands(shlex.split(stop_command), shlex.split(start_command), shlex.split(controller_command))
    )
    watcher = Watcher(obj.config, obj.node_name(node), gres_conf, node_conf, commands, settle=settle)
    watcher.run(stop_after=duration)


def _metrics_collector(obj: Obj, node: str, libedgetpu: str | None):
    """The node's collector: every collection detects, reads the ledger, audit log and usage records afresh."""
    import time

    from ..detect import detect_inventory
    from ..ops.edgetpu_runtime import installed_version
    from ..ops.health_check import configured_inventory
    from ..ops.metrics import NodeCollector, NodeSnapshot, broker_view
    from ..ops.node_state import audit_history, default_audit_log, lease_holders, running_energy, running_usage

    config = obj.config
    shares_here = bool(config.family("edgetpu").shared)  # the node's broker serves shards

    def snapshot() -> NodeSnapshot:
        leased, held = lease_holders(config)
        records, energy = audit_history([default_audit_log(config)])
        usage, broker = running_usage(config, held), broker_view(config.state_dir, shares_here)
        return NodeSnapshot(
            node,
            configured_inventory(config),
            detect_inventory(use_nvml=False),
            leased,
            held,
            records,
            time.time(),
            installed_version(libedgetpu),
            usage,
            broker,
            energy,
            running_energy(config, usage, broker),
        )

    return NodeCollector(snapshot)


@main.command()
@node_option("Node label")
@click.option(
    "--textfile",
    "--output",
    "-o",
    "textfile",
    metavar="FILE.prom",
    help="node_exporter textfile-collector mode: write FILE.prom atomically (a temporary file in "
    "the same directory, renamed over it) instead of stdout; run it from a timer.",
)
@click.option(
    "--listen",
    metavar="[HOST:]PORT",
    help="Serve /metrics over HTTP instead (HOST default: 127.0.0.1; each scrape detects afresh); Ctrl-C stops.",
)
@libedgetpu_option("libedgetpu.so.1 whose version to report")
@pass_obj
def metrics(obj: Obj, node: str | None, textfile: str | None, listen: str | None, libedgetpu: str | None) -> None:
    """Prometheus metrics: devices present/healthy/leased, temperature, jobs, inferences,
    energy, and the version of the node's libedgetpu; on a node sharing TPUs, its broker's figures
    (each shard job's device time, inferences, swaps, queue wait; each shared TPU's utilization).

    A device's state series carry the job holding it (labels hpc_job and hpc_user, as
    dcgm-exporter's HPC job mapping does), and each running job has its own inference
    counters. Lifetime inference counts and times come from the runner, through the
    epilog's usage records in the audit log. A running job's energy so far on each device
    it holds (labels hpc_job, hpc_user and method: measured, integrated, estimated,
    self-reported) is computed as its epilog will; ended jobs' energy is in each device's
    lifetime counter (by method) and in slurm-tpu report.
    """
    from .. import promtext

    name = obj.node_name(node)
    collector = _metrics_collector(obj, name, libedgetpu)
    if listen:
        host, _, port = listen.rpartition(":")
        if not port.isdigit():
            raise click.BadParameter(f"'{listen}' is not [HOST:]PORT", param_hint="--listen")
        promtext.serve_http(host or "127.0.0.1", int(port), collector)
        return
    if textfile:
        try:
            promtext.write_textfile(textfile, collector)
        except promtext.TextfileError as exc:
            raise click.ClickException(str(exc)) from None
        return
    click.echo(promtext.render(collector).decode(), nl=False)


def _parse_time(value: str | None, option: str) -> float | None:
    """ISO date/time (local time) or a relative age: 90m, 24h, 7d."""
    import datetime
    import time

    if value is None:
        return None
    units = {"m": 60, "h": 3600, "d": 86400}
    if value[-1:] in units and value[:-1].isdigit():
        return time.time() - int(value[:-1]) * units[value[-1]]
    try:
        return datetime.datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise click.BadParameter(
            f"'{value}' is neither a date (2026-11-01, 2026-11-01T08:00) nor an age (90m, 24h, 7d)", param_hint=option
        ) from None


@main.command()
@click.option("--by", type=click.Choice(["user", "device", "job"]), default="user", help="Group the totals by.")
@click.option(
    "--since",
    metavar="WHEN",
    help="Start of the period: a local date/time (2026-11-01T08:00) or an age (90m, 24h, 7d).",
)
@click.option("--until", metavar="WHEN", help="End of the period, in the same forms (default: now).")
@click.option(
    "--audit",
    "audit_logs",
    multiple=True,
    metavar="FILE",
    help="Audit log(s) to read (repeatable, e.g. collected from several nodes). "
    "Default: <state_dir>/audit.log of this node.",
)
@click.option(
    "--source",
    type=click.Choice(["auto", "sacct", "audit"]),
    default="auto",
    help="Slurm's accounting (sacct: accelerator TRES-seconds as sreport counts them, inference "
    "and energy figures from each job's AdminComment) or this node's audit log. auto: sacct where "
    "slurmctld records jobs through slurmdbd, unless --by device or --audit is given.",
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
@pass_obj
def report(
    obj: Obj, by: str, since: str | None, until: str | None, audit_logs: tuple[str, ...], source: str, as_json: bool
) -> None:
    """Accelerator use per user, device or job: leases, lease time, inferences, mean latency, energy.

    Energy is each job's on its accelerators, in joules and kWh, always with how it was
    obtained (measured, integrated, estimated, self-reported; unavailable, with why, per
    device): from the Epilog's energy events in the audit log, or each job's AdminComment.
    """
    import time

    start, end = _parse_time(since, "--since"), _parse_time(until, "--until")
    if source == "sacct" and by == "device":
        raise click.BadParameter("Slurm's accounting does not know devices: use --source audit", param_hint="--by")
    if source == "sacct" or (source == "auto" and by != "device" and not audit_logs and _slurm_accounting(obj)):
        from ..families import FAMILIES, family
        from ..ops.accounting import sacct_jobs, summarize_sacct
        from ..slurm.commands import Slurm

        tres = list(dict.fromkeys(f"gres/{obj.config.family(f.kind).gres_name}" for f in FAMILIES))
        shard_gres = family("edgetpu").shard_name(obj.config.family("edgetpu"))
        if shard_gres and obj.config.family("edgetpu").shared:
            tres.append(f"gres/{shard_gres}")  # share-seconds, as sreport counts them
        jobs = sacct_jobs(Slurm.for_config(obj.config), start, end)
        groups: dict = summarize_sacct(jobs, by, tres, start, end, time.time())
        used = [name for name in tres if any(name in t.tres_seconds for t in groups.values())]
        # The columns between JOBS and INFERENCES: the accelerator-hours of each GRES the jobs had.
        columns = [f"{name.split('/', 1)[1].upper()}-HOURS" for name in used]
        cells = {key: [f"{t.tres_seconds.get(name, 0.0) / 3600:.4f}" for name in used] for key, t in groups.items()}
        if any(t.shards is not None for t in groups.values()):
            # Jobs on TPU shares: the broker's figures (device time it ran them, swaps, time queued).
            columns += ["SHARD DEVICE TIME", "SHARD INFERENCES", "SWAPS", "QUEUE WAIT"]
            for key, t in groups.items():
                shard = t.shards.to_json() if t.shards is not None else None
                cells[key] += (
                    [
                        f"{shard['device_seconds']:.3f} s",
                        str(shard["inferences"]),
                        str(shard["model_swaps"]),
                        f"{shard['queue_wait_seconds']:.3f} s",
                    ]
                    if shard is not None
                    else ["-"] * 4
                )
        empty = "no accelerator jobs in this period (sacct)"
    else:
        from ..ops.accounting import summarize_audit, user_name
        from ..ops.node_state import audit_history, default_audit_log

        missing = [p for p in audit_logs if not os.path.exists(p)]
        if missing:
            raise click.BadParameter(f"{missing[0]} does not exist", param_hint="--audit")
        records, figures = audit_history(list(audit_logs) or [default_audit_log(obj.config)])
        groups = summarize_audit(records, by, start, end, time.time(), user_name, figures)
        columns = ["LEASE TIME"]
        cells = {key: [f"{round(t.lease_seconds, 3):.1f} s"] for key, t in groups.items()}
        empty = "no accelerator leases in this period"
    if as_json:
        click.echo(json.dumps({key: totals.to_json() for key, totals in groups.items()}, indent=2))
        return
    if not groups:
        click.echo(empty)
        return
    energy = [key for key, totals in groups.items() if totals.energy.methods]
    tail = ["ENERGY", "KWH", "METHOD"] if energy else []
    notes = by == "device" and any(groups[key].energy.notes for key in energy)
    rows = [
        (by.upper(), "JOBS", *columns, "INFERENCES", "MEAN LATENCY", *tail, *(["UNAVAILABLE BECAUSE"] if notes else []))
    ]
    for key, totals in groups.items():
        data = totals.to_json()
        latency = "-" if data["mean_latency_ms"] is None else f"{data['mean_latency_ms']:.2f} ms"
        power = totals.energy.cells() if tail else []
        why = ["; ".join(_printable(n) for n in totals.energy.notes) or "-"] if notes else []
        rows.append((key, str(data["jobs"]), *cells[key], str(data["inferences"]), latency, *power, *why))
    click.echo(table(rows, numbers=True), nl=False)


def _printable(text: str) -> str:
    """A note for a table cell: what a terminal would act on shown as '?'."""
    return "".join(c if c.isprintable() else "?" for c in text)


def _slurm_accounting(obj: Obj) -> bool:
    """Whether this cluster's slurmctld records jobs through slurmdbd (False when it cannot be asked)."""
    from ..errors import SlurmTpuError
    from ..ops.accounting import accounting_enabled
    from ..slurm.commands import Slurm

    try:
        return accounting_enabled(Slurm.for_config(obj.config))
    except SlurmTpuError:
        return False


@main.command("accounting-collect")
@click.option(
    "--every", type=float, metavar="SECONDS", help="Run as a service: collect again every SECONDS (default: once)."
)
@click.option(
    "--window",
    type=click.FloatRange(min=0.1),
    default=ACCOUNTING_WINDOW_S,
    metavar="SECONDS",
    help="The longest a write may follow the read it is made from; an item is checked again this long "
    "after its write. The same on every node.",
)
@pass_obj
def accounting_collect(obj: Obj, every: float | None, window: float) -> None:
    """Put each job's inference figures into its AdminComment in Slurm's accounting (root, on each node).

    The epilog spools them in the config's accounting_spool (default
    /var/lib/slurm-tpu/accounting-spool, which survives a reboot), only once this
    command has run: its first run makes the root-only spool. This applies them
    with `sacctmgr modify job ... set AdminComment=...`, keeps each entry until a
    run at least --window seconds later finds the node's item still there (the
    collectors of a multi-node job's nodes share that AdminComment: an item another
    node's write erased is written again), and only then removes it. Entries of
    jobs whose end is not recorded yet, or that Slurm refuses now, wait for the
    next run. Entries an older slurm-tpu left in <state_dir>/accounting-spool are
    taken over. `slurm-tpu install` installs slurm-tpu-accounting.timer, which runs
    this every minute. Without --every, exit 1 when a spool file is not an entry
    (it is left there, named).
    """
    import time

    from ..ops.accounting import collect
    from ..protocol.job_record import SPOOL_DIR
    from ..slurm.commands import Slurm

    slurm = Slurm.for_config(obj.config)
    legacy = os.path.join(obj.config.state_dir, SPOOL_DIR)
    while True:
        result = collect(obj.config.accounting_spool, slurm, window, legacy=legacy)
        if result.busy:
            click.echo(f"slurm-tpu accounting-collect: another collector is running on {obj.config.accounting_spool}")
        for job, comment in result.applied.items():
            click.echo(f"job {job}: AdminComment={comment} (checked again after {window:g} s)")
        for job, comment in result.confirmed.items():
            click.echo(f"job {job}: done, AdminComment={comment}")
        for job, why in result.waiting.items():
            click.echo(f"job {job}: waits ({why})")
        for why in result.refused.values():
            click.echo(f"slurm-tpu accounting-collect: {why}", err=True)
        if every is None:
            if result.refused:
                raise SystemExit(1)
            return
        time.sleep(every)


@main.command()
@pass_obj
def boot(obj: Obj) -> None:
    """Restore slot nodes and the hooks' inventory after a reboot (before slurmd starts).

    Run it as slurmd's ExecStartPre (see systemd/README.md). A configured
    accelerator absent at boot gets an inert placeholder slot so slurmd starts;
    the health check then drains the node for it.
    """
    from ..detect import detect_inventory
    from ..ops.configure import restore_node_state

    result = restore_node_state(obj.config, detect_inventory(use_nvml=False))
    absent = f"; absent: {', '.join(result.absent)} (placeholder slots)" if result.absent else ""
    click.echo(
        f"slurm-tpu boot: {len(result.present)} of {result.configured} configured accelerator(s) present{absent}"
    )
