"""``slurm-tpu serve``: hold models open on the job's devices and answer HTTP until the job ends."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import click

from ..runner.request import OpenOptions, Preprocessing
from .group import main
from .options import grouped, open_options, preprocessing_options, task_option

if TYPE_CHECKING:
    from ..runner.serve.app import Limits
    from ..runner.serve.server import Listen


def _say(message: str) -> None:
    click.echo(f"slurm-tpu serve: {message}")
    sys.stdout.flush()  # the job's log is a file: say it now, not at exit


def _warn(message: str) -> None:
    click.echo(f"slurm-tpu serve: warning: {message}", err=True)


def _listen(host: str, port: int, advertise: str | None) -> Listen:
    from ..runner.serve.server import Listen

    return Listen(host, port, advertise)


def _limits(max_body: int, **limits: int) -> Limits:
    """--max-body is in MiB; --queue, --max-connections and --max-instances are Limits' fields by name."""
    from ..runner.serve.app import Limits

    return Limits(max_body=max_body << 20, **limits)


@main.command("serve", context_settings={"max_content_width": 100})
@click.argument("models", nargs=-1, required=True, metavar="MODEL[=NAME]...")
@click.option(
    "-l",
    "--labels",
    multiple=True,
    metavar="[NAME=]FILE",
    help="Labels for a model (NAME=FILE; FILE alone when one model is served). Repeatable.",
)
@task_option("The task 'infer --server' uses for every model (auto: recognised from each model's outputs).")
@grouped(
    "listen",
    _listen,
    click.option("--host", default="0.0.0.0", metavar="ADDRESS", help="Address to listen on."),
    click.option(
        "--port", default=0, type=click.IntRange(0, 65535), help="Port (0: a free one, written to the address file)."
    ),
    click.option("--advertise", metavar="HOST", help="Host name written to the address file (default: this node's)."),
)
@grouped(
    "limits",
    _limits,
    click.option(
        "--queue",
        default=64,
        type=click.IntRange(1),
        help="Inferences that may wait for a device; beyond, requests get 503 with Retry-After.",
    ),
    click.option(
        "--max-body", default=8, type=click.IntRange(1, 1024), metavar="MIB", help="Largest request body, MiB."
    ),
    click.option(
        "--max-connections",
        default=64,
        type=click.IntRange(1, 10000),
        help="Open connections that have shown the token (one thread each); others are counted apart.",
    ),
    click.option("--max-instances", default=64, type=click.IntRange(1), help="Inferences in one :predict request."),
)
@click.option(
    "--drain-timeout",
    default=20.0,
    type=click.FloatRange(0),
    help="Seconds to finish requests in flight after SIGTERM (keep below Slurm's KillWait).",
)
@preprocessing_options(pycoral_spellings=False)
@open_options()
def serve(
    models: tuple[str, ...],
    labels: tuple[str, ...],
    task: str,
    listen: Listen,
    limits: Limits,
    drain_timeout: float,
    preprocessing: Preprocessing,
    opening: OpenOptions,
) -> None:
    """Serve MODELs from this job's devices over HTTP until the job ends.

    \b
    Run inside a job:  sbatch --gres=tpu:1 --wrap 'exec slurm-tpu serve model_edgetpu.tflite'
    Each MODEL is opened once on every device of the job (co-compiled Edge TPU models
    share a device) and served as NAME (default: the file name without .tflite):
      GET  /v1/models/NAME            status          (TF Serving's REST API)
      GET  /v1/models/NAME/metadata   inputs, outputs
      POST /v1/models/NAME:predict    {"instances": [...]} or {"inputs": ...}
      POST /v1/models/NAME:classify   image bytes -> the record 'infer --json' prints
           (:detect, :segment, :raw likewise; ?top_k=3&threshold=0.2)
      GET  /metrics                   Prometheus text
    Every request needs 'Authorization: Bearer TOKEN'; the URL and TOKEN are in
    ~/.slurm-tpu/serve/JOBID.json (mode 0600). Clients: slurm-tpu infer --server JOBID NAME INPUTS.
    SIGTERM (scancel, time limit) stops it gracefully and writes the usage record.
    """
    from ..runner.serve.models import parse_labels_args, parse_model_args
    from ..runner.serve.server import serve_job

    args = parse_model_args(models)
    code = serve_job(
        args, parse_labels_args(labels, args), opening, preprocessing, listen, limits, drain_timeout, _say, _warn, task
    )
    sys.exit(code)
