"""Several prompts and n choices in one request, as OpenAI defines them: choice i * n + j is prompt i's j-th,
each with its own seed, stop strings, tools and limits, streamed with its index and counted in one usage; a
request's choices share the slots with other requests. Through the real app and scheduler over the scripted model
(scripted_app.py) in milliseconds, then the real model."""

from __future__ import annotations

import json
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from chat_format_cases import QWEN3, QWEN3_CALLS, TOOLS, TOOLS_QUESTION
from fastapi.testclient import TestClient
from greedy_paths import assert_same_completion_until_near_tie, assert_same_pieces_until_near_tie, first_near_tie
from langchain_openai import OpenAI as LangChainOpenAI
from live_server import API_KEY, QUEUE, SLOTS, LiveServer
from scripted_app import ScriptedBackend, scripted_client, scripted_engine

from localchat.engine import Engine
from localchat.models import DEFAULT_MODEL_NAME
from localchat.scheduler import QueueFullError, ReplyDone, ReplyEvent, ScheduledReply, Scheduler
from localchat.server.schemas import MAX_CHOICES
from localchat.session import GenerationSettings

MODEL = DEFAULT_MODEL_NAME
GREEDY = {"temperature": 0, "seed": 1}
HELLO = [{"role": "user", "content": "Hello"}]
# Prompts the chat model continues without a near tie in their first tokens.
LISTS = ["The capital of France is", "1, 2, 3, 4, 5,", "A, B, C, D,", "10, 20, 30, 40,"]
# Each begins with a letter of its own: a prompt shares the instructions alone with another.
COUNTRIES = ("France", "Italy", "Japan", "Brazil", "Canada", "Egypt", "Greece", "Kenya", "Mexico", "Norway", "Peru",
             "Denmark")


@pytest.fixture
def scripted(tmp_path: Path) -> Iterator[tuple[openai.OpenAI, TestClient, ScriptedBackend]]:
    """Two slots: a request's choices beyond them wait for one."""
    backend = ScriptedBackend(QWEN3)
    with scripted_client(backend, tmp_path) as (client, http):
        yield client, http, backend


def _metric(http: TestClient, name: str) -> float:
    lines = http.get("/metrics").text.splitlines()
    return sum(float(line.rsplit(" ", 1)[1]) for line in lines if line.startswith((f"{name} ", f"{name}{{")))


def _by_choice(chunks: list[Any]) -> dict[int, list[Any]]:
    """A stream's choice entries, in order, by their index."""
    choices: dict[int, list[Any]] = {}
    for chunk in chunks:
        for choice in chunk.choices:
            choices.setdefault(choice.index, []).append(choice)
    return choices


def test_several_prompts_get_n_choices_each_in_order_with_a_seed_each(
        scripted: tuple[openai.OpenAI, TestClient, ScriptedBackend]) -> None:
    """Prompt i's j-th choice is choice i * n + j (OpenAI's and vLLM's order), sampled with seed + j (vLLM's
    seeds): with a seed, a prompt's choices are n samples, and its first the reply the prompt gets alone."""
    client, _, backend = scripted
    backend.replies.extend(["A0", "A1", "B0", "B1"] * 2)  # the scripted model writes them in the order replies start
    texts = client.completions.create(model="scripted", prompt=["Alpha", "Beta"], n=2, seed=7, temperature=1.0)
    ids = client.completions.create(model="scripted", prompt=[backend.tokenize(p, add_bos=False, special=False)
                                                              for p in ("Alpha", "Beta")], n=2, seed=7, temperature=1.0)
    for reply in (texts, ids):
        assert [(c.index, c.text, c.finish_reason) for c in reply.choices] == [
            (0, "A0", "stop"), (1, "A1", "stop"), (2, "B0", "stop"), (3, "B1", "stop")]
        # Each prompt counted once, as OpenAI and vLLM count it; every choice's tokens.
        assert reply.usage is not None and (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (9, 8)
    assert backend.prompts == ["Alpha", "Alpha", "Beta", "Beta"] * 2
    assert [sampler.seed for sampler in backend.samplers] == [7, 8, 7, 8] * 2
    backend.replies.extend(["C0", "C1"])
    client.completions.create(model="scripted", prompt="Gamma", n=2, temperature=1.0)  # no seed: each draws its own
    assert [sampler.seed for sampler in backend.samplers[-2:]] == [None, None]


def test_chat_choices_stream_with_their_index_and_finish_and_one_usage(
        scripted: tuple[openai.OpenAI, TestClient, ScriptedBackend]) -> None:
    client, _, backend = scripted
    # max_tokens is each choice's: the second is cut at 6 tokens, the others end by themselves.
    backend.replies.extend(["Solo.", *["One.", "Two, longer.", "Three"] * 2])
    alone = client.chat.completions.create(model="scripted", messages=HELLO)
    whole = client.chat.completions.create(model="scripted", messages=HELLO, n=3, max_tokens=6)
    chunks = list(client.chat.completions.create(model="scripted", messages=HELLO, n=3, max_tokens=6, stream=True,
                                                 stream_options={"include_usage": True}))
    expected = [(0, "One.", "stop"), (1, "Two, l", "length"), (2, "Three", "stop")]
    assert [(c.index, c.message.content, c.finish_reason) for c in whole.choices] == expected
    streamed = _by_choice(chunks)
    assert [(index, "".join(c.delta.content or "" for c in choices), choices[-1].finish_reason)
            for index, choices in sorted(streamed.items())] == expected
    assert all(choices[0].delta.role == "assistant" for choices in streamed.values())
    assert all(c.finish_reason is None for choices in streamed.values() for c in choices[:-1])  # one end per choice
    for usage in (whole.usage, chunks[-1].usage):
        assert usage is not None and (usage.completion_tokens, usage.total_tokens - usage.prompt_tokens) == (15, 15)
        assert alone.usage is not None and usage.prompt_tokens == alone.usage.prompt_tokens  # the one conversation, once
    assert chunks[-1].choices == [] and all(chunk.usage is None for chunk in chunks[:-1])


def test_tool_calls_stop_strings_and_json_apply_to_each_choice(
        scripted: tuple[openai.OpenAI, TestClient, ScriptedBackend]) -> None:
    client, _, backend = scripted
    # parallel_tool_calls false ends the first choice at its first call; the second writes on.
    backend.replies.extend([QWEN3_CALLS, "No call needed: " + "a" * 40])
    calls = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=TOOLS, n=2,
                                           parallel_tool_calls=False)
    first, second = calls.choices
    assert first.finish_reason == "tool_calls" and [c.function.name for c in first.message.tool_calls or ()] == ["get_weather"]
    assert second.finish_reason == "stop" and second.message.content == "No call needed: " + "a" * 40
    backend.replies.extend(["Hi! there", "Yo there", "Hey there!"])
    stopped = client.chat.completions.create(model="scripted", messages=HELLO, n=3, stop="!")
    assert [c.message.content for c in stopped.choices] == ["Hi", "Yo there", "Hey there"]
    backend.replies.extend(['{"city": "Bern"}', "not JSON"])
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    held = client.chat.completions.create(model="scripted", messages=HELLO, n=2, response_format={
        "type": "json_schema", "json_schema": {"name": "place", "schema": schema}})
    assert all("city" in json.loads(c.message.content or "") for c in held.choices)


def test_a_request_s_choices_share_their_prompt_through_the_prefix_cache(
        scripted: tuple[openai.OpenAI, TestClient, ScriptedBackend]) -> None:
    """The first choice computes the prompt; the others restore it (two slots: the third reuses the first's)."""
    client, http, backend = scripted
    backend.replies.extend(["One.", "Two.", "Three."])
    messages = [{"role": "system", "content": "You answer in one word."}, *HELLO]
    cached = _metric(http, "localchat_prompt_tokens_cached_total")
    reply = client.chat.completions.create(model="scripted", messages=messages, n=3)
    assert reply.usage is not None and reply.usage.prompt_tokens_details is not None
    prompt = reply.usage.prompt_tokens
    # Each later choice evaluates only the prompt's last token; the request's prompt was computed once.
    assert _metric(http, "localchat_prompt_tokens_cached_total") - cached == 2 * (prompt - 1)
    assert reply.usage.prompt_tokens_details.cached_tokens == 0


@pytest.mark.parametrize("countries", [("France", "Italy", "Swiss"), COUNTRIES])
def test_prompts_sharing_their_instructions_compute_them_once(
        scripted: tuple[openai.OpenAI, TestClient, ScriptedBackend], countries: tuple[str, ...]) -> None:
    """The first prompt's KV is saved once, and the others start from it, more of them waiting than the
    scheduler compares (prefix_cache.MAX_COMPARED) too. (Short prompts: the scripted model computes for free,
    so a prompt of 64 tokens or more would teach the prefix cache that restoring does not pay.)"""
    client, http, backend = scripted
    instructions = "Answer with the capital city of the country: "
    backend.replies.extend(["A."] * len(countries))
    cached, saved = _metric(http, "localchat_prompt_tokens_cached_total"), _metric(http, "localchat_prefix_cache_entries")
    client.completions.create(model="scripted", prompt=[instructions + country for country in countries])
    assert _metric(http, "localchat_prompt_tokens_cached_total") - cached == (len(countries) - 1) * len(instructions)
    assert _metric(http, "localchat_prefix_cache_entries") - saved == 1


def test_a_request_s_many_choices_count_once_and_share_the_slots_with_later_requests(tmp_path: Path) -> None:
    """Two slots and room for one request more: a request of six choices counts once, so two more fit beside it
    and a fourth does not. A freed slot goes to the request with the fewest replies in a slot, the earliest of
    those: the later requests start as slots free, not after all six choices (first come, first served by reply:
    Alpha six times, then Beta, Gamma, Gamma)."""
    backend = ScriptedBackend(QWEN3)
    backend.replies.extend(["ok"] * 9)  # every reply as long: the two slots free together
    scheduler = Scheduler(scripted_engine(backend, tmp_path), max_waiting=1)
    events: queue.SimpleQueue[ReplyEvent] = queue.SimpleQueue()

    def submit(text: str, n: int) -> None:
        prompt = backend.tokenize(text, add_bos=False, special=False)
        scheduler.submit_all([(prompt, GenerationSettings(max_tokens=8), events.put)] * n)

    submit("Alpha", 6)
    submit("Beta", 1)
    submit("Gamma", 2)
    with pytest.raises(QueueFullError):
        submit("Delta", 1)
    assert scheduler.waiting == 9
    scheduler.start()  # after the requests: the order they start in does not hang on the threads' timing
    try:
        ended = 0
        while ended < 9:
            ended += isinstance(events.get(timeout=10), ReplyDone)
        submit("Delta", 1)  # the requests gone, the queue takes another
        while not isinstance(events.get(timeout=10), ReplyDone):
            pass
    finally:
        scheduler.close()
    assert backend.prompts == ["Alpha", "Beta", "Alpha", "Gamma", "Alpha", "Gamma", "Alpha", "Alpha", "Alpha", "Delta"]


def test_a_request_cancelled_while_it_waits_leaves_its_place_in_the_queue(tmp_path: Path) -> None:
    """Two slots and room for one request more, all taken: once the waiting request is cancelled (its client
    gone), another is taken at once, not after a slot frees; the cancelled one ends without starting."""
    backend = ScriptedBackend(QWEN3)
    backend.replies.extend(["ok"] * 3)
    scheduler = Scheduler(scripted_engine(backend, tmp_path), max_waiting=1)
    events: queue.SimpleQueue[ReplyEvent] = queue.SimpleQueue()

    def submit(text: str) -> ScheduledReply:
        [reply] = scheduler.submit_all([(backend.tokenize(text, add_bos=False, special=False), GenerationSettings(max_tokens=8),
                                         events.put)])
        return reply

    submit("Alpha")
    submit("Beta")
    gone = submit("Gamma")
    with pytest.raises(QueueFullError):
        submit("Delta")
    gone.cancel()
    submit("Delta")
    scheduler.start()
    try:
        ended = 0
        while ended < 4:
            ended += isinstance(events.get(timeout=10), ReplyDone)
    finally:
        scheduler.close()
    assert backend.prompts == ["Alpha", "Beta", "Delta"]


@pytest.mark.parametrize(("body", "param", "message"), [
    ({"prompt": ["Hi"] * (MAX_CHOICES + 1)}, "prompt", f"{MAX_CHOICES + 1} prompts times n=1 ask for {MAX_CHOICES + 1} choices"),
    ({"prompt": ["Hi"] * 50, "n": 3}, "n", "50 prompts times n=3 ask for 150 choices"),
    ({"prompt": "Hi", "n": MAX_CHOICES + 1}, "n", f"must be at most {MAX_CHOICES}"),
    ({"prompt": "Hi", "n": 0}, "n", "must be at least 1"),
    ({"prompt": []}, "prompt", ""),
    ({"prompt": ["Hi", [1, 2]]}, "prompt", ""),
    ({"prompt": ["Hi", "x" * 5000]}, "prompt", "the prompt is 5000 tokens but the context holds 4096"),
])
def test_too_many_choices_or_a_bad_prompt_among_several_is_a_400_naming_the_field(
        scripted: tuple[openai.OpenAI, TestClient, ScriptedBackend], body: dict[str, Any], param: str, message: str) -> None:
    _, http, backend = scripted
    refused = http.post("/v1/completions", json={"model": "scripted", "max_tokens": 1, **body})
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["param"] == param and message in error["message"] and "\n" not in error["message"], error
    chat = http.post("/v1/chat/completions", json={"model": "scripted", "messages": HELLO, "n": MAX_CHOICES + 1})
    assert chat.status_code == 400 and chat.json()["error"]["param"] == "n"
    assert backend.prompts == []  # nothing reached the model


# -- the real model -------------------------------------------------------------------------


def test_several_prompts_each_get_the_reply_they_get_alone(server: LiveServer, engine: Engine) -> None:
    """Greedy: choice i is prompt i's lone reply, up to that reply's first near tie (decoded in a batch here,
    alone there: tests/greedy_paths.py), as text and as token ids; the usage adds the prompts up."""
    client = server.client()
    alone = [client.completions.create(model=MODEL, prompt=prompt, max_tokens=8, logprobs=2, **GREEDY) for prompt in LISTS]
    together = client.completions.create(model=MODEL, prompt=LISTS, max_tokens=8, logprobs=1, **GREEDY)
    assert [choice.index for choice in together.choices] == list(range(len(LISTS)))
    for single, choice in zip(alone, together.choices, strict=True):
        assert single.choices[0].logprobs is not None and choice.logprobs is not None
        assert_same_completion_until_near_tie(single.choices[0].logprobs, choice.logprobs.tokens or [], min_compared=2)
    assert together.usage is not None and together.usage.prompt_tokens == sum(r.usage.prompt_tokens for r in alone if r.usage)
    assert together.usage.completion_tokens == sum(len(c.logprobs.tokens or []) for c in together.choices if c.logprobs)
    backend = engine.backend
    ids = [backend.tokenize(prompt, add_bos=backend.info.add_bos, special=True) for prompt in LISTS]
    by_ids = client.completions.create(model=MODEL, prompt=ids, max_tokens=8, logprobs=1, **GREEDY)
    for single, choice in zip(alone, by_ids.choices, strict=True):
        assert single.choices[0].logprobs is not None and choice.logprobs is not None
        assert_same_completion_until_near_tie(single.choices[0].logprobs, choice.logprobs.tokens or [], min_compared=2)
    assert by_ids.usage is not None and by_ids.usage.prompt_tokens == together.usage.prompt_tokens


def test_chat_choices_greedy_are_the_one_reply_and_sampled_are_samples(server: LiveServer) -> None:
    client = server.client()
    question = [{"role": "user", "content": "What is the capital of Japan?"}]  # no near tie in the chat model's answer
    alone = client.chat.completions.create(model=MODEL, messages=question, max_tokens=16, logprobs=True, top_logprobs=2,
                                           **GREEDY)
    greedy = client.chat.completions.create(model=MODEL, messages=question, max_tokens=16, n=3, logprobs=True, **GREEDY)
    assert alone.choices[0].logprobs is not None and alone.choices[0].logprobs.content is not None
    for index, choice in enumerate(greedy.choices):
        assert choice.index == index and choice.logprobs is not None and choice.logprobs.content is not None
        assert_same_pieces_until_near_tie(alone.choices[0].logprobs.content, [e.token for e in choice.logprobs.content],
                                          min_compared=4)
    sampled = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Tell me a story."}],
                                             max_tokens=16, n=3, temperature=1.0, seed=5)
    assert len({choice.message.content for choice in sampled.choices}) > 1  # seeds 5, 6, 7: not three copies of one
    assert greedy.usage is not None and alone.usage is not None and greedy.usage.prompt_tokens == alone.usage.prompt_tokens


def test_streamed_choices_carry_their_index_logprobs_and_end_and_the_usage_sums_them(server: LiveServer) -> None:
    prompts, n, tokens = LISTS[:2], 2, 6
    chunks = list(server.client().completions.create(
        model=MODEL, prompt=prompts, n=n, max_tokens=tokens, logprobs=1, stream=True, stream_options={"include_usage": True},
        temperature=1.0, seed=3, extra_body={"ignore_eos": True}))
    streamed = _by_choice(chunks)
    assert sorted(streamed) == list(range(len(prompts) * n))
    for choices in streamed.values():
        assert [c.finish_reason for c in choices] == [None] * (len(choices) - 1) + ["length"]
        pieces = [t for c in choices if c.logprobs for t in c.logprobs.tokens or []]
        assert len(pieces) == tokens and "".join(pieces) == "".join(c.text for c in choices)
    usage = chunks[-1].usage
    assert usage is not None and chunks[-1].choices == []
    alone = [server.client().completions.create(model=MODEL, prompt=p, max_tokens=1).usage for p in prompts]
    assert usage.prompt_tokens == sum(u.prompt_tokens for u in alone if u) and usage.completion_tokens == len(prompts) * n * tokens


def test_a_client_that_goes_away_cancels_every_choice(server: LiveServer) -> None:
    cancelled = server.metric('localchat_replies_total{finish_reason="cancelled"}')
    body = {"prompt": ["Tell me a very long story.", "Tell me another."], "n": 2, "max_tokens": 2000, "ignore_eos": True,
            "stream": True}
    with server.post("/v1/completions", body, stream=True) as response:
        lines = response.iter_lines()
        for _ in range(9):
            next(lines)
    assert server.idle_within(20)  # 4 x 2000 tokens would have taken minutes
    assert server.metric('localchat_replies_total{finish_reason="cancelled"}') == cancelled + 4


def test_a_request_for_the_most_choices_leaves_another_client_the_next_free_slot(server: LiveServer) -> None:
    """A request for MAX_CHOICES choices, more than the slots and the queue hold, counts as one request: another
    client's lone request is not refused, and starts in the first slot freed, answered while most of the choices
    still wait (first come, first served by reply, it would wait until the last of them had started)."""
    assert MAX_CHOICES > SLOTS + QUEUE
    choices = server.client().completions.create(model=MODEL, prompt="Tell me a story.", n=MAX_CHOICES, max_tokens=8,
                                                 stream=True, extra_body={"ignore_eos": True})
    try:
        lone = server.client().completions.create(model=MODEL, prompt="The capital of France is", max_tokens=2)
        waiting = server.health()["requests_waiting"]
    finally:
        choices.close()  # the server cancels the choices
    assert lone.choices[0].finish_reason == "length" and lone.choices[0].text
    # The lone reply starts beside the first round of choices or the next (8 steps each): some 120 of them wait
    # when it has ended (124 measured), where none would be left first come, first served by reply.
    assert isinstance(waiting, int) and waiting > MAX_CHOICES // 2
    assert server.idle_within(30)


def test_langchain_s_batch_is_one_request_answered_in_order(server: LiveServer) -> None:
    """LangChain's OpenAI LLM sends a batch's prompts in one request (up to 20): more choices than the server's
    slots and queue hold, taken whole; each prompt's text is its lone greedy reply up to that one's first near tie."""
    prompts = [*LISTS, "a, b, c, d, e,", "One, two, three,", "Sunday, Monday, Tuesday,", "Red, orange, yellow,",
               "North, east, south,", "Spring, summer, autumn,"]
    assert len(prompts) > SLOTS + QUEUE
    client = server.client()
    alone = [client.completions.create(model=MODEL, prompt=p, max_tokens=6, logprobs=2, **GREEDY).choices[0] for p in prompts]
    requests = server.metric('localchat_http_requests_total{path="/v1/completions",status="200"}')
    llm = LangChainOpenAI(model=MODEL, base_url=f"{server.url}/v1", api_key=API_KEY, max_tokens=6, max_retries=0,  # type: ignore[arg-type]
                          **GREEDY)
    texts = llm.batch(prompts)
    assert server.metric('localchat_http_requests_total{path="/v1/completions",status="200"}') == requests + 1
    compared = 0
    for single, text in zip(alone, texts, strict=True):
        assert single.logprobs is not None
        gaps = [float(a - b) for a, b in (sorted(top.values(), reverse=True)[:2] for top in single.logprobs.top_logprobs or [])]
        tie = first_near_tie(gaps)
        same = len(gaps) if tie is None else tie
        assert text.startswith("".join((single.logprobs.tokens or [])[:same])), (single.text, text)
        compared += same
    assert compared >= 2 * len(prompts)
