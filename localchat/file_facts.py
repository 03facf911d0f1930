"""Facts derived from a model file once and kept under the file's identity, read back on later starts.

Reading a GGUF header in Python walks every entry of its vocabulary (0.1 s for Gemma's 262k, to refuse a
repeated one before llama.cpp aborts on it), and llama.cpp says which tokens end a reply one call a token
(0.1 s more). Both are kept per file with its identity (its resolved path, device, inode, size, modification
and change times), as Python keeps a module's bytecode by its source's size and time, and derived again when
any of those changes. A file changed in the last seconds is not remembered (as git treats a "racy" file): a
rewrite within the file system's timestamp granularity could keep its size and times. A derivation that
fails (a bad file) is never kept, so the file's error is said each time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import tempfile
import time
from collections.abc import Callable
from dataclasses import astuple, dataclass
from pathlib import Path
from typing import Any

from localchat.settings import default_cache_dir

# Bumped when a derivation changes (what it keeps, or what it checks): older entries are then derived again.
FORMAT = 1
# A file changed less than this long ago may change again within its timestamps' granularity.
SETTLED_S = 2.0


@dataclass(frozen=True)
class FileVersion:
    """What tells one version of a file from another."""

    resolved: str
    device: int
    inode: int
    size: int
    mtime_ns: int
    ctime_ns: int

    @classmethod
    def of(cls, path: Path) -> FileVersion | None:
        """The version of the file at `path` now; None if it cannot be read."""
        try:
            stat = path.stat()
            return cls(str(path.resolve()), stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)
        except OSError:
            return None

    @property
    def settled(self) -> bool:
        return time.time_ns() - max(self.mtime_ns, self.ctime_ns) >= SETTLED_S * 1e9


def remembered(path: Path, kind: str, derive: Callable[[], Any], *, version: FileVersion | None = None,
               folder: Path | None = None) -> Any:
    """`derive()`, JSON data (read back as JSON reads it), for the file at `path`: read back if it was
    derived for this version of the file before, else derived and kept. `kind` names what is derived and
    what else it depends on (a library's version). `version`: the file's as the derivation read it, when it
    read the file before this call (by default, its version now)."""
    version = version or FileVersion.of(path)
    if version is None:
        return derive()  # which says what is wrong with the path
    folder = folder or default_cache_dir() / "file-facts"
    identity = [FORMAT, kind, *astuple(version)]
    entry = folder / f"{hashlib.sha256(json.dumps([kind, version.resolved]).encode()).hexdigest()[:32]}.json"
    try:
        kept = json.loads(entry.read_bytes())
        if kept["identity"] == identity:
            return kept["facts"]
    except (OSError, ValueError, KeyError, TypeError):
        pass  # none kept, or unreadable: derived afresh
    document = json.dumps({"identity": identity, "facts": derive()})
    if version.settled:
        _keep(entry, document)
    return json.loads(document)["facts"]


def _keep(entry: Path, document: str) -> None:
    """Write `entry` whole or not at all; a cache that cannot be written only costs the next start time."""
    temporary: Path | None = None
    try:
        entry.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=entry.parent, suffix=".tmp", delete=False) as stream:
            temporary = Path(stream.name)
            stream.write(document)
        temporary.replace(entry)
    except OSError:
        if temporary is not None:
            with contextlib.suppress(OSError):
                temporary.unlink()
