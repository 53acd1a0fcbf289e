"""The project's rule for its Lua: one short script per operation, none over 250 lines
(shared functions go in preludes, put in front of the scripts that use them; see
``celery_redislock/engine/scripts.py``)."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "celery_redislock"
LONGEST = 250


def test_no_lua_file_is_over_250_lines() -> None:
    files = sorted(PACKAGE.rglob("*.lua"))
    assert len(files) > 40  # the engine's and the parking queues' scripts were found
    sizes = {str(path.relative_to(PACKAGE)): len(path.read_text().splitlines())
             for path in files}
    assert {name: lines for name, lines in sizes.items() if lines > LONGEST} == {}
