"""`--verify`: load a converted GGUF in llama.cpp and compare it with the checkpoint it came from.

Checks, on a fixed multilingual text: the tokenization equals the Hugging Face tokenizer's; with
torch and transformers installed, greedy continuation and per-position top-1 agreement against
the Hugging Face model; and the perplexity of the result (and of the source model, if loadable).
"""

from __future__ import annotations

import importlib.resources
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localchat.backends.base import Backend, SamplerSettings
from localchat.errors import ModelError

VERIFY_TEXT_ASSET = "verify_text.txt"
GREEDY_TOKENS = 24
VERIFY_CONTEXT = 2048
# Per output type: the least share of greedy tokens and of top-1 predictions that must agree
# with the Hugging Face model. Float and Q8_0 outputs must continue identically.
AGREEMENT_FLOORS: dict[str, tuple[float, float]] = {
    "f32": (1.0, 0.99),
    "f16": (1.0, 0.98),
    "bf16": (1.0, 0.95),
    "q8_0": (1.0, 0.93),
    "q6_k": (0.5, 0.9),
    "q5_k_m": (0.3, 0.85),
    "q4_k_m": (0.2, 0.8),
    "q4_0": (0.2, 0.75),
}


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool | None  # None: skipped, with the reason in `detail`
    detail: str


@dataclass(frozen=True)
class VerifyReport:
    checks: tuple[Check, ...]
    perplexity: float
    reference_perplexity: float | None

    @property
    def passed(self) -> bool:
        return all(check.passed is not False for check in self.checks)

    def table(self) -> str:
        width = max(len(check.name) for check in self.checks)
        verdicts = {True: "pass", False: "FAIL", None: "skip"}
        return "\n".join(f"{check.name:<{width}}  {verdicts[check.passed]}  {check.detail}" for check in self.checks)


def verify_text() -> str:
    return importlib.resources.files("localchat.assets").joinpath(VERIFY_TEXT_ASSET).read_text(encoding="utf-8")


def reference_tokenize(checkpoint: Path, text: str) -> list[int]:
    """The Hugging Face tokenization of `text`, no special tokens added (tokenizers or sentencepiece)."""
    if (checkpoint / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        return Tokenizer.from_file(str(checkpoint / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    if (checkpoint / "tokenizer.model").is_file():
        from sentencepiece import SentencePieceProcessor

        return SentencePieceProcessor(model_file=str(checkpoint / "tokenizer.model")).encode(text)
    raise ModelError(f"{checkpoint} has no tokenizer.json or tokenizer.model to verify against")


def _first_difference(a: Sequence[int], b: Sequence[int]) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def greedy_continuation(backend: Backend, prompt: Sequence[int], n: int) -> list[int]:
    sampler = backend.make_sampler(SamplerSettings(temperature=0))
    try:
        backend.truncate(0, 0)
        backend.evaluate(0, prompt, 0)
        produced: list[int] = []
        for _ in range(n):
            token = backend.sample(0, sampler)
            produced.append(token)
            backend.evaluate(0, [token], len(prompt) + len(produced) - 1)
        return produced
    finally:
        sampler.close()


class ReferenceModel:
    """The checkpoint in transformers, float32 on the CPU (needs the `convert` extra)."""

    def __init__(self, checkpoint: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM

        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32, attn_implementation="eager")
        self.model.eval()

    def logprobs_and_top1(self, tokens: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        with self.torch.inference_mode():
            logits = self.model(self.torch.tensor([list(tokens)])).logits[0, :-1]
            targets = self.torch.tensor(list(tokens[1:]))
            chosen = logits[self.torch.arange(len(targets)), targets].double()
            logprobs = chosen - logits.double().logsumexp(-1)
        return logprobs.numpy(), logits.argmax(-1).numpy()

    def greedy(self, prompt: Sequence[int], n: int) -> list[int]:
        torch = self.torch
        produced: list[int] = []
        with torch.inference_mode():
            out = self.model(torch.tensor([list(prompt)]), use_cache=True)
            for _ in range(n):
                token = int(out.logits[0, -1].argmax())
                produced.append(token)
                out = self.model(torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True)
        return produced


def transformers_available() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in ("torch", "transformers"))


def verify_gguf(gguf_path: Path, checkpoint: Path, quant: str, text: str | None = None) -> VerifyReport:
    """Compare `gguf_path` with the checkpoint it was converted from."""
    from localchat.engine import Engine
    from localchat.planner import PlanRequest
    from localchat.settings import Settings

    text = text if text is not None else verify_text()
    greedy_floor, top1_floor = AGREEMENT_FLOORS[quant]
    checks: list[Check] = []
    with Engine.load(str(gguf_path), Settings(prefix_cache_disk_bytes=0), PlanRequest(n_ctx=VERIFY_CONTEXT)) as engine:
        backend = engine.backend
        ours = backend.tokenize(text, add_bos=False, special=False)
        theirs = reference_tokenize(checkpoint, text)
        same = ours == theirs
        where = _first_difference(ours, theirs)
        checks.append(
            Check(
                "tokenization",
                same,
                f"{len(ours)} tokens, identical" if same else f"differs at token {where}: llama.cpp {ours[where:where + 4]} vs HF {theirs[where:where + 4]}",
            )
        )
        bos = [backend.info.bos_id] if backend.info.add_bos and backend.info.bos_id is not None else []
        tokens = bos + theirs
        scores = backend.score(0, tokens)
        prompt = bos + reference_tokenize(checkpoint, text.splitlines()[0])
        ours_greedy = greedy_continuation(backend, prompt, GREEDY_TOKENS)
    reference_ppl = None
    if transformers_available():
        reference = ReferenceModel(checkpoint)
        ref_logprobs, ref_top1 = reference.logprobs_and_top1(tokens)
        reference_ppl = float(np.exp(-ref_logprobs.mean()))
        agreement = float((ref_top1 == scores.top1).mean())
        checks.append(Check("top-1 agreement", agreement >= top1_floor, f"{agreement:.1%} of {len(ref_top1)} positions (floor {top1_floor:.0%})"))
        theirs_greedy = reference.greedy(prompt, GREEDY_TOKENS)
        matching = _first_difference(ours_greedy, theirs_greedy)
        checks.append(
            Check(
                "greedy continuation",
                matching / GREEDY_TOKENS >= greedy_floor,
                f"{matching}/{GREEDY_TOKENS} tokens identical before the first difference (floor {greedy_floor:.0%})",
            )
        )
    else:
        reason = "torch and transformers not installed (pip install 'localchat[convert]')"
        checks += [Check("top-1 agreement", None, reason), Check("greedy continuation", None, reason)]
    ppl = scores.perplexity
    relative = f" vs {reference_ppl:.3f} in transformers ({ppl / reference_ppl - 1:+.2%})" if reference_ppl else ""
    checks.append(Check("perplexity", bool(np.isfinite(ppl)), f"{ppl:.3f} on {len(tokens)} tokens{relative}"))
    return VerifyReport(tuple(checks), ppl, reference_ppl)
