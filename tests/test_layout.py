"""The direction of imports: the engine knows nothing of the UI, the server or the converters.

The chat app and the converters live in the top-level folders `tui/` and `converters/` and are
installed as `localchat.tui` and `localchat.converters`."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FRONT_DOORS = ("localchat/cli.py", "localchat/server/", "localchat/__main__.py")
FRONT_ENDS = ("localchat.tui", "localchat.server", "localchat.converters", "textual", "fastapi", "uvicorn")


def is_under(module: str, packages: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in packages)


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
        bad = {m for m in imported_modules(path) if is_under(m, FRONT_ENDS)}
        assert not bad, f"{relative} imports {bad}"


def test_converters_import_no_front_end() -> None:
    for path in (ROOT / "converters").rglob("*.py"):
        bad = {m for m in imported_modules(path) if is_under(m, ("localchat.tui", "localchat.server", "textual", "fastapi", "uvicorn"))}
        assert not bad, f"{path} imports {bad}"


def test_nothing_is_imported_by_its_old_top_level_name() -> None:
    for folder in ("localchat", "converters", "tui", "tests", "benchmarks"):
        for path in (ROOT / folder).rglob("*.py"):
            old = {m for m in imported_modules(path) if is_under(m, ("tui", "converters", "assets"))}
            assert not old, f"{path.relative_to(ROOT)} imports {old}: import them as localchat.tui, localchat.converters"
