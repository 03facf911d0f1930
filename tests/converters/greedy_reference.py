"""transformers as the reference for llama.cpp's greedy tokens: its continuation of the verify text's
first line, with the gap between its top two logits at each step, compared up to its first near tie; and
the checks every converted family takes (it runs like transformers, a setting llama.cpp runs otherwise is refused)."""

from __future__ import annotations

import json
import shutil
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from localchat.backends.base import TokenScores
from localchat.converters.gguf import convert_checkpoint
from localchat.converters.verify import BOUNDS, ReferenceModel, greedy_continuation, reference_tokenize, verify_text
from localchat.engine import Engine
from localchat.errors import ModelError
from localchat.planner import PlanRequest
from localchat.settings import Settings

# The verify text without its lines that hold combining marks: llama.cpp's tekken and gpt-4o pre-tokenizers split a word
# before each combining mark, which the tokenizers they stand for keep with its letter.
WITHOUT_COMBINING_MARKS = "\n".join(
    line for line in verify_text().splitlines() if not any(unicodedata.category(c).startswith("M") for c in line)
)
GREEDY_TOKENS = 24
# transformers' top two logits closer than this are a near tie: llama.cpp (its F16 KV cache, F16
# activations) may take either, and from there the continuations part for good. Measured on these
# checkpoints (AMD EPYC): llama.cpp's logits differ from transformers' by at most 0.07, F32 or F16;
# a conversion bug (a wrong expert order, a missing multiplier) moves them by whole units.
NEAR_TIE = 0.2
MIN_COMPARED = 12
CONTEXT = 1024  # the verify text (576 tokens here) fits; no more than phi4-mini's original context


@dataclass(frozen=True)
class ReferenceRun:
    """transformers on the verify text: its greedy continuation of the first line, with the gap
    between the top two logits at each step, and its perplexity over the whole text."""

    prompt: list[int]
    tokens: list[int]
    gaps: list[float]
    text_tokens: list[int]
    perplexity: float
    logprobs: np.ndarray  # of each of text_tokens after the first


@cache
def reference_run(checkpoint: Path) -> ReferenceRun:
    import torch

    reference = ReferenceModel(checkpoint)
    bos = [int(reference.model.config.get_text_config().bos_token_id)]
    prompt = bos + reference_tokenize(checkpoint, verify_text().splitlines()[0])
    tokens, gaps = [], []
    with torch.inference_mode():
        out = reference.model(torch.tensor([prompt]), use_cache=True)
        for _ in range(GREEDY_TOKENS):
            top = torch.topk(out.logits[0, -1], 2)
            tokens.append(int(top.indices[0]))
            gaps.append(float(top.values[0] - top.values[1]))
            out = reference.model(torch.tensor([[tokens[-1]]]), past_key_values=out.past_key_values, use_cache=True)
    text_tokens = bos + reference_tokenize(checkpoint, verify_text())
    logprobs, _ = reference.logprobs_and_top1(text_tokens)
    return ReferenceRun(prompt, tokens, gaps, text_tokens, float(np.exp(-logprobs.mean())), logprobs)


def compared_until_near_tie(reference: ReferenceRun, ours: list[int]) -> int:
    """How many of `ours` equal transformers' greedy tokens, checked up to its first near tie."""
    tie = next((i for i, gap in enumerate(reference.gaps) if gap < NEAR_TIE), len(reference.gaps))
    assert ours[:tie] == reference.tokens[:tie], f"parted before the first near tie (step {tie}): {ours} != {reference.tokens}"
    assert tie >= MIN_COMPARED, f"only {tie} tokens compared before a near tie; the checkpoint's seed makes it too unsure"
    return tie


def logprob_distance(a: np.ndarray, b: np.ndarray) -> float:
    """The mean difference of two models' log-probabilities of the same tokens."""
    return float(np.mean(np.abs(a - b)))


def load(path: Path, **kwargs: object) -> Engine:
    """A converted model in llama.cpp, as the comparisons run it."""
    return Engine.load(str(path), Settings(prefix_cache_disk_bytes=0), PlanRequest(n_ctx=CONTEXT, n_threads=2), **kwargs)


def converted_runs_like_transformers(
    checkpoint: Path, output: Path, quant: str, tokenized: str | None = None, *, reference_checkpoint: Path | None = None,
    perplexity_bound: float | None = None,
) -> tuple[ReferenceRun, TokenScores]:
    """`checkpoint` converted to `output` at `quant` and run by llama.cpp: its tokenizer as transformers' (on `tokenized`
    where given: the verify text without what llama.cpp's pre-tokenizer for it splits otherwise, or with text that tells
    its pre-tokenizer from others), its greedy tokens as transformers' up to the first near tie, its perplexity within the
    type's bounds (or `perplexity_bound`). transformers runs `reference_checkpoint` where given (the same weights in a form
    it reads as they are: an MXFP4 checkpoint's, dequantized). Returns transformers' run and llama.cpp's scores of the text,
    for a closer look."""
    convert_checkpoint(checkpoint, output, quant, threads=2)
    reference_checkpoint = reference_checkpoint or checkpoint
    reference = reference_run(reference_checkpoint)
    text = verify_text() if tokenized is None else tokenized
    bound = BOUNDS[quant].perplexity if perplexity_bound is None else perplexity_bound
    with load(output) as engine:
        backend = engine.backend
        assert backend.tokenize(text, add_bos=False, special=False) == reference_tokenize(reference_checkpoint, text)
        ours = greedy_continuation(backend, reference.prompt, GREEDY_TOKENS)
        scores = backend.score(0, reference.text_tokens)
    compared_until_near_tie(reference, ours)
    assert abs(scores.perplexity / reference.perplexity - 1) <= bound, (scores.perplexity, reference.perplexity)
    return reference, scores


def gguf_contents(path: Path) -> tuple[dict[str, object], dict[str, bytes]]:
    """A GGUF's keys but its general.* ones, and its tensors' bytes, by name."""
    from gguf import GGUFReader

    reader = GGUFReader(path)
    keys = {field.name: field.contents() for field in reader.fields.values() if not field.name.startswith(("general.", "GGUF."))}
    return keys, {tensor.name: tensor.data.tobytes() for tensor in reader.tensors}


def assert_conversion_refused(checkpoint: Path, edit: Callable[[dict], None], message: str, tmp_path: Path) -> None:
    """A copy of `checkpoint` with its config.json edited by `edit` is refused in one line matching `message`,
    leaving no output file."""
    folder = tmp_path / checkpoint.name
    shutil.copytree(checkpoint, folder)
    config = json.loads((folder / "config.json").read_text())
    edit(config)
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelError, match=message) as raised:
        convert_checkpoint(folder, tmp_path / "out.gguf", "f16", threads=2)
    assert "\n" not in str(raised.value)
    assert not list(tmp_path.glob("out.gguf*"))
