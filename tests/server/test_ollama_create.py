"""Ollama's /api/create on a real `localchat serve` through the `ollama` client: a model made from another with
its own system prompt, messages and parameters (a preset, localchat.presets) is listed, shown, answers as
that model with them over both APIs, is copied, made from, and deleted; what it cannot be made from is one
line each."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import ollama
import pytest
from live_server import LiveServer, start_server

from localchat.models import DEFAULT_MODEL_NAME
from localchat.presets import ModelPreset, write_preset

SYSTEM = "You are a pirate. Answer in one short sentence."
OPENING = [{"role": "user", "content": "Who are you?"}, {"role": "assistant", "content": "Captain Hook, matey."}]
QUESTION = {"role": "user", "content": "What is the capital of France?"}
PARAMETERS = {"temperature": 0, "num_predict": 20, "stop": ["\n"], "top_k": 20}


@pytest.fixture(scope="module")
def creating(tmp_path_factory: pytest.TempPathFactory, default_model: Path) -> Iterator[tuple[LiveServer, ollama.Client]]:
    """A server that may make models, in a home of its own."""
    server = start_server(tmp_path_factory.mktemp("create-home"), "-m", str(default_model), "--allow-model-changes")
    try:
        yield server, ollama.Client(host=server.url, headers=server.auth, timeout=120)
    finally:
        server.stop()


def _shown(server: LiveServer, name: str) -> dict[str, object]:
    """/api/show's whole answer (the ollama client's ShowResponse has no `system` nor `messages`)."""
    answer = server.post("/api/show", {"model": name})
    assert answer.status_code == 200, answer.text
    return answer.json()


def test_a_created_model_answers_with_its_system_prompt_messages_and_parameters(creating: tuple[LiveServer, ollama.Client]) -> None:
    server, client = creating
    statuses = [line.status for line in client.create("pirate", from_=DEFAULT_MODEL_NAME, system=SYSTEM, messages=OPENING,
                                                      parameters=PARAMETERS, license=["MIT"], stream=True)]
    assert statuses == [f"using existing model {DEFAULT_MODEL_NAME}", "writing preset", "success"]
    assert "pirate" in {model.model for model in client.list().models}

    shown = _shown(server, "pirate")
    assert shown["system"] == SYSTEM and shown["messages"] == OPENING and shown["license"] == "MIT"
    parameters = dict(line.split(None, 1) for line in str(shown["parameters"]).splitlines())
    assert (parameters["temperature"], parameters["top_k"], parameters["stop"], parameters["num_predict"]) == ("0.0", "20", '"\\n"', "20")
    assert parameters["top_p"] == "0.9"  # the model's own default (SmolLM2's family row), under the preset's
    assert f"FROM {DEFAULT_MODEL_NAME}" in str(shown["modelfile"]) and f'SYSTEM """{SYSTEM}"""' in str(shown["modelfile"])
    assert shown["template"] == _shown(server, DEFAULT_MODEL_NAME)["template"]

    # The preset's model, asked as the preset asks it: the same prompt, the same greedy reply.
    made = client.chat("pirate", messages=[QUESTION])
    by_hand = client.chat(DEFAULT_MODEL_NAME, messages=[{"role": "system", "content": SYSTEM}, *OPENING, QUESTION],
                          options={"temperature": 0, "num_predict": 20, "stop": ["\n"], "top_k": 20})
    assert made.message.content and made.message.content == by_hand.message.content
    assert made.prompt_eval_count == by_hand.prompt_eval_count and made.eval_count == by_hand.eval_count
    # A request's own system prompt takes the preset's place; its options go over the preset's.
    own = client.chat("pirate", messages=[{"role": "system", "content": "Be brief."}, QUESTION], options={"num_predict": 3})
    assert own.prompt_eval_count is not None and made.prompt_eval_count is not None
    assert own.prompt_eval_count < made.prompt_eval_count and own.eval_count == 3

    openai_client = server.client()
    assert "pirate" in {model.id for model in openai_client.models.list().data}
    reply = openai_client.chat.completions.create(model="pirate", messages=[QUESTION])  # type: ignore[list-item]
    assert reply.choices[0].message.content == made.message.content and reply.model == "pirate"
    # The preset is answered by its model's engine: one model loaded, not a second copy of its weights.
    assert [model.model for model in client.ps().models] == [DEFAULT_MODEL_NAME]
    assert reply.usage is not None and reply.usage.prompt_tokens == made.prompt_eval_count


def test_a_model_made_from_a_preset_copied_and_deleted(creating: tuple[LiveServer, ollama.Client]) -> None:
    server, client = creating
    client.create("captain", from_=DEFAULT_MODEL_NAME, system=SYSTEM, parameters={"temperature": 0, "num_ctx": 1024})
    assert client.create("captain-warm", from_="captain:latest", parameters={"temperature": 0.5}).status == "success"
    warm = _shown(server, "captain-warm")
    assert warm["system"] == SYSTEM and "temperature                    0.5" in str(warm["parameters"])
    assert "num_ctx                        1024" in str(warm["parameters"])
    assert 'FROM smollm2-135m-instruct' in str(warm["modelfile"])  # its model, not the preset it was made from

    assert client.copy("captain", "captain-copy").status == "success"
    assert _shown(server, "captain-copy")["system"] == SYSTEM
    with pytest.raises(ollama.ResponseError) as exists:
        client.copy("captain", "captain-warm")
    assert exists.value.status_code == 400 and "exists" in exists.value.error
    # Made again: the next request loads the new one.
    client.chat("captain", messages=[QUESTION], options={"num_predict": 1})
    client.create("captain", from_=DEFAULT_MODEL_NAME, system="You are a parrot.")
    assert _shown(server, "captain")["system"] == "You are a parrot."

    for name in ("captain", "captain-warm", "captain-copy"):
        assert client.delete(name).status == "success"
    names = {model.model for model in client.list().models}
    assert not {"captain", "captain-warm", "captain-copy"} & names and DEFAULT_MODEL_NAME in names


@pytest.mark.parametrize(("request_", "status", "words"), [
    ({"model": "x", "files": {"model.gguf": "sha256:" + "0" * 64}}, 400, "POST the file to /api/blobs/sha256:000"),
    ({"model": "x", "files": {"model.safetensors": "sha256:" + "0" * 64}}, 400, "give one .gguf file"),
    ({"model": "x", "files": {"model.gguf": "md5:00"}}, 400, "invalid digest"),
    ({"model": "x", "from": DEFAULT_MODEL_NAME, "adapters": {"a.gguf": "sha256:" + "0" * 64}}, 400, "--lora"),
    ({"model": "x", "from": DEFAULT_MODEL_NAME, "quantize": "q4_K_M"}, 400, "localchat convert"),
    ({"model": "x", "modelfile": "FROM smollm2-135m-instruct"}, 400, "send its lines as fields"),
    ({"model": "x"}, 400, "neither 'from' or 'files' was specified"),
    ({"model": "x", "from": "no-such-model"}, 404, "not found"),
    ({"model": "a/b", "from": DEFAULT_MODEL_NAME}, 400, "is invalid"),
    ({"model": "gemma-3-270m", "from": DEFAULT_MODEL_NAME}, 400, "exists and is not a preset"),
    ({"model": "x", "from": DEFAULT_MODEL_NAME, "template": "{{ .System }} {{ .Prompt }}"}, 400, "own chat template"),
    ({"model": "x", "from": DEFAULT_MODEL_NAME, "parameters": {"temperature": "hot"}}, 400, 'option "temperature"'),
    ({"model": "x", "from": DEFAULT_MODEL_NAME, "parameters": {"repeat_penalty": 0}}, 400, "parameters.repeat_penalty"),
    ({"model": "x", "from": DEFAULT_MODEL_NAME, "parameters": {"num_ctx": 8}}, 400, "too small"),
    ({"model": "x", "from": DEFAULT_MODEL_NAME, "messages": [{"role": "tool", "content": "x"}]}, 400, "messages[0].role"),
])
def test_what_a_model_cannot_be_made_from_is_one_line(creating: tuple[LiveServer, ollama.Client], request_: dict[str, object],
                                                       status: int, words: str) -> None:
    server, client = creating
    answer = server.post("/api/create", {**request_, "stream": False})
    assert answer.status_code == status and words in answer.json()["error"], answer.text
    assert "x" not in {model.model for model in client.list().models}


def test_a_model_made_from_an_uploaded_gguf_file(creating: tuple[LiveServer, ollama.Client], default_model: Path,
                                               tmp_path: Path) -> None:
    """`ollama create NAME -f Modelfile` with `FROM ./model.gguf`: the client uploads the file to /api/blobs (the
    default model's 98 MB, over the server's 64 MiB bound on other bodies), then names it in `files`. Deleting
    the model deletes the upload once no other names it."""
    server, client = creating
    digest = client.create_blob(default_model)
    assert server.request("HEAD", f"/api/blobs/{digest}").status_code == 200
    assert client.create("uploaded", files={"model.gguf": digest}, system=SYSTEM).status == "success"
    assert client.copy("uploaded", "uploaded-too").status == "success"
    assert client.chat("uploaded", messages=[QUESTION], options={"num_predict": 2}).eval_count == 2
    assert str(_shown(server, "uploaded")["system"]) == SYSTEM
    assert client.delete("uploaded").status == "success"
    assert server.request("HEAD", f"/api/blobs/{digest}").status_code == 200  # uploaded-too still names it
    assert client.delete("uploaded-too").status == "success"
    assert server.request("HEAD", f"/api/blobs/{digest}").status_code == 404

    text = tmp_path / "notes.gguf"
    text.write_text("not a model")
    wrong = server.request("POST", f"/api/blobs/sha256:{'0' * 64}", data=text.read_bytes())
    assert wrong.status_code == 400 and "digest mismatch" in wrong.json()["error"]
    assert server.request("HEAD", f"/api/blobs/sha256:{'0' * 64}").status_code == 404
    not_gguf = client.create_blob(text)
    with pytest.raises(ollama.ResponseError) as refused:
        client.create("notes", files={"notes.gguf": not_gguf})
    assert refused.value.status_code == 400 and "not in GGUF format" in refused.value.error
    assert server.request("HEAD", f"/api/blobs/{not_gguf}").status_code == 404  # no model can be made of it


def test_the_model_a_request_gives_its_template_back_is_taken(creating: tuple[LiveServer, ollama.Client]) -> None:
    """`ollama show --modelfile` then `ollama create` sends the template /api/show gave: the model's own."""
    server, client = creating
    template = str(_shown(server, DEFAULT_MODEL_NAME)["template"])
    assert client.create("same-template", from_=DEFAULT_MODEL_NAME, template=template).status == "success"
    assert client.delete("same-template").status == "success"


def test_a_model_the_server_was_started_with_by_path_is_named_by_its_path(tmp_path: Path, default_model: Path) -> None:
    """A model outside the models folder has no name a later process finds: its preset names its file."""
    outside = tmp_path / "elsewhere" / "my-model.gguf"
    outside.parent.mkdir()
    outside.hardlink_to(default_model)
    server = start_server(tmp_path, "-m", str(outside), "--allow-model-changes")
    try:
        client = ollama.Client(host=server.url, headers=server.auth, timeout=120)
        assert client.create("mine", from_="my-model", system=SYSTEM).status == "success"
        assert f"FROM {outside}" in str(_shown(server, "mine")["modelfile"])
        assert client.chat("mine", messages=[QUESTION], options={"num_predict": 2}).eval_count == 2
    finally:
        server.stop()


def test_a_server_started_with_a_preset_answers_its_model_without_it(tmp_path: Path) -> None:
    """`serve -m PRESET`: requests naming no model get the preset; its model's own name gets the model alone (it was
    the preset's engine, registered under the model's name). A damaged preset is a 400 to copy or make from."""
    models = tmp_path / "cache" / "models"
    write_preset(ModelPreset("pirate", DEFAULT_MODEL_NAME, system=SYSTEM), models)
    (models / "broken.preset.json").write_text("{not json")
    server = start_server(tmp_path, "-m", "pirate", "--allow-model-changes")
    try:
        client = ollama.Client(host=server.url, headers=server.auth, timeout=120)
        asked = [QUESTION]
        as_preset = server.client().chat.completions.create(model="", messages=asked, max_tokens=1)  # type: ignore[arg-type]
        plain = client.chat(DEFAULT_MODEL_NAME, messages=asked, options={"num_predict": 1})
        by_hand = client.chat(DEFAULT_MODEL_NAME, messages=[{"role": "system", "content": SYSTEM}, *asked], options={"num_predict": 1})
        assert as_preset.usage is not None and as_preset.usage.prompt_tokens == by_hand.prompt_eval_count
        assert plain.prompt_eval_count != by_hand.prompt_eval_count  # SmolLM2's own default system prompt, not the preset's
        for path, body in (("/api/copy", {"source": "broken", "destination": "x"}), ("/api/create", {"model": "x", "from": "broken"})):
            answer = server.request("POST", path, json=body)
            assert answer.status_code == 400 and "preset broken" in answer.json()["error"], answer.text
    finally:
        server.stop()


def test_a_name_is_one_model_in_any_case_and_a_models_own_names_are_not_a_presets(creating: tuple[LiveServer, ollama.Client]) -> None:
    """Ollama's names are one in any case: creating `shouty` over `Shouty` makes Shouty again (requests find a preset
    in any case, so a second file would answer as the first). A name a model answers to (its id, its file's name or
    stem, in any case) is refused to a preset, made or copied, which would answer in the model's place."""
    server, client = creating
    client.create("Shouty", from_=DEFAULT_MODEL_NAME, system="Shout.")
    client.create("shouty", from_=DEFAULT_MODEL_NAME, system="Whisper.")
    assert [model.model for model in client.list().models if model.model.casefold() == "shouty"] == ["Shouty"]
    assert _shown(server, "SHOUTY")["system"] == "Whisper."

    for name in ("SmolLM2-135M-Instruct.Q4_1", "smollm2-135m-instruct.q4_1.gguf", "Gemma-3-270M"):
        made = server.post("/api/create", {"model": name, "from": DEFAULT_MODEL_NAME, "stream": False})
        assert made.status_code == 400 and "exists and is not a preset" in made.json()["error"], made.text
        copied = server.post("/api/copy", {"source": "Shouty", "destination": name})
        assert copied.status_code == 400 and "exists" in copied.json()["error"], copied.text
    assert client.delete("Shouty").status == "success"
    assert not {"Shouty", "shouty"} & {model.model for model in client.list().models}


def test_minus_one_in_a_requests_options_undoes_a_presets_reply_limit_and_seed(creating: tuple[LiveServer, ollama.Client]) -> None:
    """Ollama's num_predict -1 (no limit) and seed -1 (a random one) go over a preset's, as Ollama puts a request's
    options over a model's parameters; so do they over a preset a model is made from."""
    server, client = creating
    client.create("terse", from_=DEFAULT_MODEL_NAME, parameters={"num_predict": 3, "temperature": 0})
    assert client.chat("terse", messages=[QUESTION]).eval_count == 3
    assert (client.chat("terse", messages=[QUESTION], options={"num_predict": -1}).eval_count or 0) > 3
    client.create("terse-free", from_="terse", parameters={"num_predict": -1})
    assert "num_predict" not in str(_shown(server, "terse-free")["parameters"])

    wild = {"temperature": 1.5, "top_k": 0, "top_p": 1, "min_p": 0, "num_predict": 12}
    client.create("seeded", from_=DEFAULT_MODEL_NAME, parameters={**wild, "seed": 42})
    client.create("seeded-free", from_="seeded", parameters={"seed": -1})
    asked = [{"role": "user", "content": "Tell me a story."}]
    assert len({client.chat("seeded", messages=asked).message.content for _ in range(2)}) == 1
    assert len({client.chat("seeded", messages=asked, options={"seed": -1}).message.content for _ in range(3)}) > 1
    assert len({client.chat("seeded-free", messages=asked).message.content for _ in range(3)}) > 1
    openai_client = server.client()
    replies = {openai_client.chat.completions.create(model="seeded", messages=asked, seed=-1).choices[0].message.content  # type: ignore[arg-type]
               for _ in range(3)}
    assert len(replies) > 1
    for name in ("terse", "terse-free", "seeded", "seeded-free"):
        client.delete(name)


def test_a_presets_penalties_reach_its_replies(creating: tuple[LiveServer, ollama.Client]) -> None:
    """A preset's presence and frequency penalties are its replies' unless a request sets its own (a request's
    default of 0 took their place)."""
    server, client = creating
    penalties = {"temperature": 0, "num_predict": 24, "presence_penalty": 2.0, "frequency_penalty": 2.0}
    client.create("penalised", from_=DEFAULT_MODEL_NAME, parameters=penalties)
    asked = [{"role": "user", "content": "Write a poem about the sea and the sea."}]
    made = client.chat("penalised", messages=asked).message.content
    by_hand = client.chat(DEFAULT_MODEL_NAME, messages=asked, options=penalties).message.content
    plain = client.chat(DEFAULT_MODEL_NAME, messages=asked, options={"temperature": 0, "num_predict": 24}).message.content
    assert made == by_hand and by_hand != plain
    reply = server.client().chat.completions.create(model="penalised", messages=asked)  # type: ignore[arg-type]
    assert reply.choices[0].message.content == made
    client.delete("penalised")


def test_an_upload_no_model_names_goes_when_its_create_fails_or_its_model_is_made_again(
        creating: tuple[LiveServer, ollama.Client], default_model: Path) -> None:
    """An uploaded file is kept for the models made of it: a create that fails leaves none it uploaded for, and a
    model made again of something else frees its upload (never one another model names)."""
    server, client = creating
    digest = client.create_blob(default_model)
    failed = server.post("/api/create", {"model": "unmade", "files": {"model.gguf": digest}, "parameters": {"top_k": "many"},
                                         "stream": False})
    assert failed.status_code == 400 and 'option "top_k"' in failed.json()["error"], failed.text
    assert server.request("HEAD", f"/api/blobs/{digest}").status_code == 404

    digest = client.create_blob(default_model)
    client.create("remade", files={"model.gguf": digest})
    client.copy("remade", "remade-too")
    client.create("remade", from_=DEFAULT_MODEL_NAME, system=SYSTEM)
    assert server.request("HEAD", f"/api/blobs/{digest}").status_code == 200  # remade-too names it
    client.create("remade-too", from_="remade")
    assert server.request("HEAD", f"/api/blobs/{digest}").status_code == 404
    for name in ("remade", "remade-too"):
        client.delete(name)


def test_a_preset_is_listed_as_loaded_when_its_model_is(creating: tuple[LiveServer, ollama.Client]) -> None:
    """A preset of a model by name is answered by that model's engine: /v1/models says it is loaded when its model is."""
    server, client = creating
    client.create("listed", from_=DEFAULT_MODEL_NAME, system=SYSTEM)
    client.chat(DEFAULT_MODEL_NAME, messages=[QUESTION], options={"num_predict": 1})
    cards = {card.id: card.model_extra or {} for card in server.client().models.list().data}
    assert cards[DEFAULT_MODEL_NAME]["status"] == "loaded" and cards["listed"]["status"] == "loaded"
    assert server.request("GET", "/v1/models/listed").json()["status"] == "loaded"
    client.delete("listed")


def test_a_servers_start_deletes_old_uploads_no_model_names_and_parts_left_by_a_gone_process(
        tmp_path: Path, default_model: Path) -> None:
    """As Ollama prunes its blobs at start: an upload no preset names, older than an hour, goes, as does the part of
    an upload whose process is gone (a crash while receiving it); one a preset names stays, and so does a recent one
    (another server on the same folder may have received it for a create still to come)."""
    blobs = tmp_path / "cache" / "models" / "blobs"
    blobs.mkdir(parents=True)
    named, old, recent = (blobs / f"sha256-{c * 64}" for c in "abc")
    for path in (named, old, recent):
        path.write_bytes(b"GGUF")
    long_ago = time.time() - 2 * 3600
    for path in (named, old):
        os.utime(path, (long_ago, long_ago))
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    left_by_the_gone = blobs / f"sha256-{'d' * 64}.{gone.stdout.strip()}-1.incomplete"
    left_by_the_gone.write_bytes(b"GG")
    write_preset(ModelPreset("uploaded", str(named)), tmp_path / "cache" / "models")
    server = start_server(tmp_path, "-m", str(default_model))
    server.stop()
    assert sorted(path.name for path in blobs.iterdir()) == sorted([named.name, recent.name])
