"""The direction of imports: the engine knows nothing of the UI, the server or the converters."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FRONT_DOORS = ("localchat/cli.py", "localchat/server/", "localchat/__main__.py")


def imported_modules(path: Path) -> set[str]:
    modules: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            modules.add(node.module)
    return modules


def test_the_engine_imports_no_front_end() -> None:
    for path in (ROOT / "localchat").rglob("*.py"):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith(FRONT_DOORS):
            continue
        bad = {m for m in imported_modules(path) if m.split(".")[0] in ("tui", "fastapi", "uvicorn", "textual") or m.startswith("localchat.server")}
        assert not bad, f"{relative} imports {bad}"


def test_converters_import_no_front_end() -> None:
    for path in (ROOT / "converters").rglob("*.py"):
        bad = {m for m in imported_modules(path) if m.split(".")[0] in ("tui", "textual", "fastapi") or m.startswith("localchat.server")}
        assert not bad, f"{path} imports {bad}"
