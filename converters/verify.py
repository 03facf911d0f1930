"""`--verify`: load a converted GGUF in llama.cpp and compare it with the checkpoint it came from.

Checks, on a fixed multilingual text: the tokenization equals the Hugging Face tokenizer's; with
torch and transformers installed, greedy continuation, per-position top-1 agreement and perplexity
against the Hugging Face model, each within the bounds of the output type (`BOUNDS`). A check
that cannot run (no transformers) is SKIPPED with the reason, never counted as passed.
"""

from __future__ import annotations

import importlib.resources
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localchat.backends.base import ARGMAX, Backend
from localchat.errors import ModelError

VERIFY_TEXT_ASSET = "verify_text.txt"
GREEDY_TOKENS = 24
VERIFY_CONTEXT = 2048


@dataclass(frozen=True)
class Bounds:
    """What `--verify` accepts for one output type, against the checkpoint in transformers."""

    greedy: float  # least share of greedy tokens identical before the first difference
    top1: float  # least share of positions whose most likely next token agrees
    perplexity: float  # most relative difference of the perplexity, either way
    # Where transformers' top logits lie this close to our greedy pick, the pick counts as equal
    # (`ReferenceModel.greedy_following`): rounding moves them that much.
    near_tie: float = 0.0


# Where transformers' two best tokens lie closer than the rounding of an output type moves the gap
# between them, either may be our greedy pick, differently per CPU (its kernels round apart). Measured
# (AMD EPYC, AVX-512), the most the gap between transformers' top two moved, over 300 positions of the
# verify text on each of the tiny random test checkpoints (llama, mistral, qwen2, qwen3, gemma3; random
# weights round worst) and 124 on Gemma 3 270M's: f32 0.08, f16 0.07, bf16 0.40, q8_0 1.06 (Gemma 3 270M:
# 0.006, 0.012, 0.068, 0.33). The tiny checkpoints have transformers' top two within 0.05 at 4-9 of 300
# positions, so an exact greedy match across 24 tokens held on one CPU and not another. The margins
# are about twice the measured movement; a conversion bug moves logits by whole units.
NEAR_TIE_F32 = 0.15
NEAR_TIE_BF16 = 0.75
NEAR_TIE_Q8_0 = 2.0
# Gemma 3 270M's int4 ONNX moves the gap between fp32's top two logits by 0.26-0.29 (median) and
# 0.8 (90th percentile) on the verify text; the verify prompt's third token has transformers' top
# three within 0.39, and int4 conversions differing only in their int8 activations' rounding took
# the first or the third.
NEAR_TIE_4BIT = 0.5
# Float and Q8_0 outputs must continue identically (up to near ties). Perplexity, relative to transformers' on the
# verify text, measured (AMD EPYC, AVX-512): Gemma 3 270M f32 +0.005%, f16 +0.01%, bf16 +0.006%,
# q8_0 +0.6%, q6_k +3.4%, q5_k_m +6.3%, q4_k_m +0.6%, q4_0 +94% (that checkpoint is dequantized
# from a Q4_K_M file: other grids quantize it twice, and q4_0 fails, as its top-1 does); the tiny
# random test checkpoints at most f32 0.04%, f16 0.06%, bf16 0.5%, q8_0 1.1%, q4_k_m 5.7%, q4_0 24%.
# The bounds leave several times that room for other CPUs' kernels (AVX2, AMX); a conversion bug
# (a norm off by 2%) moved the tiny models' perplexity by 40-1000%.
BOUNDS: dict[str, Bounds] = {
    "f32": Bounds(1.0, 0.99, 0.002, NEAR_TIE_F32),
    "f16": Bounds(1.0, 0.98, 0.005, NEAR_TIE_F32),
    "bf16": Bounds(1.0, 0.95, 0.02, NEAR_TIE_BF16),
    "q8_0": Bounds(1.0, 0.93, 0.03, NEAR_TIE_Q8_0),
    "q6_k": Bounds(0.5, 0.9, 0.08, NEAR_TIE_Q8_0),
    "q5_k_m": Bounds(0.3, 0.85, 0.15, NEAR_TIE_Q8_0),
    "q4_k_m": Bounds(0.2, 0.8, 0.3, NEAR_TIE_4BIT),
    "q4_0": Bounds(0.2, 0.75, 0.5, NEAR_TIE_4BIT),
}
VERDICTS = {True: "pass", False: "FAIL", None: "SKIPPED"}


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool | None  # None: could not be checked, with the reason in `detail`
    detail: str  # what was compared, against what bound


@dataclass(frozen=True)
class VerifyReport:
    checks: tuple[Check, ...]
    perplexity: float
    reference_perplexity: float | None

    @property
    def passed(self) -> bool:
        """Every check ran and passed (a skipped check is not a pass)."""
        return all(check.passed is True for check in self.checks)

    @property
    def failed(self) -> bool:
        return any(check.passed is False for check in self.checks)

    def table(self) -> str:
        width = max(len(check.name) for check in self.checks)
        return "\n".join(f"{check.name:<{width}}  {VERDICTS[check.passed]:<7}  {check.detail}" for check in self.checks)

    def summary(self) -> str:
        n = len(self.checks)
        failed = [check.name for check in self.checks if check.passed is False]
        skipped = [check.name for check in self.checks if check.passed is None]
        if failed:
            return f"verify: FAILED {len(failed)} of {n} checks ({', '.join(failed)})"
        if skipped:
            return f"verify: NOT fully verified: {n - len(skipped)} of {n} checks passed, {len(skipped)} SKIPPED ({', '.join(skipped)})"
        return f"verify: all {n} checks passed"


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
    # The model's own top token each step: penalties would make it differ from transformers' argmax.
    sampler = backend.make_sampler(ARGMAX)
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


def text_model_class(model_type: str) -> type:
    """transformers' auto class that runs a model of `model_type` on text: its causal LM's, or for a model that
    transformers lists as image-text only (Mistral 3), that one's, which runs text alone too."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return AutoModelForCausalLM if model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES else AutoModelForImageTextToText


class ReferenceModel:
    """The checkpoint in transformers, float32 on the CPU (needs the `convert` extra)."""

    def __init__(self, checkpoint: Path) -> None:
        import torch
        from transformers import AutoConfig

        self.torch = torch
        auto = text_model_class(AutoConfig.from_pretrained(checkpoint).model_type)
        self.model = auto.from_pretrained(checkpoint, dtype=torch.float32, attn_implementation="eager")
        self.model.eval()

    def logprobs_and_top1(self, tokens: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        with self.torch.inference_mode():
            logits = self.model(self.torch.tensor([list(tokens)])).logits[0, :-1]
            targets = self.torch.tensor(list(tokens[1:]))
            chosen = logits[self.torch.arange(len(targets)), targets].double()
            logprobs = chosen - logits.double().logsumexp(-1)
        return logprobs.numpy(), logits.argmax(-1).numpy()

    def greedy(self, prompt: Sequence[int], n: int) -> list[int]:
        return self.greedy_following(prompt, n, (), 0.0)[0]

    def greedy_following(self, prompt: Sequence[int], n: int, other: Sequence[int], tie: float) -> tuple[list[int], list[int]]:
        """The greedy continuation, except that where `other` (another model's continuation so far
        equal) picks a token within `tie` logits of the top one, it takes that token: (tokens, the
        steps where it did)."""
        torch = self.torch
        produced: list[int] = []
        followed: list[int] = []
        with torch.inference_mode():
            out = self.model(torch.tensor([list(prompt)]), use_cache=True)
            for step in range(n):
                logits = out.logits[0, -1]
                token = int(logits.argmax())
                same_so_far = list(other[:step]) == produced
                if step < len(other) and other[step] != token and same_so_far and float(logits[token] - logits[other[step]]) <= tie:
                    token = other[step]
                    followed.append(step)
                produced.append(token)
                out = self.model(torch.tensor([[token]]), past_key_values=out.past_key_values, use_cache=True)
        return produced, followed


def transformers_available() -> bool:
    return all(importlib.util.find_spec(name) is not None for name in ("torch", "transformers"))


def load_reference(checkpoint: Path) -> ReferenceModel | str:
    """The checkpoint in transformers, or why it cannot be had."""
    if not transformers_available():
        return "torch and transformers are not installed (pip install 'localchat[convert]')"
    try:
        return ReferenceModel(checkpoint)
    except (OSError, ValueError) as error:
        return f"transformers cannot load the checkpoint ({type(error).__name__}: {error})"


def perplexity_check(perplexity: float, reference: float | None, bound: float, n_tokens: int, why_none: str = "") -> Check:
    """The result's perplexity against transformers', within `bound` either way."""
    measured = f"{perplexity:.3f} on {n_tokens} tokens"
    if not np.isfinite(perplexity):
        return Check("perplexity", False, f"{measured}: not a finite number")
    if reference is None:
        return Check("perplexity", None, f"{measured}; no transformers perplexity to compare it with: {why_none}")
    change = perplexity / reference - 1
    return Check(
        "perplexity",
        abs(change) <= bound,
        f"{measured} vs {reference:.3f} in transformers: {change:+.2%} (bound ±{bound:.1%})",
    )


def verify_gguf(gguf_path: Path, checkpoint: Path, quant: str, text: str | None = None) -> VerifyReport:
    """Compare `gguf_path` with the checkpoint it was converted from."""
    from localchat.engine import Engine
    from localchat.planner import PlanRequest
    from localchat.settings import Settings

    text = text if text is not None else verify_text()
    bounds = BOUNDS[quant]
    checks: list[Check] = []
    with Engine.load(str(gguf_path), Settings(prefix_cache_disk_bytes=0), PlanRequest(n_ctx=VERIFY_CONTEXT)) as engine:
        backend = engine.backend
        ours = backend.tokenize(text, add_bos=False, special=False)
        theirs = reference_tokenize(checkpoint, text)
        where = _first_difference(ours, theirs)
        checks.append(
            Check(
                "tokenization",
                ours == theirs,
                f"{len(ours)} tokens, identical to the Hugging Face tokenizer's" if ours == theirs
                else f"differs from the Hugging Face tokenizer at token {where}: llama.cpp {ours[where:where + 4]} vs HF {theirs[where:where + 4]}",
            )
        )
        bos = [backend.info.bos_id] if backend.info.add_bos and backend.info.bos_id is not None else []
        tokens = bos + theirs
        scores = backend.score(0, tokens)
        prompt = bos + reference_tokenize(checkpoint, text.splitlines()[0])
        ours_greedy = greedy_continuation(backend, prompt, GREEDY_TOKENS)
    reference = load_reference(checkpoint)
    reference_ppl = None
    if isinstance(reference, str):
        checks += [Check("top-1 agreement", None, reference), Check("greedy continuation", None, reference)]
    else:
        ref_logprobs, ref_top1 = reference.logprobs_and_top1(tokens)
        reference_ppl = float(np.exp(-ref_logprobs.mean()))
        agreement = float((ref_top1 == scores.top1).mean())
        checks.append(
            Check(
                "top-1 agreement",
                agreement >= bounds.top1,
                f"{agreement:.1%} of {len(ref_top1)} next-token predictions equal transformers' (floor {bounds.top1:.0%})",
            )
        )
        theirs, ties = reference.greedy_following(prompt, GREEDY_TOKENS, ours_greedy, bounds.near_tie)
        matching = _first_difference(ours_greedy, theirs)
        at_ties = f"; {len(ties)} of ours within {bounds.near_tie} logits of its top one taken as equal" if ties else ""
        checks.append(
            Check(
                "greedy continuation",
                matching / GREEDY_TOKENS >= bounds.greedy,
                f"{matching}/{GREEDY_TOKENS} greedy tokens equal transformers' before the first difference (floor {bounds.greedy:.0%}){at_ties}",
            )
        )
    why_none = reference if isinstance(reference, str) else ""
    checks.append(perplexity_check(scores.perplexity, reference_ppl, bounds.perplexity, len(tokens), why_none))
    return VerifyReport(tuple(checks), scores.perplexity, reference_ppl)
