"""Fill-in-the-middle prompts: the code before and after a gap, in the model's own FIM tokens, for a code
model to write what goes between (editor completion: Continue, Twinny and others through Ollama's `suffix`).

The layout is llama.cpp's server's (its /infill), prefix-suffix-middle: [BOS] FIM_PRE prefix FIM_SUF suffix
FIM_MID, the texts tokenized without special tokens (code that spells `<|fim_middle|>` stays text), but for the
repository header it puts first for a vocabulary with FIM_REP (a placeholder, "myproject"), which Ollama's
templates for the same models leave out, as localchat does. The vocabulary names the FIM tokens (GGUF's
tokenizer.ggml.fim_*_token_id, or llama.cpp finds them by their text), so one layout serves Qwen2.5-Coder,
CodeLlama, StarCoder, DeepSeek-Coder, CodeGemma and Codestral alike.
"""

from __future__ import annotations

from collections.abc import Callable

from localchat.backends.base import FillInMiddleTokens

# As in llama.cpp's server, the prefix and suffix are cut to fit one window of its default batch, 3:1: the
# text nearest the gap matters most, and the start of a long file would only slow the first token.
INFILL_WINDOW = 2048
PREFIX_SHARE = 3 * (INFILL_WINDOW // 4)
SUFFIX_SHARE = INFILL_WINDOW // 4 - 2


def infill_prompt(tokenize: Callable[[str], list[int]], fim: FillInMiddleTokens, prefix: str, suffix: str,
                  bos: int | None) -> list[int]:
    """The prompt whose continuation fills the gap between `prefix` and `suffix`: the prefix's last
    PREFIX_SHARE tokens and the suffix's first SUFFIX_SHARE (`tokenize` reads text as text, no special tokens)."""
    before = tokenize(prefix)[-PREFIX_SHARE:]
    after = tokenize(suffix)[:SUFFIX_SHARE]
    start = [bos] if bos is not None else []
    return [*start, fim.prefix, *before, fim.suffix, *after, fim.middle]
