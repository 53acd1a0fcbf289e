"""The user pages are about use: the package's internals (its Lua scripts, the members and
key layout it writes in Redis) are described in ``docs/architecture.md`` alone, and no
page tells the history of the code ("Before these changes ...")."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
USER_PAGES = ["README.md", *(f"docs/{name}.md" for name in (
    "how-it-works", "features", "cli", "configuration", "reliability", "testing", "web",
    "demo", "metrics", "security"))]

INTERNALS = {
    "a Lua script's name": r"\b[a-z_]+\.lua\b",
    "the key layout": r"\{<digest>\}|<16 hex digest>|`\}:[a-z]+:`",
    "a member's format": r"<acquired ms>|<acquired_ms>",
    "the code's history": r"[Bb]efore these changes|before the fix",
}


@pytest.mark.parametrize("page", USER_PAGES)
def test_user_pages_leave_internals_to_the_architecture_page(page):
    text = (ROOT / page).read_text()
    found = {what: re.findall(pattern, text) for what, pattern in INTERNALS.items()}
    assert not any(found.values()), {what: hits for what, hits in found.items() if hits}


def test_the_architecture_page_has_the_internals():
    text = (ROOT / "docs" / "architecture.md").read_text()
    assert "## What is stored in Redis" in text and "## The Lua scripts" in text
    scripts = sorted(path.name for path in (ROOT / "celery_redislock" / "engine" / "lua")
                     .glob("*.lua"))
    assert [name for name in scripts if f"`{name}`" not in text] == []
