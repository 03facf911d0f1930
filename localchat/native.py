"""The one place localchat loads llama.cpp's native libraries, in the order that works for the build.

A CUDA build of llama.cpp crashed on a GPU machine (SIGSEGV in `llama_model::print_info()`'s ostream;
llama.cpp PR 22434 shows the same trace) because its libggml-cuda.so carries a copy of libstdc++ linked
statically, beside the process's own. Built there with the system compiler (H200, CUDA 13), it still
did, and which library loaded first decided it, over the six orders of numpy, onnxruntime and llama_cpp
followed by a model load and a reply: the three that load onnxruntime before llama_cpp answered; llama_cpp
first aborted at onnxruntime's import, and numpy, llama_cpp, onnxruntime crashed in the model load. So
every entry point loads llama.cpp's libraries here (the package's `__init__` imports this module): after
onnxruntime's where a library carries its own C++ runtime (`localchat info` says so, with the rebuild that
links it dynamically), first and alone otherwise, which keeps the start quick. The system compiler did not make a build
that needs the shared runtime there (nvcc's link): no rebuild command is known to fix it.
"""

from __future__ import annotations

import importlib.util
import logging
import mmap
import struct
from pathlib import Path

from localchat.errors import ModelError
from localchat.package_parts import import_part

# The C++ runtime every C++ library of a sound build links dynamically.
CXX_RUNTIME = "libstdc++.so.6"
# llama.cpp's own libraries (all C++) in llama-cpp-python's lib folder.
LLAMA_LIBRARY_PREFIXES = ("libllama", "libggml")
ELF_MAGIC = b"\x7fELF"
# Bytes of a 64-bit ELF file's header.
ELF_HEADER_SIZE = 64
SHT_DYNAMIC = 6
DT_NEEDED = 1


def needed_libraries(path: Path) -> list[str]:
    """The shared libraries an ELF file names as needed (DT_NEEDED), in order; [] for a file that is not
    a 64-bit little-endian ELF (then nothing can be said of it). The file is mapped, not read: every start
    looks at llama-cpp-python's libraries, 18 MB where its wheel copies each one thrice (10 ms read whole)."""
    with path.open("rb") as file:
        if path.stat().st_size < ELF_HEADER_SIZE:
            return []
        with mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
            return _needed_in(data)


def _needed_in(data: mmap.mmap) -> list[str]:
    """`needed_libraries` of a mapped file."""
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
                end = data.find(b"\0", strings_offset + value)
                if end < 0:  # the names run past the file's end
                    return needed
                needed.append(data[strings_offset + value : end].decode("utf-8", errors="replace"))
    return needed


def statically_linked_cxx(folder: Path) -> list[str]:
    """The llama.cpp libraries in `folder` that carry their own C++ runtime (need no libstdc++.so.6)."""
    carriers = []
    for path in sorted(folder.glob("lib*.so*")):
        if path.name.startswith(LLAMA_LIBRARY_PREFIXES) and not path.is_symlink() and path.is_file():
            needed = needed_libraries(path)
            if needed and CXX_RUNTIME not in needed:
                carriers.append(path.name)
    return carriers


def carrying_cxx_runtime() -> list[str]:
    """The installed llama.cpp's libraries that carry their own C++ runtime."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return []
    folder = Path(next(iter(spec.submodule_search_locations))) / "lib"
    return statically_linked_cxx(folder) if folder.is_dir() else []


# Why llama.cpp's libraries could not be loaded, once `load_llama_cpp_first` ran.
_not_loaded: str | None = None


def load_llama_cpp_first() -> None:
    """Load llama.cpp's libraries (a build carrying its own C++ runtime after onnxruntime's), or remember
    why they cannot be loaded."""
    global _not_loaded
    try:
        carried = carrying_cxx_runtime()
        if carried:
            import onnxruntime  # noqa: F401  (first: see the module's docstring)
        import_part("llama_cpp", "llama_cpp")  # the bindings alone (localchat.package_parts)
        # Should something import the rest of llama-cpp-python later, its logger (which would replace
        # localchat's) prints llama.cpp's errors alone, as its Llama(verbose=False) makes it.
        logging.getLogger("llama-cpp-python").setLevel(logging.ERROR)
    except (ImportError, OSError) as missing:
        advice = build_advice()
        _not_loaded = (f"llama-cpp-python is not installed or cannot load ({missing}); pip install -e ."
                       + (f" Its {advice}" if advice else ""))


def build_advice() -> str | None:
    """What to say of the installed llama.cpp's build, if anything: libraries carrying their own C++ runtime."""
    carried = carrying_cxx_runtime()
    if not carried:
        return None
    return (f"{', '.join(carried)} carries its own copy of the C++ runtime (libstdc++ linked statically), which "
            "crashes beside numpy's unless onnxruntime loads first, as localchat makes it; a build that needs "
            f"{CXX_RUNTIME} (readelf -d shows it NEEDED) is safe in any order")


def require_llama_cpp() -> None:
    """Raise the one-line reason llama.cpp cannot be used, if there is one; call before importing the backend."""
    if _not_loaded is not None:
        raise ModelError(_not_loaded)
