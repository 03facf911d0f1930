"""The fill-in-the-middle layout (localchat.infill), over a tokenizer of one token a character, and once over the
default model's."""

from __future__ import annotations

from localchat.backends.base import FillInMiddleTokens
from localchat.engine import Engine
from localchat.infill import (
    INFILL_WINDOW,
    PREFIX_SHARE,
    SUFFIX_SHARE,
    RepositoryContext,
    RepositoryFile,
    infill_prompt,
    repository_room,
)

FIM = FillInMiddleTokens(prefix=-1, suffix=-2, middle=-3)


def by_character(text: str) -> list[int]:
    return [ord(character) for character in text]


def test_prefix_suffix_middle_with_bos_first() -> None:
    assert infill_prompt(by_character, FIM, "ab", "c", bos=None) == [-1, 97, 98, -2, 99, -3]
    assert infill_prompt(by_character, FIM, "ab", "c", bos=-9) == [-9, -1, 97, 98, -2, 99, -3]
    assert infill_prompt(by_character, FIM, "", "", bos=None) == [-1, -2, -3]


def test_a_long_file_keeps_the_text_nearest_the_gap() -> None:
    """As llama.cpp's server: the prefix's end and the suffix's start, 3:1 in a 2048-token window."""
    prefix, suffix = "x" * (PREFIX_SHARE + 100) + "y", "z" + "w" * (SUFFIX_SHARE + 100)
    prompt = infill_prompt(by_character, FIM, prefix, suffix, bos=None)
    assert len(prompt) == PREFIX_SHARE + SUFFIX_SHARE + 3
    assert prompt[PREFIX_SHARE] == ord("y") and prompt[PREFIX_SHARE + 2] == ord("z")
    assert prompt.index(-2) == PREFIX_SHARE + 1 and prompt[-1] == -3


REPO_FIM = FillInMiddleTokens(prefix=-1, suffix=-2, middle=-3, repository=-4, file_separator=-5)


def test_the_cursor_line_ends_the_prefix_and_shortens_the_suffix() -> None:
    """llama-server's /infill `prompt` goes after the prefix, and the suffix gets the window's quarter less it."""
    assert infill_prompt(by_character, FIM, "ab", "c", bos=None, middle="d") == [-1, 97, 98, 100, -2, 99, -3]
    prompt = infill_prompt(by_character, FIM, "", "w" * SUFFIX_SHARE, bos=None, middle="xyz")
    assert prompt.count(ord("w")) == SUFFIX_SHARE - 3


def test_repository_context_goes_first_with_a_header_and_file_names() -> None:
    """[FIM_REP]myproject\\n [FIM_SEP]name\\n text ... [FIM_SEP]filename\\n, then BOS and the gap, as llama-server."""
    files = [RepositoryFile("x=1\n", "a.py"), RepositoryFile("y\n")]
    prompt = infill_prompt(by_character, REPO_FIM, "p", "s", bos=-9, repository=RepositoryContext(files, room=1000))
    assert prompt == [-4, *by_character("myproject\n"), -5, *by_character("a.py\nx=1\n"), -5, *by_character("tmp\ny\n"),
                      -5, *by_character("filename\n"), -9, -1, ord("p"), -2, ord("s"), -3]
    # No files: the header and the gap's file name all the same.
    empty = infill_prompt(by_character, REPO_FIM, "p", "s", bos=None, repository=RepositoryContext([], room=1000))
    assert empty == [-4, *by_character("myproject\n"), -5, *by_character("filename\n"), -1, ord("p"), -2, ord("s"), -3]


def test_a_vocabulary_without_file_separators_gets_snippet_lines() -> None:
    rep_only = FillInMiddleTokens(prefix=-1, suffix=-2, middle=-3, repository=-4)
    prompt = infill_prompt(by_character, rep_only, "", "", bos=None,
                           repository=RepositoryContext([RepositoryFile("z", "a.py")], room=1000))
    assert prompt == [-4, *by_character("myproject\n\n\n--- snippet ---\n\nz"), -1, -2, -3]


def test_repository_context_keeps_its_last_tokens_within_its_room() -> None:
    files = [RepositoryFile("0123456789", "a")]
    prompt = infill_prompt(by_character, REPO_FIM, "", "", bos=None, repository=RepositoryContext(files, room=12))
    assert prompt == [*by_character("89"), -5, *by_character("filename\n"), -1, -2, -3]
    assert infill_prompt(by_character, REPO_FIM, "", "", bos=None,
                         repository=RepositoryContext(files, room=0)) == [-1, -2, -3]


def test_the_room_is_llama_servers() -> None:
    """The context less a window and twice the reply limit; llama-server's default limit -1 adds 2."""
    assert repository_room(4096, None) == 4096 - INFILL_WINDOW + 2
    assert repository_room(4096, 128) == 4096 - INFILL_WINDOW - 256
    assert repository_room(2048, 128) == 0


def test_the_layout_is_llama_servers_prompt_with_the_real_tokenizer(engine: Engine) -> None:
    """With SmolLM2's tokenizer and its <repo_name>, <file_sep> and chat tokens as FIM tokens: the tokens equal
    those of the prompt llama-server's /infill shows for the same request (its `prompt` field, which reads back
    as the same tokens here: every text starts or ends at a control token or a line)."""
    backend = engine.backend
    fim = FillInMiddleTokens(prefix=1, suffix=2, middle=1, repository=3, file_separator=5)

    def text(value: str) -> list[int]:
        return backend.tokenize(value, add_bos=False, special=False)

    files = [RepositoryFile("x = 1\n", "a.py"), RepositoryFile("def f():\n    pass\n")]
    prompt = infill_prompt(text, fim, "def add(a, b):\n", "\n\nprint(add(1, 2))\n", None, middle="return",
                           repository=RepositoryContext(files, room=repository_room(4096, None)))
    shown = ("<repo_name>myproject\n<file_sep>a.py\nx = 1\n<file_sep>tmp\ndef f():\n    pass\n<file_sep>filename\n"
             "<|im_start|>def add(a, b):\nreturn<|im_end|>\n\nprint(add(1, 2))\n<|im_start|>")
    assert prompt == backend.tokenize(shown, add_bos=False, special=True)
    assert len(prompt) == 50  # llama-server's tokens_evaluated for this request (measured once)
