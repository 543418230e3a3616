"""The configuration reference, docs/configuration.md, generated from the code.

Regenerate it after changing a config key, its default or its description::

    python -m slurm_tpu.ops.config_reference --output docs/configuration.md

(tests/test_docs.py fails while the checked-in page differs from what this renders.)
Keys, types and descriptions come from the config schema (slurm_tpu/config.py's
``schema()``); defaults are read from ``Config()``'s fields and each family's
``default_config``, so the page states what the code does. A key this module cannot
place is an error naming it, never a silent gap.
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
from typing import Any, Callable

import yaml

from ..config import (
    CURRENT_VERSION,
    DEFAULT_PATH,
    ENV_VAR,
    VERSION,
    VERSION_1_KEYS,
    Config,
    config_keys,
    parse_mode,
    schema,
)
from ..families import FAMILIES, FamilyConfig

COMMAND = "python -m slurm_tpu.ops.config_reference --output docs/configuration.md"
# The top-level sections, in the order the page shows them; a key's section is its first part.
SECTIONS = (
    ("", "Top level"),
    ("devices", "`devices`: device nodes, leases and revocation"),
    ("udev", "`udev`: the rules' program"),
    ("slurm", "`slurm`: which Slurm, and how to talk to it"),
    ("energy", "`energy`: each job's energy on its accelerators"),
)


def _common_defaults() -> dict[str, Any]:
    """Dotted key -> the default its Config field declares, in the form the file writes it
    (a mode as '0600', not as the int it is parsed into)."""
    found = {key.name: f"{default:04o}" if key.convert is parse_mode else default for key, default in config_keys()}
    return {VERSION.name: CURRENT_VERSION, **found}


class UnknownDefault(Exception):
    """A schema key whose default this module does not know how to read."""


def _family_default(config: FamilyConfig, key: str, keys: dict[str, tuple[Any, str]], kind: str = "") -> Any:
    """The default of ``families.<kind>.<key>`` from the family's ``default_config`` (``keys``: its schema).

    A ``types.<name>`` table holds the entries no other ``types.*`` key names (Hailo's ``by_address``).
    """
    if key == "gres_name":
        return config.gres_name
    if key == "features":
        return list(config.features)
    if key == "isolate":  # the GPU family's word for being leased
        return config.lease
    if key == "types":
        return dict(config.types)
    if key == "shared":
        return list(config.shared)
    if key == "shares_per_device":
        return config.shares_per_device
    if key == "watts":  # the site's calibration; the family's datasheet defaults apply without it
        return {name: {"idle": idle, "active": active} for name, (idle, active) in config.watts.items()}
    if key == "shard_gres_name":  # the family's own shard GRES unless the site renames it
        from ..families import family

        return family(kind).shard_name(config)
    if key.startswith("types."):
        name = key[len("types.") :]
        if keys[key][0] is dict:
            named = {other[len("types.") :] for other in keys if other.startswith("types.")}
            return {entry: value for entry, value in config.types.items() if entry not in named}
        return config.types[name]
    raise UnknownDefault(
        f"no default known for config key '{key}' of a family: "
        f"teach slurm_tpu/ops/config_reference.py's _family_default to read it"
    )


def defaults() -> dict[str, Any]:
    """Dotted key -> default for every key of the current version (None: unset by default)."""
    config, keys, common = Config(), schema(), _common_defaults()
    found: dict[str, Any] = {}
    for key in keys:
        if key in common:
            found[key] = common[key]
            continue
        parts = key.split(".", 2)
        if parts[0] != "families" or len(parts) < 3:
            raise UnknownDefault(
                f"no default known for config key '{key}': declare it on its Config field "
                f"(slurm_tpu/config.py setting())"
            )
        section = {k.split(".", 2)[2]: v for k, v in keys.items() if k.startswith(f"families.{parts[1]}.")}
        found[key] = _family_default(config.family(parts[1]), parts[2], section, parts[1])
    return found


def default_document() -> dict[str, Any]:
    """Every key that has a default, nested as the YAML file nests it."""
    document: dict[str, Any] = {}
    for key, value in defaults().items():
        *parents, leaf = key.split(".")
        if value is not None:
            functools.reduce(lambda node, part: node.setdefault(part, {}), parents, document)[leaf] = value
    return document


def _type_name(expected: type | tuple[type, ...]) -> str:
    names = {str: "string", int: "integer", float: "number", bool: "boolean", list: "list", dict: "table"}
    kinds = expected if isinstance(expected, tuple) else (expected,)
    return " or ".join(names.get(kind, kind.__name__) for kind in kinds)


def _table(members: list[str], prefix: str, found: dict[str, Any]) -> list[str]:
    """A Markdown table of ``members`` (dotted keys), named without ``prefix``."""
    known = schema()
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for key in members:
        expected, description = known[key]
        # A default as a code span (JSON, which YAML reads the same).
        default = "unset" if found[key] is None else f"`{json.dumps(found[key])}`"
        if key == "version":
            default = "required in a file"
        meaning = description.replace("|", "\\|")
        rows.append(f"| `{key[len(prefix) :]}` | {_type_name(expected)} | {default} | {meaning} |")
    return rows


def render() -> str:
    """The whole page, docs/configuration.md."""
    found = defaults()
    keys = list(schema())
    lines = [
        "# Configuration reference",
        "",
        f"<!-- Generated from slurm_tpu/config.py and slurm_tpu/families/ by `{COMMAND}`; "
        "edit those, not this file. -->",
        "",
        f"slurm-tpu reads `{DEFAULT_PATH}`, or the file named by `--config FILE` or `${ENV_VAR}`. "
        "The file is optional: without it every default below applies. When present it must say its "
        f"version (`version: {CURRENT_VERSION}`), and a key that version does not know is rejected with its "
        "dotted name, so a typo never falls back to a default silently. Modes are octal strings (`'0600'`); "
        "paths must be absolute.",
        "",
        "This page is generated from the code ([slurm_tpu/config.py](../slurm_tpu/config.py) and the "
        "families' modules) and lists every key with its type and default. The "
        "[admin guide](admin-guide.md#configuration-file) has an annotated example and says how slurm-tpu "
        "finds Slurm's programs.",
        "",
    ]
    for section, title in SECTIONS:
        members = [k for k in keys if (k.split(".")[0] == section if section else "." not in k)]
        prefix = f"{section}." if section else ""
        lines += [f"## {title}", "", *_table(members, prefix, found), ""]
    for family in FAMILIES:
        prefix = f"families.{family.kind}."
        members = [k for k in keys if k.startswith(prefix)]
        source = type(family).__module__.replace(".", "/") + ".py"  # from the repository root
        lines += [
            f"## `families.{family.kind}`: {family.title}s",
            "",
            f"The settings of the {family.title} family ([{source}](../{source})).",
            "",
            *_table(members, prefix, found),
            "",
        ]
    document = yaml.safe_dump(default_document(), sort_keys=False, default_flow_style=False).rstrip("\n")
    unset = ", ".join(f"`{key}`" for key, value in found.items() if value is None)
    lines += [
        "## Every default, as a file",
        "",
        f"A config file that sets every key to its default; the keys left out are unset by default ({unset}).",
        "",
        "```yaml",
        document,
        "```",
        "",
        "## Version 1 keys",
        "",
        "Version 1 files spelled the Edge TPU and GPU settings flat. They still load, each key with "
        "the meaning of the version 2 key it became:",
        "",
        "| version 1 key | version 2 key |",
        "|---|---|",
    ]
    lines += [f"| `{old}` | `{new}` |" for old, new in VERSION_1_KEYS.items()]
    return "\n".join(lines) + "\n"


def write_page(name: str, what: str, render: Callable[[], str], label: str) -> int:
    """``python -m slurm_tpu.<name> [--output FILE]``: print the page ``render`` makes, or write it to FILE;
    errors are said as ``<label>: error: ...`` (this module's, and slurm_tpu/cli/reference.py's)."""
    parser = argparse.ArgumentParser(prog=f"python -m slurm_tpu.{name}", description=f"Render the {what}.")
    parser.add_argument("--output", "-o", help="write the page to this file instead of stdout")
    options = parser.parse_args()
    prefix = f"{label}: error:"
    try:
        text = render()
    except UnknownDefault as exc:
        print(f"{prefix} {exc}", file=sys.stderr)
        return 2
    if not options.output:
        sys.stdout.write(text)
        return 0
    try:
        with open(options.output, "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as exc:
        print(f"{prefix} cannot write {options.output}: {exc.strerror}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(
        write_page(
            "ops.config_reference", "configuration reference (docs/configuration.md)", render, "config_reference"
        )
    )
