"""The documentation is tested: every Python snippet of README.md and docs/*.md runs.

The fenced ``python`` blocks of one file run in order, in one namespace, as a reader who
pastes them one after the other would run them, in a fresh Python process (so that the
signal receivers and apps a snippet makes stay out of this one), against this session's
private redis-server: ``redis://localhost:6379`` in a snippet means that server. A block
may use ``app`` before a snippet of its file makes one: it is a Celery app of a project
called ``proj`` whose broker and lock store are that server.

A block that cannot run on its own is marked with ``<!-- skip-snippet -->`` on the line
before its fence; it must still compile, and there may be only a few of them.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import List, NamedTuple

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SKIP_MARK = "<!-- skip-snippet -->"
MOST_SKIPPED = 3
FENCE = re.compile(r"^(?P<indent>[ \t]*)```python[ \t]*\n(?P<code>.*?)^(?P=indent)```",
                   re.S | re.M)

#: Runs the blocks given as JSON on stdin in one namespace; prints which block failed.
RUNNER = r'''
import json, sys, traceback
from celery import Celery

url, blocks = json.loads(sys.stdin.read())
namespace = {"__name__": "proj"}
app = Celery("proj", broker=url + "/0")
app.conf.redislock_url = url + "/1"
namespace["app"] = app
for where, code in blocks:
    try:
        exec(compile(code, where, "exec"), namespace)
    except BaseException:
        print(f"snippet at {where} failed:", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
'''


class Snippet(NamedTuple):
    where: str
    code: str
    skipped: bool


def snippets(path: Path) -> List[Snippet]:
    """The ``python`` blocks of a Markdown file, dedented, with where each starts."""
    text = path.read_text()
    found = []
    for match in FENCE.finditer(text):
        line = text.count("\n", 0, match.start()) + 1
        before = text[:match.start()].rstrip().rsplit("\n", 1)[-1].strip()
        code = textwrap.dedent(match.group("code"))
        found.append(Snippet(f"{path.relative_to(ROOT)}:{line}", code, before == SKIP_MARK))
    return found


def documented() -> List[Path]:
    return [path for path in DOCUMENTS if snippets(path)]


def test_every_document_with_python_is_covered():
    names = {path.name for path in documented()}
    assert {"README.md", "metrics.md", "cli.md"} <= names
    every = [snippet for path in DOCUMENTS for snippet in snippets(path)]
    skipped = [snippet.where for snippet in every if snippet.skipped]
    assert len(skipped) <= MOST_SKIPPED, f"too many snippets skipped: {skipped}"
    for snippet in every:
        compile(snippet.code, snippet.where, "exec")  # even a skipped one must be Python


@pytest.mark.parametrize("path", documented(), ids=lambda path: path.name)
def test_snippets_run(path: Path, redis_server):
    redis_server.client().flushall()
    url = f"redis://127.0.0.1:{redis_server.port}"
    blocks = []
    for snippet in snippets(path):
        if snippet.skipped:
            continue
        code = snippet.code.replace("redis://localhost:6379", url)
        # never the machine's shared Redis: every connection must name the test server
        assert "6379" not in code and "Redis()" not in code, snippet.where
        blocks.append((snippet.where, code))
    done = subprocess.run([sys.executable, "-c", RUNNER], input=json.dumps([url, blocks]),
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]


LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} (?P<title>.+?)\s*$", re.M)
CODE_BLOCK = re.compile(r"^[ \t]*```.*?^[ \t]*```", re.S | re.M)


def anchors(path: Path) -> set:
    """The anchors GitHub makes for a Markdown file's headings: lower case, characters other
    than letters, digits, ``_``, ``-`` and spaces dropped, spaces made ``-``."""
    text = CODE_BLOCK.sub("", path.read_text())
    found = set()
    for match in HEADING.finditer(text):
        slug = re.sub(r"[^\w\- ]", "", match.group("title").lower()).replace(" ", "-")
        found.add(slug)
    return found


@pytest.mark.parametrize("path", DOCUMENTS, ids=lambda path: path.name)
def test_every_relative_link_and_anchor_leads_somewhere(path: Path):
    text = CODE_BLOCK.sub("", path.read_text())
    broken = []
    for match in LINK.finditer(text):
        target = match.group("target")
        if re.match(r"^[a-z]+:", target):
            continue  # http:, https:, mailto: — not checked here
        file_part, _, anchor = target.partition("#")
        linked = (path.parent / file_part).resolve() if file_part else path
        if not linked.exists():
            broken.append(f"{target}: no such file")
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}: no heading #{anchor} in {linked.name}")
    assert not broken, f"{path.name}: " + "; ".join(broken)
