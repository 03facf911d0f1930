"""A stand-in for the Hugging Face hub on loopback, answering the routes huggingface_hub's client uses,
with the headers the real hub sends:

- GET /api/models/{repo}[/revision/{rev}][?blobs=True]: id, sha, gated, siblings (with size, blobId
  and lfs {size, sha256, pointerSize} when `blobs` is asked for), as `HfApi.model_info` reads it;
- HEAD or GET /{repo}/resolve/{rev}/{file}: an LFS file answers 302 to a second server (another
  origin, as the hub's CDN is) with X-Repo-Commit, X-Linked-Etag (its sha256), X-Linked-Size and
  the pointer's ETag; a file kept in git answers 200 with its git object id as ETag;
- GET /cdn/{sha256} on the CDN server: the bytes, with Range (206, Content-Range);
- errors as the hub words them: 401 + X-Error-Code RepoNotFound for a missing repo, 401 (no token)
  or 403 (a token without access) + GatedRepo for a gated one, 404 + EntryNotFound or
  RevisionNotFound.

Faults for the CDN (`StandInHub.add_fault`): drop the connection after N bytes, stall after N bytes,
serve wrong bytes of the right length, run a hook before the first byte. `served` counts the bytes
of each file written to the socket.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlsplit

CHUNK = 1 << 20
POINTER_SIZE = 134  # an LFS pointer file's length, as the hub reports it


@dataclass(frozen=True)
class HubFile:
    path: str  # in the repo
    source: Path  # where the bytes are
    sha256: str
    size: int
    blob_id: str  # the git object id (of the LFS pointer, for an LFS file)
    lfs: bool = True

    @classmethod
    def from_disk(cls, path: str, source: Path, lfs: bool = True) -> HubFile:
        data_hash = hashlib.sha256()
        with source.open("rb") as stream:
            while block := stream.read(CHUNK):
                data_hash.update(block)
        sha256, size = data_hash.hexdigest(), source.stat().st_size
        if lfs:
            pointer = f"version https://git-lfs.github.com/spec/v1\noid sha256:{sha256}\nsize {size}\n".encode()
            blob_id = hashlib.sha1(b"blob %d\0" % len(pointer) + pointer).hexdigest()
        else:
            blob_id = hashlib.sha1(b"blob %d\0" % size + source.read_bytes()).hexdigest()
        return cls(path, source, sha256, size, blob_id, lfs)

    @property
    def etag(self) -> str:
        return self.sha256 if self.lfs else self.blob_id


@dataclass
class HubRepo:
    repo_id: str
    files: dict[str, HubFile]
    commit: str
    gated: bool = False


@dataclass
class Fault:
    """What goes wrong with the next `times` GETs of one file from the CDN."""

    drop_after: int | None = None  # close the connection after this many bytes
    stall_after: int | None = None  # send nothing more after this many bytes, until released
    corrupt: bool = False  # flip bytes, keeping the length
    before: Callable[[], None] | None = None  # run before the first byte
    times: int = 1


@dataclass
class Request:
    method: str
    path: str
    range: str | None
    status: int


@dataclass
class StandInHub:
    repos: dict[str, HubRepo] = field(default_factory=dict)
    served: Counter[str] = field(default_factory=Counter)  # path in repo -> bytes sent
    requests: list[Request] = field(default_factory=list)
    faults: dict[str, list[Fault]] = field(default_factory=dict)  # sha256 -> pending faults
    release: threading.Event = field(default_factory=threading.Event)  # ends stalls
    endpoint: str = ""
    cdn: str = ""
    lock: threading.Lock = field(default_factory=threading.Lock)
    answering: int = 0  # requests being answered: a test's last ones may still be counting its bytes

    def add_repo(self, repo_id: str, files: list[HubFile], gated: bool = False) -> HubRepo:
        commit = hashlib.sha1(repo_id.encode() + b"".join(f.sha256.encode() for f in files)).hexdigest()
        self.repos[repo_id] = repo = HubRepo(repo_id, {f.path: f for f in files}, commit, gated)
        return repo

    def add_fault(self, file: HubFile, fault: Fault) -> None:
        self.faults.setdefault(file.sha256, []).extend([fault] * fault.times)

    def reset(self) -> None:
        """Between tests: release stalls, let the requests being answered finish (their client may
        have all its bytes before the handler counts them), forget faults and counts (the repos stay)."""
        self.release.set()
        deadline = time.monotonic() + 30
        while self.answering and time.monotonic() < deadline:
            time.sleep(0.01)
        with self.lock:
            self.faults.clear()
            self.served.clear()
            self.requests.clear()
        self.release = threading.Event()

    def take_fault(self, sha256: str) -> Fault | None:
        with self.lock:
            pending = self.faults.get(sha256)
            return pending.pop(0) if pending else None

    def file_by_sha(self, sha256: str) -> HubFile | None:
        return next((f for r in self.repos.values() for f in r.files.values() if f.sha256 == sha256), None)

    def gets_of(self, path: str) -> list[Request]:
        """The CDN requests for one file, in order."""
        return [r for r in self.requests if r.path.startswith("/cdn/") and r.path.endswith("/" + path.rsplit("/", 1)[-1])]


_API = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/]+))?$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<file>.+)$")
_CDN = re.compile(r"^/cdn/(?P<sha>[0-9a-f]{64})/(?P<name>[^/]+)$")
_RANGE = re.compile(r"^bytes=(?P<start>\d+)-$")


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: object) -> None:
        pass

    def do_HEAD(self) -> None:
        self._answer(send_body=False)

    def do_GET(self) -> None:
        self._answer(send_body=True)

    def _answer(self, send_body: bool) -> None:
        with self.hub.lock:
            self.hub.answering += 1
        try:
            self._route(send_body=send_body)
        finally:
            with self.hub.lock:
                self.hub.answering -= 1

    @property
    def hub(self) -> StandInHub:
        return self.server.hub

    def _log(self, status: int) -> None:
        with self.hub.lock:
            self.hub.requests.append(Request(self.command, urlsplit(self.path).path, self.headers.get("Range"), status))

    def _reply(self, status: int, headers: dict[str, str], body: bytes = b"", send_body: bool = True) -> None:
        self._log(status)
        self.send_response(status)
        for name, value in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(name, value)
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def _error(self, status: int, code: str, message: str, extra: dict[str, str] | None = None) -> None:
        body = json.dumps({"error": message}).encode()
        headers = {"Content-Type": "application/json", "X-Error-Code": code, "X-Error-Message": message, **(extra or {})}
        self._reply(status, headers, body, send_body=self.command != "HEAD")

    def _repo(self, repo_id: str, rev: str | None) -> HubRepo | None:
        repo = self.hub.repos.get(repo_id)
        if repo is None:
            self._error(401, "RepoNotFound", "Repository not found")
            return None
        if rev not in (None, "main", repo.commit):
            self._error(404, "RevisionNotFound", "Invalid rev id: " + rev)
            return None
        return repo

    def _route(self, send_body: bool) -> None:
        url = urlsplit(self.path)
        path = unquote(url.path)
        if self.server.is_cdn:
            match = _CDN.match(path)
            file = self.hub.file_by_sha(match["sha"]) if match else None
            if file is None:
                self._reply(404, {}, b"not found")
            else:
                self._serve(file, send_body)
            return
        if match := _API.match(path):
            repo = self._repo(match["repo"], match["rev"] and unquote(match["rev"]))
            if repo is not None:
                blobs = "blobs" in parse_qs(url.query)
                body = json.dumps(_model_info(repo, blobs)).encode()
                self._reply(200, {"Content-Type": "application/json"}, body, send_body)
            return
        if match := _RESOLVE.match(path):
            repo = self._repo(match["repo"], match["rev"])
            if repo is not None:
                self._resolve(repo, match["file"], send_body)
            return
        self._reply(404, {}, b"no such route")

    def _resolve(self, repo: HubRepo, name: str, send_body: bool) -> None:
        commit = {"X-Repo-Commit": repo.commit}
        if repo.gated:
            status = 403 if self.headers.get("Authorization") else 401
            self._error(status, "GatedRepo", f"Access to model {repo.repo_id} is restricted. You must have access to it and be authenticated to access it.", commit)
            return
        file = repo.files.get(name)
        if file is None:
            self._error(404, "EntryNotFound", f"{name} does not exist on \"main\"", commit)
            return
        headers = {**commit, "ETag": f'"{file.blob_id}"', "Accept-Ranges": "bytes"}
        if file.lfs:
            location = f"{self.hub.cdn}/cdn/{file.sha256}/{name.rsplit('/', 1)[-1]}"
            headers |= {"Location": location, "X-Linked-Etag": f'"{file.sha256}"', "X-Linked-Size": str(file.size)}
            self._reply(302, headers, f"Found. Redirecting to {location}".encode(), send_body)
            return
        self._reply(200, headers, file.source.read_bytes(), send_body)

    def _serve(self, file: HubFile, send_body: bool) -> None:
        """The file's bytes from the Range start, with the pending fault if any."""
        match = _RANGE.match(self.headers.get("Range") or "")
        start = int(match["start"]) if match else 0
        status = 206 if match else 200
        fault = self.hub.take_fault(file.sha256) if send_body else None
        self._log(status)
        self.send_response(status)
        self.send_header("Content-Length", str(file.size - start))
        self.send_header("ETag", f'"{file.sha256}"')
        self.send_header("Accept-Ranges", "bytes")
        if match:
            self.send_header("Content-Range", f"bytes {start}-{file.size - 1}/{file.size}")
        self.end_headers()
        if not send_body:
            return
        if fault and fault.before:
            fault.before()
        sent = 0
        with file.source.open("rb") as stream:
            stream.seek(start)
            while block := stream.read(CHUNK):
                if fault and fault.corrupt:
                    block = bytes(b ^ 0x5A for b in block)
                limit = next((n for n in (fault.drop_after, fault.stall_after) if n is not None), None) if fault else None
                if limit is not None and sent + len(block) >= limit:
                    block = block[: max(limit - sent, 0)]
                try:
                    self.wfile.write(block)
                    self.wfile.flush()
                except OSError:  # the client went away (killed, timed out)
                    break
                sent += len(block)
                with self.hub.lock:
                    self.hub.served[file.path] += len(block)
                if limit is not None and sent >= limit:
                    if fault.stall_after is not None:
                        self.hub.release.wait(60)
                    break
        self.close_connection = True


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, hub: StandInHub, is_cdn: bool) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.hub = hub
        self.is_cdn = is_cdn


def _model_info(repo: HubRepo, blobs: bool) -> dict[str, object]:
    siblings = []
    for file in repo.files.values():
        sibling: dict[str, object] = {"rfilename": file.path}
        if blobs:
            sibling |= {"size": file.size, "blobId": file.blob_id}
            if file.lfs:
                sibling["lfs"] = {"size": file.size, "sha256": file.sha256, "pointerSize": POINTER_SIZE}
        siblings.append(sibling)
    return {
        "_id": repo.commit[:24], "id": repo.repo_id, "modelId": repo.repo_id, "author": repo.repo_id.split("/")[0],
        "sha": repo.commit, "lastModified": "2025-08-14T12:00:00.000Z", "private": False,
        "gated": "manual" if repo.gated else False, "disabled": False, "tags": ["gguf"], "library_name": "gguf",
        "siblings": siblings,
    }


def start_hub() -> tuple[StandInHub, Callable[[], None]]:
    """The hub and its CDN, each on a loopback port of its own; returns the hub and a stop function."""
    hub = StandInHub()
    servers = [_Server(hub, is_cdn=False), _Server(hub, is_cdn=True)]
    hub.endpoint, hub.cdn = (f"http://127.0.0.1:{s.server_address[1]}" for s in servers)
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in servers]
    for thread in threads:
        thread.start()

    def stop() -> None:
        hub.release.set()
        for server in servers:
            server.shutdown()
            server.server_close()

    return hub, stop
