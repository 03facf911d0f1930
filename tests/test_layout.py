"""The direction of imports: the engine knows nothing of the UI, the server or the converters.

The chat app and the converters live in the top-level folders `tui/` and `converters/` and are
installed as `localchat.tui` and `localchat.converters`."""

from __future__ import annotations

import ast
import functools
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


# -- the import graph: the project's files as nodes, their imports as arrows ---------------------

# The folders whose Python files are the project's own code.
SOURCE_FOLDERS = ("localchat", "tui", "converters", "benchmarks")
# The top-level folders by their installed names (pyproject's package-dir).
INSTALLED_AS = {"localchat.tui": "tui", "localchat.converters": "converters", "localchat.assets": "assets"}
# The layers, from the top: a file may import files of its own layer and of the layers below it,
# never one above. A path is a folder ("tui/") or a file; the longest path that holds a file
# places it.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("front ends", ("localchat/__main__.py", "localchat/cli.py", "localchat/server/", "tui/", "benchmarks/")),
    ("converters", ("converters/",)),
    ("engine", ("localchat/",)),
    ("backends", ("localchat/backends/",)),
    # What a backend is loaded with: backends read the plan, the planner reads no backend.
    ("plan", ("localchat/planner.py",)),
    ("foundations", ("localchat/backends/base.py", "localchat/onnx_format.py", "localchat/gguf_file.py",
                     "localchat/hardware.py", "localchat/errors.py", "localchat/background.py", "localchat/file_facts.py",
                     "localchat/settings.py")),
)


def module_file(module: str) -> str | None:
    """The project file (path from the root) that an imported module is; None for another package's."""
    for installed, folder in INSTALLED_AS.items():
        if module == installed or module.startswith(installed + "."):
            module = folder + module[len(installed) :]
            break
    else:
        if not is_under(module, ("localchat",)):
            return None
    path = module.replace(".", "/")
    return next((p for p in (f"{path}.py", f"{path}/__init__.py") if (ROOT / p).is_file()), None)


def imported_files(path: Path) -> set[str]:
    """The project files `path` imports anywhere in it: at the top, inside functions, for type checking."""
    found: set[str | None] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(module_file(alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            # `from package import module` imports the module; `from module import name`, the module.
            found.update(module_file(f"{node.module}.{alias.name}") or module_file(node.module) for alias in node.names)
    return {f for f in found if f is not None} - {path.relative_to(ROOT).as_posix()}


@functools.cache
def import_graph() -> dict[str, set[str]]:
    """Every source file, with the project files it imports."""
    return {
        path.relative_to(ROOT).as_posix(): imported_files(path)
        for folder in SOURCE_FOLDERS for path in sorted((ROOT / folder).rglob("*.py"))
    }


def layer_of(file: str) -> int:
    """The file's layer, 0 at the top."""
    places = [(len(path), rank) for rank, (_, paths) in enumerate(LAYERS) for path in paths
              if file == path or (path.endswith("/") and file.startswith(path))]
    assert places, f"{file} is on no layer: add it to LAYERS"
    return max(places)[1]


def test_the_graph_has_the_arrows_of_every_kind_of_import() -> None:
    """At the top, inside a function, `from package import module`, by an installed name."""
    graph = import_graph()
    assert "localchat/backends/base.py" in graph["localchat/session.py"]
    assert "localchat/backends/onnx.py" in graph["localchat/model_loading.py"]
    assert "localchat/hub.py" in graph["localchat/models.py"]
    assert "tui/app.py" in graph["localchat/cli.py"]


def test_the_layer_table_names_files_that_exist() -> None:
    for name, paths in LAYERS:
        for path in paths:
            assert (ROOT / path).exists(), f"the {name} layer names {path}, which does not exist"


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of files that import each other, through any number of files."""
    reach = {}
    for start in graph:
        seen, todo = set(), [start]
        while todo:
            for target in graph.get(todo.pop(), set()) - seen:
                seen.add(target)
                todo.append(target)
        reach[start] = seen
    groups = {frozenset(f for f in reach[start] if start in reach[f]) for start in graph if start in reach[start]}
    return sorted(sorted(group) for group in groups)


def test_no_files_import_each_other_in_a_circle() -> None:
    found = circles(import_graph())
    assert not found, "files that import each other: " + "; ".join(" <-> ".join(group) for group in found)


def test_no_import_runs_up_a_layer() -> None:
    up = [
        f"{file} ({LAYERS[layer_of(file)][0]}) imports {target} ({LAYERS[layer_of(target)][0]})"
        for file, targets in import_graph().items() for target in sorted(targets) if layer_of(target) < layer_of(file)
    ]
    assert not up, "imports that run up a layer:\n" + "\n".join(up)
