"""Native libraries load in the one order that works, and a build that would crash is refused in one line."""

from __future__ import annotations

import importlib.metadata
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
    # A command that runs a model: `--help` and planning import no numpy.
    "cli": "import runpy; sys.argv = ['localchat', 'run', '-n', '1', 'Hi']; runpy.run_module('localchat', run_name='__main__')",
    "server": "import localchat.server.app",
    "chat app": "import localchat.tui.app",
    "converters": "import localchat.converters.cli, localchat.converters.gguf",
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


def test_a_build_carrying_its_own_cxx_runtime_loads_after_onnxruntime(tmp_path: Path, localchat_home: Path,
                                                                        default_model: Path) -> None:
    """A llama_cpp whose libggml-cuda.so carries its own C++ runtime loads after onnxruntime (the only order that
    answered with such a build on a GPU machine); here its package notes what was loaded before it, then fails
    to load as a broken install would, which `localchat run` says in one line. As in llama-cpp-python, the
    package's bindings module loads the libraries (localchat imports it alone)."""
    package = tmp_path / "site" / "llama_cpp"
    (package / "lib").mkdir(parents=True)
    seen = tmp_path / "loaded-before.txt"
    (package / "__init__.py").write_text("from .llama_cpp import *\n")
    (package / "llama_cpp.py").write_text(
        "import sys\n"
        f"open({str(seen)!r}, 'w').write(' '.join(m for m in ('numpy', 'onnxruntime') if m in sys.modules))\n"
        "raise OSError('libllama.so: cannot open shared object file')\n")
    compile_cxx_library(package / "lib", "libggml-cuda.so.0.25.3", "-static-libstdc++")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "site"), "LOCALCHAT_HOME": str(localchat_home)}
    run = subprocess.run([sys.executable, "-m", "localchat", "run", "-m", str(default_model), "-n", "2", "Hi"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert "onnxruntime" in seen.read_text().split()
    assert run.returncode == 1, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "llama-cpp-python is not installed or cannot load" in lines[0], run.stderr
    assert "libggml-cuda.so.0.25.3 carries its own copy of the C++ runtime" in lines[0] and "Traceback" not in run.stderr


def test_a_sound_build_loads_alone_first(tmp_path: Path) -> None:
    """Without a carried runtime llama.cpp loads first and onnxruntime is not imported (a quicker start); only
    llama-cpp-python's bindings are, its high-level `Llama` and its version there when named."""
    code = ("import sys, localchat, llama_cpp; print('onnxruntime' in sys.modules, 'llama_cpp' in sys.modules, "
            "'llama_cpp.llama' in sys.modules, callable(llama_cpp.llama_decode)); "
            "print(llama_cpp.Llama.__module__, llama_cpp.__version__)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert run.stdout.split() == ["False", "True", "False", "True", "llama_cpp.llama", importlib.metadata.version("llama_cpp_python")], run.stderr


@pytest.mark.parametrize("wanted", [None, "28"])
def test_numpys_blas_threads_do_not_spin_while_the_process_waits(tmp_path: Path, wanted: str | None) -> None:
    """OpenBLAS's threads spin for about 0.1 s after a BLAS call, taking cores from llama.cpp (localchat's
    docstring): after `import localchat` they sleep at once, unless the user's OPENBLAS_THREAD_TIMEOUT says else."""
    env = {key: value for key, value in os.environ.items() if not key.startswith("OPENBLAS_")}
    if wanted is not None:
        env["OPENBLAS_THREAD_TIMEOUT"] = wanted
    code = ("import time, localchat, numpy as np; a = np.ones((256, 256), dtype=np.float32); a @ a; "
            "t = time.process_time(); time.sleep(0.3); print(time.process_time() - t)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env, timeout=120)
    spun = float(run.stdout)
    assert spun < 0.02 if wanted is None else spun > 0.01, run.stderr
