"""Native libraries load in the one order that works, and a build that would crash is refused in one line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from localchat.native import CXX_RUNTIME, needed_libraries, statically_linked_cxx

ROOT = Path(__file__).resolve().parent.parent
# Records, when numpy or onnxruntime first starts to import, whether llama.cpp's library is mapped yet.
RECORD_LOAD_ORDER = textwrap.dedent("""
    import sys
    class Watch:
        seen = {}
        def find_spec(self, name, path=None, target=None):
            if name in ("numpy", "onnxruntime") and name not in self.seen:
                self.seen[name] = "libllama" in open("/proc/self/maps").read()
            return None
    watch = Watch()
    sys.meta_path.insert(0, watch)
    import atexit
    atexit.register(lambda: print("LOAD-ORDER", watch.seen, file=sys.stderr))
""")
ENTRY_POINTS = {
    "cli": "import runpy; sys.argv = ['localchat', '--help']; runpy.run_module('localchat', run_name='__main__')",
    "server": "import localchat.server.app",
    "chat app": "import localchat.tui.app",
    "converters": "import localchat.converters.cli",
    **{f"benchmarks/{p.name}": f"import runpy; sys.argv = ['{p.name}', '--help']; runpy.run_path('{p}', run_name='__main__')"
       for p in sorted((ROOT / "benchmarks").glob("*.py"))},
}


def compile_cxx_library(folder: Path, name: str, *extra: str) -> Path:
    """A small C++ shared library that uses the C++ runtime's streams, as llama.cpp's do."""
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        pytest.skip("no C++ compiler (the README's install needs one for llama.cpp)")
    source = folder / "print.cpp"
    source.write_text('#include <sstream>\nextern "C" int describe(int x) { std::ostringstream s; s << x; return (int) s.str().size(); }\n')
    target = folder / name
    subprocess.run([compiler, "-shared", "-fPIC", "-o", str(target), str(source), *extra], check=True)
    return target


def test_a_library_carrying_its_own_cxx_runtime_is_found(tmp_path: Path) -> None:
    sound = compile_cxx_library(tmp_path, "libggml-base.so")
    static = compile_cxx_library(tmp_path, "libggml-cuda.so", "-static-libstdc++")
    assert CXX_RUNTIME in needed_libraries(sound)
    assert needed_libraries(static) and CXX_RUNTIME not in needed_libraries(static)
    assert statically_linked_cxx(tmp_path) == ["libggml-cuda.so"]
    assert needed_libraries(tmp_path / "print.cpp") == []  # not an ELF file: nothing to say


def test_the_installed_llama_cpp_links_the_cxx_runtime_dynamically() -> None:
    import llama_cpp

    assert statically_linked_cxx(Path(llama_cpp.__file__).parent / "lib") == []


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_every_entry_point_loads_llama_cpp_before_numpy_and_onnxruntime(entry: str) -> None:
    run = subprocess.run([sys.executable, "-c", RECORD_LOAD_ORDER + ENTRY_POINTS[entry]], capture_output=True, text=True,
                         cwd=ROOT, timeout=120)
    record = next(line for line in run.stderr.splitlines() if line.startswith("LOAD-ORDER"))
    seen = eval(record.removeprefix("LOAD-ORDER "))  # a dict literal printed by the child
    # Each of numpy and onnxruntime that was imported found libllama loaded; the engine's entry
    # points do import numpy (a benchmark that only drives servers need not).
    assert all(seen.values()), (entry, seen)
    assert entry.startswith("benchmarks/") or "numpy" in seen, (entry, seen)


def test_a_build_that_would_crash_is_refused_in_one_line(tmp_path: Path, localchat_home: Path, default_model: Path) -> None:
    """A llama_cpp whose libggml-cuda.so carries its own C++ runtime: never loaded (its package would
    raise if imported), and `localchat run` says what is wrong and how to rebuild, in one line."""
    package = tmp_path / "site" / "llama_cpp"
    (package / "lib").mkdir(parents=True)
    (package / "__init__.py").write_text("raise SystemExit('a refused build was loaded')\n")
    compile_cxx_library(package / "lib", "libggml-cuda.so", "-static-libstdc++")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "LOCALCHAT_HOME": str(localchat_home)}
    run = subprocess.run([sys.executable, "-m", "localchat", "run", "-m", str(default_model), "-n", "2", "Hi"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert run.returncode == 1, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "libggml-cuda.so carries its own copy of the C++ runtime" in lines[0], run.stderr
    assert "pip install --force-reinstall" in lines[0] and "Traceback" not in run.stderr
