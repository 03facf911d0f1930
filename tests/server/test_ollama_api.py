"""Ollama's API on the real server and model (tests/server/conftest.py), driven by the `ollama`
client and langchain-ollama: chat and generate whole and streamed with real counters, structured
`format`, tools, the model routes, and the same greedy reply through /api/chat as through
/v1/chat/completions, on Gemma 3 270M (a base model: its replies are checked for shape, not text)."""

from __future__ import annotations

import json
from typing import Any

import ollama
import pytest
from greedy_paths import assert_same_pieces_until_near_tie
from langchain_core.messages import AIMessage, HumanMessage
from langchain_ollama import ChatOllama
from live_server import CONTEXT, LiveServer

from localchat.engine import Engine

MODEL = "gemma-3-270m"
GREEDY: dict[str, Any] = {"temperature": 0, "seed": 1}
HELLO = [{"role": "system", "content": "You answer in one short sentence."},
         {"role": "user", "content": "Name three colours of the rainbow."}]


@pytest.fixture(scope="module")
def client(gemma_server: LiveServer) -> ollama.Client:
    return ollama.Client(host=gemma_server.url, headers=gemma_server.auth, timeout=120)


def _counters_add_up(reply: Any, most_tokens: int) -> None:
    """The counters are measurements: set, ordered in time, within the whole request's duration."""
    assert 0 < reply.eval_count <= most_tokens and reply.prompt_eval_count > 0
    assert reply.prompt_eval_duration > 0 and reply.eval_duration > 0 and reply.load_duration >= 0
    assert reply.total_duration >= reply.load_duration + reply.prompt_eval_duration + reply.eval_duration


def test_chat_whole_and_streamed(client: ollama.Client) -> None:
    whole = client.chat(MODEL, messages=HELLO, options={**GREEDY, "num_predict": 16})
    assert whole.done and whole.done_reason in ("stop", "length") and whole.message.role == "assistant"
    assert whole.message.content and whole.model == MODEL
    _counters_add_up(whole, 16)

    chunks = list(client.chat(MODEL, messages=HELLO, options={**GREEDY, "num_predict": 16}, stream=True))
    assert [chunk.done for chunk in chunks] == [False] * (len(chunks) - 1) + [True]
    # A line per token's text (one held back, a partial character, joins the next): at most one per token.
    assert chunks[-1].message.content == "" and 1 <= len(chunks) - 1 <= (chunks[-1].eval_count or 0)
    assert "".join(chunk.message.content or "" for chunk in chunks).strip()
    _counters_add_up(chunks[-1], 16)


def test_the_same_conversation_gives_the_same_greedy_reply_through_both_apis(gemma_server: LiveServer, client: ollama.Client) -> None:
    """Same prompt (its token count), same sampler, same path through the scheduler: the same tokens up to the
    reference's first near tie (the second request reuses the first's KV cache, another evaluation path:
    tests/greedy_paths.py), and the same whole reply when no near tie came first."""
    openai_reply = gemma_server.client().chat.completions.create(model=MODEL, messages=HELLO, max_tokens=24, logprobs=True,
                                                           top_logprobs=2, **GREEDY)
    ollama_reply = client.chat(MODEL, messages=HELLO, logprobs=True, top_logprobs=2, options={**GREEDY, "num_predict": 24})
    assert openai_reply.usage is not None and ollama_reply.prompt_eval_count == openai_reply.usage.prompt_tokens
    reference = openai_reply.choices[0].logprobs
    assert reference is not None and reference.content is not None and ollama_reply.logprobs is not None
    pieces = [entry.token for entry in ollama_reply.logprobs]
    assert "".join(pieces) == ollama_reply.message.content
    compared = assert_same_pieces_until_near_tie(reference.content, pieces, min_compared=4)
    if compared == len(pieces) == len(reference.content):  # no near tie: the same reply
        assert ollama_reply.message.content == openai_reply.choices[0].message.content


def test_generate_whole_streamed_and_raw(client: ollama.Client, gemma_gguf_engine: Engine) -> None:
    whole = client.generate(MODEL, prompt="Name a colour.", options={**GREEDY, "num_predict": 12})
    assert whole.done and whole.response and whole.context
    _counters_add_up(whole, 12)
    parts = list(client.generate(MODEL, prompt="The sky is", raw=True, stream=True, options={**GREEDY, "num_predict": 8}))
    # <bos> and the prompt's tokens: no template around it; no context, as Ollama gives none for a raw prompt.
    assert parts[-1].done and parts[-1].prompt_eval_count == len(gemma_gguf_engine.backend.tokenize("The sky is", add_bos=True, special=True))
    assert parts[-1].context is None
    assert "".join(part.response for part in parts if part.response)


def test_generate_goes_on_from_an_earlier_replys_context(gemma_server: LiveServer, client: ollama.Client) -> None:
    """Ollama's deprecated context: the first reply's tokens (its prompt and reply) come before the second prompt, so
    the model sees the first exchange; the second's context holds both exchanges."""
    options = {**GREEDY, "num_predict": 8}
    first = client.generate(MODEL, prompt="My name is Ada.", options=options)
    assert first.context and len(first.context) == first.prompt_eval_count + (first.eval_count or 0)
    second = client.generate(MODEL, prompt="What is my name?", context=first.context, options=options)
    assert second.context and second.context[:len(first.context)] == first.context
    alone = client.generate(MODEL, prompt="What is my name?", options=options)
    # The first exchange, then the new turn without the <bos> a prompt starts with.
    assert second.prompt_eval_count == len(first.context) + (alone.prompt_eval_count or 0) - 1

    def rendered(body: dict[str, Any]) -> str:
        answer = gemma_server.post("/api/generate", {"model": MODEL, **body, "_debug_render_only": True})
        return str(answer.json()["_debug_info"]["rendered_template"])

    turn = rendered({"prompt": "What is my name?"})
    with_context = rendered({"prompt": "What is my name?", "context": first.context})
    assert turn.startswith("<bos><start_of_turn>user\nWhat is my name?")
    assert with_context.startswith(rendered({"prompt": "My name is Ada."}) + first.response)
    assert with_context == rendered({"prompt": "My name is Ada."}) + first.response + turn.removeprefix("<bos>")


def test_a_context_holds_the_text_returned_not_the_stop_string(gemma_server: LiveServer, client: ollama.Client) -> None:
    """As Ollama's (the prompt and the text returned, tokenized): a matched stop string's tokens are not in it."""
    stopped = client.generate(MODEL, prompt="Write three short sentences about the sea.", options={**GREEDY, "num_predict": 48, "stop": ["."]})
    assert stopped.context and stopped.done_reason == "stop" and "." not in stopped.response

    def rendered(body: dict[str, Any]) -> str:
        answer = gemma_server.post("/api/generate", {"model": MODEL, "prompt": "Go on.", **body, "_debug_render_only": True})
        return str(answer.json()["_debug_info"]["rendered_template"])

    first_turn = rendered({"prompt": "Write three short sentences about the sea."})
    with_context = rendered({"context": stopped.context})
    assert with_context == first_turn + stopped.response + rendered({}).removeprefix("<bos>")


def test_options_past_openais_bounds_are_read_as_llama_cpp_reads_them(client: ollama.Client) -> None:
    """Ollama hands options to llama.cpp as given: a temperature of 3, top_k -1 (no cut), a 64-bit seed; the options
    today's Ollama no longer knows (Mirostat, tail-free sampling, penalize_newline) it ignores."""
    options = {"temperature": 3, "top_k": -1, "seed": 2**40, "mirostat": 2, "tfs_z": 0.5, "penalize_newline": False,
               "num_predict": 4}
    reply = client.generate(MODEL, prompt="Name a colour.", options=options)
    assert reply.done and reply.done_reason in ("stop", "length")


def test_format_gives_json_following_the_schema(client: ollama.Client) -> None:
    schema = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}, "bright": {"type": "boolean"}},
              "required": ["colour", "bright"], "additionalProperties": False}
    reply = client.chat(MODEL, messages=[{"role": "user", "content": "A colour, as JSON."}], format=schema,
                        options={**GREEDY, "num_predict": 40})
    answer = json.loads(reply.message.content or "")
    assert set(answer) == {"colour", "bright"} and answer["colour"] in schema["properties"]["colour"]["enum"]  # type: ignore[index]
    assert isinstance(answer["bright"], bool)
    # Any JSON object: the base model may write a long string value, cut at num_predict.
    free = client.generate(MODEL, prompt="JSON:", format="json", options={**GREEDY, "num_predict": 40})
    assert free.response.startswith("{") and (free.done_reason == "length" or isinstance(json.loads(free.response), dict))


def test_tools_answer_in_shape(client: ollama.Client) -> None:
    def get_weather(city: str) -> str:
        """The current weather in a city.

        Args:
          city: the city's name
        """
        return "sunny"

    reply = client.chat(MODEL, messages=[{"role": "user", "content": "What is the weather in Paris?"}], tools=[get_weather],
                        options={**GREEDY, "num_predict": 40})
    for call in reply.message.tool_calls or ():
        assert call.function.name and isinstance(call.function.arguments, dict)
    assert reply.message.tool_calls or reply.message.content


def test_the_model_routes(client: ollama.Client, gemma_gguf_engine: Engine) -> None:
    listed = {model.model: model for model in client.list().models}
    assert MODEL in listed and listed[MODEL].details is not None and listed[MODEL].details.family == "gemma3"
    assert listed[MODEL].size and listed[MODEL].details.quantization_level == "Q4_K_M"
    shown = client.show(MODEL)
    assert shown.modelinfo is not None and shown.modelinfo["general.architecture"] == "gemma3"
    assert shown.capabilities == ["completion", "tools"] and shown.template
    # The parameters a request starts from: Gemma's own (its repeat penalty and DRY), not llama.cpp's.
    parameters = {name: float(value) for name, value in (line.split() for line in (shown.parameters or "").splitlines())}
    defaults = gemma_gguf_engine.sampler_defaults.settings
    assert parameters["repeat_penalty"] == defaults.repeat_penalty > 1 and parameters["dry_multiplier"] == defaults.dry_multiplier > 0
    running = {model.model: model for model in client.ps().models}
    assert running[MODEL].context_length == CONTEXT and running[MODEL].size
    with pytest.raises(ollama.ResponseError) as missing:
        client.show("no-such-model")
    assert missing.value.status_code == 404 and missing.value.error == "model 'no-such-model' not found"


def test_langchains_chat_model(gemma_server: LiveServer) -> None:
    chat = ChatOllama(model=MODEL, base_url=gemma_server.url, client_kwargs={"headers": gemma_server.auth}, temperature=0, seed=1,
                      num_predict=12, validate_model_on_init=True)
    answer = chat.invoke([HumanMessage("Name a colour.")])
    assert isinstance(answer, AIMessage) and isinstance(answer.content, str) and answer.content
    assert answer.usage_metadata is not None and 0 < answer.usage_metadata["output_tokens"] <= 12
    assert "".join(str(chunk.content) for chunk in chat.stream("Name a fruit."))
