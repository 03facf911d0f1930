"""Facts derived from a model file are kept under its identity and derived again when it changes: the
logic on small files, then the two real uses (a GGUF header, llama.cpp's end-of-generation tokens)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from localchat import file_facts, gguf_file
from localchat.backends import llamacpp_natives
from localchat.engine import Engine
from localchat.errors import ModelError
from localchat.file_facts import FileVersion, remembered


class Derivations:
    """A derivation that counts its calls and says what the file holds."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.calls = 0

    def __call__(self) -> dict[str, str]:
        self.calls += 1
        return {"text": self.path.read_text()}


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files count as settled as soon as written (they are written during the test)."""
    monkeypatch.setattr(file_facts, "SETTLED_S", 0.0)


def test_a_fact_is_derived_once_per_version_of_a_file(tmp_path: Path, settled: None) -> None:
    model = tmp_path / "model.gguf"
    model.write_text("one")
    derive = Derivations(model)
    assert remembered(model, "kind", derive, folder=tmp_path / "facts") == {"text": "one"}
    assert remembered(model, "kind", derive, folder=tmp_path / "facts") == {"text": "one"} and derive.calls == 1
    # Another kind of fact about the same file is its own.
    assert remembered(model, "other kind", Derivations(model), folder=tmp_path / "facts") == {"text": "one"}
    model.write_text("two!")
    assert remembered(model, "kind", derive, folder=tmp_path / "facts") == {"text": "two!"} and derive.calls == 2


def test_facts_are_what_json_reads_back_the_first_time_too(tmp_path: Path, settled: None) -> None:
    model = tmp_path / "model.gguf"
    model.write_text("text")
    first = remembered(model, "kind", lambda: {"shape": (1, 2), 3: "three"}, folder=tmp_path / "facts")
    assert first == remembered(model, "kind", lambda: None, folder=tmp_path / "facts") == {"shape": [1, 2], "3": "three"}


def test_facts_derived_from_a_file_since_replaced_are_kept_for_the_version_read(tmp_path: Path, settled: None) -> None:
    """A model loaded from one file while another takes its place (an atomic rename) keeps its facts under the
    version it was loaded from, so the new file's are derived."""
    model = tmp_path / "model.gguf"
    model.write_text("old")
    loaded_from = FileVersion.of(model)
    replacement = tmp_path / "model.gguf.part"
    replacement.write_text("new!")
    replacement.replace(model)
    assert remembered(model, "kind", lambda: "old facts", version=loaded_from, folder=tmp_path / "facts") == "old facts"
    derive = Derivations(model)
    assert remembered(model, "kind", derive, folder=tmp_path / "facts") == {"text": "new!"} and derive.calls == 1


def test_a_file_changed_just_now_is_not_remembered(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(file_facts, "SETTLED_S", 3600.0)
    model = tmp_path / "model.gguf"
    model.write_text("fresh")
    derive = Derivations(model)
    for _ in range(2):
        assert remembered(model, "kind", derive, folder=tmp_path / "facts") == {"text": "fresh"}
    assert derive.calls == 2 and not (tmp_path / "facts").exists()


def test_a_failed_derivation_or_a_damaged_entry_is_not_taken_for_a_fact(tmp_path: Path, settled: None) -> None:
    model = tmp_path / "model.gguf"
    model.write_text("text")

    def fails() -> None:
        raise ValueError("bad file")

    for _ in range(2):
        with pytest.raises(ValueError, match="bad file"):
            remembered(model, "kind", fails, folder=tmp_path / "facts")
    derive = Derivations(model)
    remembered(model, "kind", derive, folder=tmp_path / "facts")
    (entry,) = (tmp_path / "facts").iterdir()
    entry.write_text('{"identity": [')
    assert remembered(model, "kind", derive, folder=tmp_path / "facts") == {"text": "text"} and derive.calls == 2
    assert remembered(model, "kind", derive, folder=tmp_path / "facts") == {"text": "text"} and derive.calls == 2
    assert [p.name for p in (tmp_path / "facts").iterdir()] == [entry.name]  # no temporary file left


def test_facts_that_cannot_be_kept_are_derived_each_time(tmp_path: Path, settled: None) -> None:
    model = tmp_path / "model.gguf"
    model.write_text("text")
    (tmp_path / "file").write_text("")
    derive = Derivations(model)
    for _ in range(2):
        assert remembered(model, "kind", derive, folder=tmp_path / "file" / "facts") == {"text": "text"}
    assert derive.calls == 2


def test_a_remembered_gguf_header_is_the_one_read(tmp_path: Path, gemma_model: Path, settled: None,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    model = tmp_path / "gemma.gguf"
    shutil.copyfile(gemma_model, model)
    read = gguf_file.read_gguf_header(model)
    assert read == gguf_file._read_header(model) and read.array_lengths["tokenizer.ggml.tokens"] == 262144

    def parse_again(*_: object) -> None:
        raise AssertionError("parsed again")

    with monkeypatch.context() as patched:
        patched.setattr(gguf_file, "_parse", parse_again)
        assert gguf_file.read_gguf_header(model) == read
    with model.open("r+b") as stream:  # a damaged copy: read again, and refused
        stream.truncate(model.stat().st_size - 1)
    with pytest.raises(ModelError, match="is truncated"):
        gguf_file.read_gguf_header(model)


@pytest.mark.parametrize("fixture", ["engine", "gemma_gguf_engine"])
def test_remembered_end_of_generation_tokens_are_llama_cpp_s(request: pytest.FixtureRequest, fixture: str, settled: None,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    engine: Engine = request.getfixturevalue(fixture)
    backend = engine.backend
    asked = llamacpp_natives.end_of_generation_ids(backend._vocab)
    assert asked and backend.info.eog_ids == asked
    version = FileVersion.of(backend.info.path)
    assert llamacpp_natives.remembered_end_of_generation_ids(backend.info.path, version, backend._vocab) == asked

    def ask_again(*_: object) -> None:
        raise AssertionError("asked again")

    monkeypatch.setattr(llamacpp_natives, "end_of_generation_ids", ask_again)
    assert llamacpp_natives.remembered_end_of_generation_ids(backend.info.path, version, backend._vocab) == asked
