"""One module of a package imported without the package's `__init__` (pure logic, on packages made here)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path


def make_package(root: Path) -> None:
    package = root / "heavy"
    package.mkdir()
    (package / "__init__.py").write_text("import sys\nsys.init_runs = getattr(sys, 'init_runs', 0) + 1\n"
                                         "from .light import *\nfrom .rest import *\n")
    (package / "light.py").write_text("LIGHT = 1\n_PRIVATE = 2\n")
    (package / "rest.py").write_text("REST = 3\n")
    (package / "broken.py").write_text("raise OSError('cannot load')\n")


def run_in(root: Path, code: str) -> list[str]:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, cwd=root,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout.split()


def test_a_part_is_imported_without_the_init_which_runs_once_when_another_name_is_asked(tmp_path: Path) -> None:
    make_package(tmp_path)
    assert run_in(tmp_path, """
        import sys
        from localchat.package_parts import import_part
        part = import_part("heavy", "light")
        import heavy
        print(getattr(sys, "init_runs", 0), heavy.LIGHT, part.LIGHT, "_PRIVATE" in vars(heavy), "heavy.rest" in sys.modules)
        print(heavy.REST, sys.init_runs)
        from heavy import REST, LIGHT
        print(sys.init_runs, hasattr(heavy, "MISSING"), sys.init_runs)
    """) == ["0", "1", "1", "False", "False", "3", "1", "1", "False", "1"]


def test_a_part_that_fails_leaves_no_package_behind_and_an_imported_package_is_left_as_it_is(tmp_path: Path) -> None:
    make_package(tmp_path)
    assert run_in(tmp_path, """
        import sys
        from localchat.package_parts import import_part
        try:
            import_part("heavy", "broken")
        except OSError as error:
            print("failed", "heavy" in sys.modules)
        import heavy
        print(sys.init_runs)
        import_part("heavy", "light")
        print(sys.init_runs)
    """) == ["failed", "False", "1", "1"]
