"""The command reference, docs/cli.md, generated from the click commands.

Regenerate it after changing a command, an option or a help text::

    python -m slurm_tpu.cli.reference --output docs/cli.md

(tests/test_docs.py fails while the checked-in page differs from what this renders.)
Everything comes from click's own objects, unwrapped; a help text's ``\\b`` paragraph
becomes a code block.
"""

from __future__ import annotations

import inspect
import re
import sys
from collections.abc import Iterator

import click

from . import main as root
from .group import EXIT_DIFFERS, EXIT_ERROR

COMMAND = "python -m slurm_tpu.cli.reference --output docs/cli.md"
PROG = "slurm-tpu"


def _contexts(ctx: click.Context) -> Iterator[click.Context]:
    """``ctx`` and, depth first by name, a context for each command under it."""
    yield ctx
    if isinstance(ctx.command, click.Group):
        for name in ctx.command.list_commands(ctx):
            command = ctx.command.get_command(ctx, name)
            if command is not None and not command.hidden:
                yield from _contexts(click.Context(command, parent=ctx, info_name=name, **command.context_settings))


def _escape(text: str) -> str:
    """Markdown for plain text: ``<``, ``&`` and ``*`` outside code spans stay literal."""
    parts = re.split(r"(`[^`]*`)", text)
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("&", "&amp;").replace("<", "&lt;").replace("*", "\\*")
    return "".join(parts)


def _cell(text: str) -> str:
    """Text, or a code span, in a table cell: ``|`` escaped."""
    return text.replace("|", "\\|")


def _paragraphs(command: click.Command) -> list[str]:
    """The help text as Markdown blocks: each paragraph on one line, a ``\\b`` paragraph as it is written."""
    text = inspect.cleandoc(command.help or "").partition("\f")[0]
    blocks = []
    for paragraph in re.split(r"\n\s*\n", text):
        if paragraph.startswith("\b\n"):
            blocks.append("```text\n" + paragraph[2:] + "\n```")
        elif paragraph.strip():
            blocks.append(_escape(" ".join(line.strip() for line in paragraph.splitlines())))
    return blocks


def _params(ctx: click.Context) -> list[str]:
    """The options and arguments as a table; a command's own ``--help`` is the group's, listed once."""
    rows = []
    for param in ctx.command.get_params(ctx):
        if isinstance(param, click.Argument):
            what = ["required" if param.required else "optional", *(["repeatable"] if param.nargs != 1 else [])]
            rows.append(f"| `{_cell(' '.join(param.get_usage_pieces(ctx)))}` | argument ({', '.join(what)}) |")
            continue
        record = param.get_help_record(ctx)
        if record is None or (ctx.parent is not None and set(param.opts) <= set(ctx.help_option_names)):
            continue
        meaning = " ".join(record[1].split())  # click puts two spaces before "[default: ...]"
        rows.append(f"| `{_cell(record[0])}` | {_cell(_escape(meaning))} |")
    return ["| option | meaning |", "|---|---|", *rows] if rows else []


def render() -> str:
    """The whole page, docs/cli.md."""
    contexts = list(_contexts(click.Context(root, info_name=PROG, **root.context_settings)))
    lines = [
        "# Command reference",
        "",
        f"<!-- Generated from the commands in slurm_tpu/cli/ by `{COMMAND}`; edit their help there, not this file. -->",
        "",
        f"Every `{PROG}` command with its usage, help and options, as `{PROG} COMMAND --help` shows them. "
        f"Exit status: 0 success; {EXIT_DIFFERS} what the command's help says (`--check` found a difference, "
        f"`doctor` a problem...); {EXIT_ERROR} an error, said on one line of stderr, or a usage mistake. "
        "The guides say when to run which: [admin guide](admin-guide.md), [user guide](user-guide.md).",
        "",
        "| command | what it does |",
        "|---|---|",
    ]
    for ctx in contexts[1:]:
        anchor = ctx.command_path.replace(" ", "-")
        lines.append(f"| [`{ctx.command_path}`](#{anchor}) | {_cell((_paragraphs(ctx.command) or [''])[0])} |")
    for ctx in contexts:
        usage = " ".join([ctx.command_path, *ctx.command.collect_usage_pieces(ctx)])
        name, *description = _paragraphs(ctx.command) or [""]
        lines += ["", f"## `{ctx.command_path}`", "", name, "", "```text", usage, "```"]
        lines += [line for block in description for line in ("", block)]
        table = _params(ctx)
        lines += ["", *table] if table else []
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    from ..ops.config_reference import write_page

    sys.exit(write_page("cli.reference", "command reference (docs/cli.md)", render, "cli_reference"))
