"""Import one module of a package without the package's `__init__`, which would import all of it.

llama-cpp-python's `__init__` imports its high-level `Llama` (its chat formats, jinja2: 40-85 ms) beside
the ctypes bindings localchat uses, and gguf's imports its writer, vocabularies and metadata (yaml,
sentencepiece: 30-50 ms) beside the constants localchat reads headers with: a third of the start of
`localchat run`. The package is registered without running its `__init__`, holding the names of the
module imported, as both `__init__`s make it (`from .llama_cpp import *`, `from .constants import *`);
the first name asked of it that it does not hold runs the `__init__` then, so `llama_cpp.Llama` and
`from gguf import GGUFWriter` still work as the package makes them.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType


def import_part(package: str, module: str) -> ModuleType:
    """`package.module`, imported without `package`'s `__init__` unless something imported the package already;
    the package holds the module's public names."""
    shell = None
    if package not in sys.modules:
        spec = importlib.util.find_spec(package)
        if spec is None or spec.loader is None:
            raise ImportError(f"No module named {package!r}", name=package)
        shell = importlib.util.module_from_spec(spec)
        shell.__getattr__ = _run_init_on_first_miss(shell)  # type: ignore[attr-defined]
        sys.modules[package] = shell
    try:
        part = importlib.import_module(f"{package}.{module}")
    except BaseException:
        if shell is not None:
            del sys.modules[package]  # a failed part leaves no half package behind
        raise
    if shell is not None:
        public = getattr(part, "__all__", [name for name in vars(part) if not name.startswith("_")])
        shell.__dict__.update({name: getattr(part, name) for name in public})
    return part


def _run_init_on_first_miss(shell: ModuleType):  # type: ignore[no-untyped-def]
    """The shell's module `__getattr__`: runs the package's `__init__` in it (once), then looks again."""

    def attribute(name: str) -> object:
        del shell.__getattr__  # type: ignore[attr-defined]
        assert shell.__spec__ is not None and shell.__spec__.loader is not None
        shell.__spec__.loader.exec_module(shell)
        return getattr(shell, name)

    return attribute
