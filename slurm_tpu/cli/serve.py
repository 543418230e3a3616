"""``slurm-tpu serve``: hold models open on the job's devices and answer HTTP until the job ends."""

from __future__ import annotations

import sys

import click

from .group import main


def _say(message: str) -> None:
    click.echo(f"slurm-tpu serve: {message}")
    sys.stdout.flush()  # the job's log is a file: say it now, not at exit


def _warn(message: str) -> None:
    click.echo(f"slurm-tpu serve: warning: {message}", err=True)


@main.command("serve", context_settings={"max_content_width": 100})
@click.argument("models", nargs=-1, required=True, metavar="MODEL[=NAME]...")
@click.option("-l", "--labels", "labels", multiple=True, metavar="[NAME=]FILE",
              help="Labels for a model (NAME=FILE; FILE alone when one model is served). Repeatable.")
@click.option("--task", type=click.Choice(["auto", "classify", "detect", "segment", "raw"]), default="auto",
              show_default=True, help="The task 'infer --server' uses for every model (auto: recognised from each model's outputs).")
@click.option("--host", default="0.0.0.0", show_default=True, help="Address to listen on.")
@click.option("--port", default=0, show_default=True, type=click.IntRange(0, 65535),
              help="Port (0: a free one, written to the address file).")
@click.option("--advertise", metavar="HOST", help="Host name written to the address file (default: this node's).")
@click.option("--queue", "queue_size", default=64, show_default=True, type=click.IntRange(1),
              help="Inferences that may wait for a device; beyond, requests get 503 with Retry-After.")
@click.option("--max-body", default=8, show_default=True, type=click.IntRange(1, 1024), metavar="MIB",
              help="Largest request body, MiB.")
@click.option("--max-connections", default=64, show_default=True, type=click.IntRange(1, 10000),
              help="Open connections that have shown the token (one thread each); others are counted apart.")
@click.option("--max-instances", default=64, show_default=True, type=click.IntRange(1),
              help="Inferences in one :predict request.")
@click.option("--drain-timeout", default=20.0, show_default=True, type=click.FloatRange(0),
              help="Seconds to finish requests in flight after SIGTERM (keep below Slurm's KillWait).")
@click.option("--fast-resize", is_flag=True, help="As for infer: JPEG draft + BILINEAR (inputs differ from pycoral's).")
@click.option("--keep-aspect-ratio", is_flag=True, help="As for infer: segmentation pads instead of stretching.")
@click.option("-a", "--input-mean", "input_mean", type=float, help="As for infer: image normalisation mean.")
@click.option("-s", "--input-std", "input_std", type=float, help="As for infer: image normalisation std.")
@click.option("--device", "devices", multiple=True, metavar="DEV",
              help="Override: identity (usb-2-1.3), usb:PATH, pci:PATH, cpu or gpu; repeat or comma-separate.")
@click.option("--libedgetpu", metavar="PATH", envvar="SLURM_TPU_LIBEDGETPU", help="libedgetpu.so.1 to use.")
@click.option("--fallback", type=click.Choice(["cpu"]), help="Run on the CPU when the GPU cannot be set up.")
@click.option("--runtime", type=click.Choice(["litert", "tflite-runtime"]), envvar="SLURM_TPU_RUNTIME",
              help="TFLite runtime (default: LiteRT if installed, else tflite-runtime).")
@click.option("--threads", type=click.IntRange(1), help="CPU threads per interpreter (default: CPUs / devices).")
def serve(models: tuple[str, ...], labels: tuple[str, ...], task: str, host: str, port: int, advertise: str | None,
          queue_size: int, max_body: int, max_connections: int, max_instances: int, drain_timeout: float,
          fast_resize: bool, keep_aspect_ratio: bool, input_mean: float | None, input_std: float | None,
          devices: tuple[str, ...], libedgetpu: str | None, fallback: str | None, runtime: str | None,
          threads: int | None) -> None:
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
    from ..runner import OpenOptions
    from ..runner.preprocess import Normalization
    from ..runner.serve.app import Limits
    from ..runner.serve.models import Preparation, parse_labels_args, parse_model_args
    from ..runner.serve.server import Listen, serve_job

    args = parse_model_args(models)
    limits = Limits(max_body=max_body << 20, max_instances=max_instances, max_connections=max_connections,
                    queue=queue_size)
    code = serve_job(args, parse_labels_args(labels, args),
                     OpenOptions(device=devices, libedgetpu=libedgetpu, fallback=fallback, num_threads=threads,
                                 runtime=runtime),
                     Preparation(Normalization(input_mean, input_std), fast_resize, keep_aspect_ratio),
                     Listen(host, port, advertise), limits, drain_timeout, _say, _warn, task)
    sys.exit(code)
