"""A real `localchat serve` process on a free loopback port, and what tests ask of it; other servers
(vLLM, Open WebUI) started the same way."""

from __future__ import annotations

import http.server
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import requests
import uvicorn
from fastapi import FastAPI
from openai import OpenAI

API_KEY = "test-key"
SLOTS = 4
QUEUE = 4
CONTEXT = 4096


@dataclass(frozen=True)
class LiveServer:
    url: str
    process: subprocess.Popen[bytes]

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {API_KEY}"}

    def client(self) -> OpenAI:
        # No retries: a 503 must reach the test as it reached the client.
        return OpenAI(base_url=f"{self.url}/v1", api_key=API_KEY, max_retries=0, timeout=120)

    def post(self, path: str, body: object, **kwargs: object) -> requests.Response:
        return requests.post(f"{self.url}{path}", json=body, headers=self.auth, timeout=120, **kwargs)  # type: ignore[arg-type]

    def request(self, method: str, path: str, **kwargs: object) -> requests.Response:
        """A request with any method and body (`data`), as the server's key allows."""
        return requests.request(method, f"{self.url}{path}", headers=self.auth, timeout=120, **kwargs)  # type: ignore[arg-type]

    def metric(self, name: str) -> float:
        """The sum of every sample of `name` in /metrics."""
        text = requests.get(f"{self.url}/metrics", headers=self.auth, timeout=10).text
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line.startswith((f"{name} ", f"{name}{{")))

    def health(self) -> dict[str, object]:
        return dict(requests.get(f"{self.url}/health", timeout=10).json())

    def idle_within(self, seconds: float) -> bool:
        """Whether every slot is idle within `seconds` (a reply cancelled ends at its next step)."""
        deadline = time.monotonic() + seconds
        while self.health()["slots_processing"] != 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        return self.health()["slots_processing"] == 0

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)

    @contextmanager
    def busy(self, slots: int, waiting: int = 0) -> Iterator[None]:
        """Holds `slots + waiting` endless streamed replies open until /health shows that many slots
        processing and requests waiting; closes them (the server cancels them) on leaving."""
        release = threading.Event()
        body = {"prompt": "Tell me a very long story.", "max_tokens": 2000, "ignore_eos": True, "stream": True}

        def hold() -> None:
            with self.post("/v1/completions", body, stream=True) as response:
                for _ in response.iter_lines():
                    if release.is_set():
                        return

        expected = {"slots_processing": slots, "requests_waiting": waiting}
        with ThreadPoolExecutor(slots + waiting) as pool:
            held = [pool.submit(hold) for _ in range(slots + waiting)]
            try:
                deadline = time.monotonic() + 120
                while {key: self.health()[key] for key in expected} != expected:
                    assert time.monotonic() < deadline, f"the server never reached {expected}: {self.health()}"
                    time.sleep(0.1)
                yield
            finally:
                release.set()
            for future in held:
                future.result(timeout=120)
        deadline = time.monotonic() + 60
        while self.health()["slots_processing"] != 0 and time.monotonic() < deadline:
            time.sleep(0.1)


def free_loopback_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextmanager
def other_server(name: str, command: list[str], port: int, ready_path: str, log: Path, *, timeout_s: float,
                 env: dict[str, str] | None = None, cwd: Path | None = None) -> Iterator[str]:
    """Another maker's server (`command`, listening on loopback `port`), its output in `log`; yields its
    root URL once `ready_path` answers, and stops it after."""
    with log.open("wb") as out:
        process = subprocess.Popen(command, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if requests.get(f"{url}{ready_path}", timeout=2).ok:
                    break
            except requests.ConnectionError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, f"{name} did not start:\n{log.read_text()[-3000:]}"
            time.sleep(1)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()


def start_server(home: Path, *extra_args: str, env: dict[str, str] | None = None) -> LiveServer:
    """`localchat serve` with the default model (`env` added to the environment); returns once /health answers."""
    port = free_loopback_port()
    command = [sys.executable, "-m", "localchat", "serve", "--port", str(port), "--parallel", str(SLOTS),
               "--queue", str(QUEUE), "--ctx", str(CONTEXT), "--api-key", API_KEY, *extra_args]
    log = home / f"serve-{port}.log"
    with log.open("wb") as stream:
        process = subprocess.Popen(command, env={**os.environ, "LOCALCHAT_HOME": str(home), **(env or {})},
                                   stdout=stream, stderr=subprocess.STDOUT)
    server = LiveServer(f"http://127.0.0.1:{port}", process)
    deadline = time.monotonic() + 120
    while True:
        try:
            if requests.get(f"{server.url}/health", timeout=2).ok:
                return server
        except requests.ConnectionError:
            pass  # not listening yet
        if process.poll() is not None or time.monotonic() > deadline:
            process.kill()
            raise RuntimeError(f"localchat serve did not start:\n{log.read_text()}")
        time.sleep(0.2)


@contextmanager
def serving(app: FastAPI) -> Iterator[str]:
    """`app` (create_app's, as `localchat serve` runs it) on a free loopback port, by uvicorn in a
    thread of this process; yields its API root (http://127.0.0.1:PORT/v1)."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=free_loopback_port(), log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("the app did not start serving")
            time.sleep(0.02)
        yield f"http://127.0.0.1:{server.config.port}/v1"
    finally:
        server.should_exit = True
        thread.join(timeout=60)


class _BusyGateway(http.server.BaseHTTPRequestHandler):
    """A gateway in front of an engine that rate-limits: its model list answers, each request gets
    a 429 with Retry-After 7 (the one answer a local server never gives)."""

    def do_GET(self) -> None:
        self._answer(200, b'{"object": "list", "data": [{"id": "m", "object": "model"}]}')

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        self._answer(429, b'{"error": {"message": "too many requests"}}', {"Retry-After": "7"})

    def _answer(self, status: int, body: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for name, value in {"Content-Type": "application/json", **(headers or {})}.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def busy_gateway() -> Iterator[str]:
    """A rate-limiting gateway on loopback; yields its API root (http://127.0.0.1:PORT/v1)."""
    gateway = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _BusyGateway)
    threading.Thread(target=gateway.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{gateway.server_address[1]}/v1"
    finally:
        gateway.shutdown()
