"""Options that several commands take, each declared once, and the helpers that group options.

Choices, environment variables and defaults come from the runner's own ``choices`` and
``request`` modules, never from lists here. Those are stdlib-only: every command
module imports this one at start-up (``slurm-tpu health``, run by slurmd, included).
"""

from __future__ import annotations

import functools
from typing import Any, Callable, TypeVar

import click

from ..runner import choices
from ..runner.request import OpenOptions, Preprocessing, Reading

F = TypeVar("F", bound=Callable[..., Any])
Decorator = Callable[[F], F]


def options(*decorators: Decorator) -> Decorator:
    """Apply click option ``decorators`` so that --help lists them in the order given."""
    return lambda func: functools.reduce(lambda wrapped, decorator: decorator(wrapped), reversed(decorators), func)


def grouped(param: str, build: Callable[..., Any], *decorators: Decorator) -> Decorator:
    """Declare the options ``decorators``; the command gets them as one argument.

    The command's parameter ``param`` receives ``build(**values)``, ``values`` being
    those options' values by their parameter names (so a dataclass whose fields are
    named as the options is its own ``build``), instead of one parameter per option.
    """

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def command(*args: Any, **kwargs: Any) -> Any:
            kwargs[param] = build(**{name: kwargs.pop(name) for name in names})
            return func(*args, **kwargs)

        # The options declared below this group stay the command's, in their order;
        # the group's own are the ones it appends.
        params = list(getattr(func, "__click_params__", []))
        known = len(params)
        command.__click_params__ = params  # type: ignore[attr-defined]  # click's own attribute on functions
        options(*decorators)(command)
        names = [p.name for p in params[known:]]
        return command  # type: ignore[return-value]  # the wrapper, typed as the function it wraps

    return decorate


# -- options of several commands -------------------------------------------------------------


def node_option(what: str = "Slurm NodeName", from_slurmd: bool = False) -> Decorator:
    """--node NAME; its default is :meth:`slurm_tpu.cli.group.Obj.node_name`'s."""
    default = "$SLURMD_NODENAME, else config node_name" if from_slurmd else "config node_name"
    return click.option("--node", metavar="NAME", help=f"{what} (default: {default}, else short hostname).")


def libedgetpu_option(what: str) -> Decorator:
    """--libedgetpu PATH (env SLURM_TPU_LIBEDGETPU): ``what`` says what the library is for."""
    return click.option(
        "--libedgetpu",
        metavar="PATH",
        envvar=choices.LIBEDGETPU_ENV,
        help=f"{what} (env {choices.LIBEDGETPU_ENV}; default: the system's).",
    )


def task_option(help_text: str) -> Decorator:
    """--task: auto or a task name."""
    return click.option(
        "--task", type=click.Choice((choices.AUTO, *choices.TASK_NAMES)), default=Reading.task, help=help_text
    )


def open_options() -> Decorator:
    """How to open the model (infer, serve): one ``opening`` argument, an :class:`OpenOptions`."""
    return grouped(
        "opening",
        OpenOptions,
        click.option(
            "--device",
            multiple=True,
            metavar="DEV",
            help="Override: identity (usb-2-1.3), usb:PATH, pci:PATH, cpu or gpu; repeat or comma-separate.",
        ),
        libedgetpu_option("libedgetpu.so.1 to use"),
        click.option(
            "--fallback", type=click.Choice(choices.FALLBACKS), help="Run on the CPU when the GPU cannot be set up."
        ),
        click.option(
            "--runtime",
            type=click.Choice(choices.RUNTIMES),
            envvar=choices.RUNTIME_ENV,
            help=f"TFLite runtime (env {choices.RUNTIME_ENV}; default: LiteRT if installed, else tflite-runtime).",
        ),
        click.option(
            "--threads",
            "num_threads",
            type=click.IntRange(1),
            help="CPU threads per interpreter (default: CPUs / devices).",
        ),
    )


def preprocessing_options(pycoral_spellings: bool) -> Decorator:
    """How inputs become tensors (infer, serve): one ``preprocessing`` argument, a :class:`Preprocessing`.

    ``pycoral_spellings``: also take pycoral's ``--keep_aspect_ratio``, ``--input_mean``
    and ``--input_std`` (infer, whose pycoral-style flags work as they are).
    """

    def spelled(*names: str) -> tuple[str, ...]:  # the last name is pycoral's spelling
        return names if pycoral_spellings else names[:-1]

    return grouped(
        "preprocessing",
        Preprocessing,
        click.option(
            "--fast-resize",
            is_flag=True,
            help="Decode JPEGs at reduced scale and resize BILINEAR: faster, but inputs (and scores) "
            "differ from pycoral's LANCZOS.",
        ),
        click.option(
            *spelled("--keep-aspect-ratio", "--keep_aspect_ratio"),
            "keep_aspect_ratio",
            is_flag=True,
            help="Segment: pad instead of stretching (as semantic_segmentation.py); detect always pads.",
        ),
        click.option(
            *spelled("-a", "--input-mean", "--input_mean"),
            "input_mean",
            type=float,
            help="Image normalisation mean (as pycoral's --input_mean; default: the model's quantization).",
        ),
        click.option(
            *spelled("-s", "--input-std", "--input_std"),
            "input_std",
            type=float,
            help="Image normalisation std (as pycoral's --input_std).",
        ),
    )
