"""The one place localchat loads llama.cpp's native libraries, and checks their build first.

A CUDA build of llama.cpp crashed in every `localchat run` on a GPU machine (SIGSEGV in
`llama_model::print_info()`'s ostream, llama.cpp PR 22434 shows the same trace): its compiler had
linked a copy of libstdc++ statically into libggml-cuda.so, and two C++ runtimes in one process
broke as soon as the other one (numpy's, onnxruntime's) was loaded first. Which library loaded
first decided which entry point crashed. So: llama.cpp's libraries are loaded here, before numpy,
by every entry point (the package's `__init__` imports this module); and a library that carries
its own C++ runtime is refused in one line with the command that rebuilds it, rather than crashing.
"""

from __future__ import annotations

import importlib.util
import struct
from pathlib import Path

from localchat.errors import ModelError

# The C++ runtime every C++ library of a sound build links dynamically.
CXX_RUNTIME = "libstdc++.so.6"
# llama.cpp's own libraries (all C++) in llama-cpp-python's lib folder.
LLAMA_LIBRARY_PREFIXES = ("libllama", "libggml")
ELF_MAGIC = b"\x7fELF"
SHT_DYNAMIC = 6
DT_NEEDED = 1
REBUILD = ('CMAKE_ARGS="-DGGML_CUDA=on" CXX=/usr/bin/g++ pip install --force-reinstall --no-cache-dir '
           'llama-cpp-python=={version}')


def needed_libraries(path: Path) -> list[str]:
    """The shared libraries an ELF file names as needed (DT_NEEDED), in order; [] for a file that is not
    a 64-bit little-endian ELF (then nothing can be said of it)."""
    data = path.read_bytes()
    if data[:4] != ELF_MAGIC or data[4] != 2 or data[5] != 1:
        return []
    section_offset, = struct.unpack_from("<Q", data, 0x28)
    entry_size, count, _names = struct.unpack_from("<HHH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, section_offset + i * entry_size) for i in range(count)]
    needed: list[str] = []
    for _name, kind, _flags, _address, offset, size, link, _info, _align, item_size in sections:
        if kind != SHT_DYNAMIC or not item_size:
            continue
        strings_offset = sections[link][4]
        for position in range(offset, offset + size, item_size):
            tag, value = struct.unpack_from("<qQ", data, position)
            if tag == DT_NEEDED:
                end = data.index(b"\0", strings_offset + value)
                needed.append(data[strings_offset + value : end].decode("utf-8", errors="replace"))
    return needed


def statically_linked_cxx(folder: Path) -> list[str]:
    """The llama.cpp libraries in `folder` that carry their own C++ runtime (need no libstdc++.so.6)."""
    carriers = []
    for path in sorted(folder.glob("lib*.so")):
        if path.name.startswith(LLAMA_LIBRARY_PREFIXES) and not path.is_symlink():
            needed = needed_libraries(path)
            if needed and CXX_RUNTIME not in needed:
                carriers.append(path.name)
    return carriers


def check_llama_cpp_build() -> None:
    """Refuse (ModelError) a llama.cpp build that links libstdc++ statically into its libraries."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return
    folder = Path(next(iter(spec.submodule_search_locations))) / "lib"
    carriers = statically_linked_cxx(folder) if folder.is_dir() else []
    if carriers:
        from importlib.metadata import version

        raise ModelError(
            f"llama.cpp's {', '.join(carriers)} carries its own copy of the C++ runtime (libstdc++ linked statically), "
            "which crashes the process beside numpy's; rebuild it with the system compiler: "
            + REBUILD.format(version=version("llama-cpp-python"))
        )


# Why llama.cpp was not loaded (a refused build, or none installed), once `load_llama_cpp_first` ran.
_not_loaded: str | None = None


def load_llama_cpp_first() -> None:
    """Load llama.cpp's libraries unless their build is refused (then remember why)."""
    global _not_loaded
    try:
        check_llama_cpp_build()
        import llama_cpp  # noqa: F401  (loads libllama and libggml* before numpy's C++ runtime)
    except ModelError as refused:
        _not_loaded = str(refused)
    except ImportError as missing:
        _not_loaded = f"llama-cpp-python is not installed or cannot load ({missing}); pip install -e ."


def require_llama_cpp() -> None:
    """Raise the one-line reason llama.cpp cannot be used, if there is one; call before importing the backend."""
    if _not_loaded is not None:
        raise ModelError(_not_loaded)
