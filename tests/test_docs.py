"""The documentation: links that lead somewhere, and configuration and command references that are current.

Every relative link in README.md and docs/*.md must name a file or directory of the
repository, and a link with ``#anchor`` into a Markdown file a heading of that file
(GitHub's anchors). docs/configuration.md and docs/cli.md are generated from the code;
when one is stale the failure says the command that regenerates it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from slurm_tpu.cli import reference as cli_reference
from slurm_tpu.config import Config, parse_config
from slurm_tpu.ops.config_reference import COMMAND, default_document, render

REPO = Path(__file__).resolve().parent.parent
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


def prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans (links there are not links)."""
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    return re.sub(r"`[^`\n]*`", "", text)


def anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings (lower case, punctuation dropped,
    spaces to hyphens; a repeated heading gets -1, -2, ...)."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    found: set[str] = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", text, flags=re.M):
        heading = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        unique, n = slug, 0
        while unique in found:
            n += 1
            unique = f"{slug}-{n}"
        found.add(unique)
    return found


def links(page: Path) -> list[str]:
    return [
        target for target in LINK.findall(prose(page.read_text())) if not re.match(r"[a-z][a-z0-9+.-]*:", target)
    ]  # http:, https:, mailto: ...


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_leads_to_a_file_and_heading_that_exist(page):
    broken = []
    for target in links(page):
        path, _, anchor = target.partition("#")
        destination = (page.parent / path).resolve() if path else page
        if not destination.exists():
            broken.append(f"{target}: no such file or directory")
        elif anchor and destination.suffix == ".md" and anchor not in anchors(destination):
            broken.append(f"{target}: no heading with anchor #{anchor} in {destination.relative_to(REPO)}")
    assert not broken, f"{page.relative_to(REPO)}: broken links:\n  " + "\n  ".join(broken)


def test_the_link_check_sees_links_and_anchors():
    """The checker itself: it finds links outside code, skips those in code and URLs, and
    computes GitHub's anchors."""
    assert "docs/user-guide.md" in links(REPO / "README.md")
    assert anchors(REPO / "docs" / "admin-guide.md") >= {
        "4-turn-on-the-hooks-slurmconf-every-node-and-the-controller",
        "the-edge-tpu-runtime-libedgetpu-with-edgetpu_visible_devices",
    }
    assert LINK.findall(prose("a [b](c.md) `[d](e.md)`\n```\n[f](g.md)\n```\n![i](j.png)")) == ["c.md"]


def test_configuration_reference_is_current():
    page = REPO / "docs" / "configuration.md"
    assert page.exists() and page.read_text() == render(), (
        f"docs/configuration.md is stale (a config key, default or description changed): "
        f"regenerate it with `{COMMAND}` and commit it"
    )


def test_configuration_reference_defaults_are_the_codes():
    """The page's 'every default' file loads as exactly the defaults the code applies."""
    assert parse_config(default_document()) == Config()
    page = (REPO / "docs" / "configuration.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", page.split("## Every default, as a file", 1)[1], re.S)
    assert block and parse_config(yaml.safe_load(block.group(1))) == Config()


def test_command_reference_is_current():
    page = REPO / "docs" / "cli.md"
    assert page.exists() and page.read_text() == cli_reference.render(), (
        f"docs/cli.md is stale (a command, option or help text changed): "
        f"regenerate it with `{cli_reference.COMMAND}` and commit it"
    )
