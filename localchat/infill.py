"""Fill-in-the-middle prompts: the code before and after a gap, in the model's own FIM tokens, for a code
model to write what goes between (editor completion: Continue, Twinny and others through Ollama's `suffix`).

The layout is llama.cpp's server's (its /infill), prefix-suffix-middle: [BOS] FIM_PRE prefix FIM_SUF suffix
FIM_MID, the texts tokenized without special tokens (code that spells `<|fim_middle|>` stays text), but for the
repository header it puts first for a vocabulary with FIM_REP (a placeholder, "myproject"), which Ollama's
templates for the same models leave out, as localchat does for OpenAI's and Ollama's `suffix`. The vocabulary
names the FIM tokens (GGUF's tokenizer.ggml.fim_*_token_id, or llama.cpp finds them by their text), so one layout
serves Qwen2.5-Coder, CodeLlama, StarCoder, DeepSeek-Coder, CodeGemma and Codestral alike.

llama-server's own /infill (the editor plugins llama.vim and llama.vscode) gets its layout whole, header included,
since those plugins were tuned against it: chunks of other files (RepositoryContext) go first, as the paper on
Qwen2.5-Coder's repository-level FIM lays them out (arXiv 2409.12186), then [BOS] and the gap, whose prefix ends
with the text of the cursor's line before it (`middle`):

    [FIM_REP]myproject\n [FIM_SEP]file.py\n chunk ... [FIM_SEP]filename\n [BOS] FIM_PRE prefix middle FIM_SUF suffix FIM_MID

A vocabulary without FIM_SEP gets each chunk after a "--- snippet ---" line instead, and no file name.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from localchat.backends.base import FillInMiddleTokens

# As in llama.cpp's server, the prefix and suffix are cut to fit one window of its default batch, 3:1: the
# text nearest the gap matters most, and the start of a long file would only slow the first token.
INFILL_WINDOW = 2048
PREFIX_SHARE = 3 * (INFILL_WINDOW // 4)
SUFFIX_SHARE = INFILL_WINDOW // 4 - 2


# llama-server's texts around the repository context: a placeholder project name and name of the gap's file, and
# the separator of chunks for a vocabulary without FIM_SEP.
PROJECT_LINE = "myproject\n"
GAP_FILE_LINE = "filename\n"
SNIPPET_SEPARATOR = "\n\n--- snippet ---\n\n"
UNNAMED_FILE = "tmp"


@dataclass(frozen=True)
class RepositoryFile:
    """A chunk of another file of the project (an entry of llama-server's input_extra)."""

    text: str
    filename: str = UNNAMED_FILE


@dataclass(frozen=True)
class RepositoryContext:
    """The project's other files for llama-server's layout, and the most tokens they may take (their last kept)."""

    files: Sequence[RepositoryFile]
    room: int


def repository_room(n_ctx: int, reply_limit: int | None) -> int:
    """llama-server's room for the repository context: the context less one infill window and twice the server's
    reply limit, whose default -1 (none) enters its sum as is."""
    return max(0, n_ctx - INFILL_WINDOW - 2 * (reply_limit if reply_limit is not None else -1))


def infill_prompt(tokenize: Callable[[str], list[int]], fim: FillInMiddleTokens, prefix: str, suffix: str,
                  bos: int | None, *, middle: str = "", repository: RepositoryContext | None = None) -> list[int]:
    """The prompt whose continuation fills the gap between `prefix` + `middle` and `suffix`: the prefix's last
    PREFIX_SHARE tokens, then middle's, and as much of the suffix as the window has left, at most SUFFIX_SHARE
    tokens (`tokenize` reads text as text, no special tokens). `repository`: llama-server's /infill layout."""
    before = tokenize(prefix)[-PREFIX_SHARE:]
    cursor_line = tokenize(middle)
    after = tokenize(suffix)[:max(0, SUFFIX_SHARE - len(cursor_line))]
    context = _repository_tokens(tokenize, fim, repository) if repository is not None else []
    start = [bos] if bos is not None else []
    return [*context, *start, fim.prefix, *before, *cursor_line, fim.suffix, *after, fim.middle]


def _repository_tokens(tokenize: Callable[[str], list[int]], fim: FillInMiddleTokens,
                       repository: RepositoryContext) -> list[int]:
    """The header and the files' chunks, their last `repository.room` tokens."""
    tokens = [fim.repository, *tokenize(PROJECT_LINE)] if fim.repository is not None else []
    for file in repository.files:
        if fim.file_separator is not None:
            tokens += [fim.file_separator, *tokenize(file.filename + "\n")]
        else:
            tokens += tokenize(SNIPPET_SEPARATOR)
        tokens += tokenize(file.text)
    if fim.file_separator is not None:
        tokens += [fim.file_separator, *tokenize(GAP_FILE_LINE)]
    return tokens[max(0, len(tokens) - repository.room):]
