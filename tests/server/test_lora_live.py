"""`localchat serve --lora` for real: a tiny Llama and a PEFT adapter converted to GGUF, served by a
`localchat serve` process; each request's adapters apply to its reply alone, concurrent replies with
different adapters included, and each reply equals the same model and adapter run in this process
(the same evaluations: one prompt, then one token per step)."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from live_server import start_server
from localchat.adapters import LoraSpec
from localchat.backends.base import ARGMAX
from localchat.converters.gguf import convert_checkpoint
from localchat.converters.lora import convert_adapter
from localchat.engine import Engine
from localchat.planner import PlanRequest
from localchat.session import GenerationSettings
from localchat.settings import Settings

PROMPT = "The quick brown fox"
TOKENS = 16
# Greedy with no penalties: what ARGMAX samples in process.
GREEDY = {"temperature": 0, "repeat_penalty": 1.0, "dry_multiplier": 0.0, "ignore_eos": True}


def in_process(model: Path, loras: list[LoraSpec]) -> str:
    with Engine.load(str(model), Settings(prefix_cache_disk_bytes=0), PlanRequest(n_ctx=512, n_threads=2), loras=loras) as engine:
        prompt = engine.backend.tokenize(PROMPT, add_bos=engine.backend.info.add_bos, special=False)
        return engine.sessions[0].generate(prompt, GenerationSettings(max_tokens=TOKENS, sampler=ARGMAX, ignore_eos=True)).text()


def test_served_model_applies_each_requests_adapters(
    localchat_home: Path, tiny_checkpoint: Callable[[str], Path], tiny_lora: Callable[[str], tuple[Path, Path]], tmp_path: Path
) -> None:
    model = convert_checkpoint(tiny_checkpoint("llama"), tmp_path / "llama.gguf", "f16", threads=2).output
    lora = convert_adapter(tiny_lora("llama")[0], tmp_path / "adapter.gguf").output
    expected = {"tuned": in_process(model, [LoraSpec(lora)]), "half": in_process(model, [LoraSpec(lora, 0.5)]),
                "plain": in_process(model, [])}
    assert len(set(expected.values())) == 3, "the adapter must change the reply, or this proves nothing"
    server = start_server(localchat_home, "-m", str(model), "--lora", str(lora), "--lookup-draft", "0", "--threads", "2")
    try:
        client = server.client()
        lists = {"tuned": None, "half": [{"id": 0, "scale": 0.5}], "plain": []}

        def reply(kind: str) -> str:
            extra = GREEDY | ({} if lists[kind] is None else {"lora": lists[kind]})
            return client.completions.create(model="llama", prompt=PROMPT, max_tokens=TOKENS, extra_body=extra).choices[0].text

        assert {kind: reply(kind) for kind in lists} == expected
        with ThreadPoolExecutor(3) as pool:  # decoded at once, in turns: one batch per set of adapters
            assert dict(zip(lists, pool.map(reply, lists))) == expected
        adapters = server.post("/lora-adapters", [{"id": 0, "scale": 0.5}]).json()
        assert adapters == {"success": True} and reply("tuned") == expected["half"]
    finally:
        server.stop()
