"""OpenAI's logit_bias through the real `openai` client on the real server and model: banned tokens never
come (greedy, drawn, drafted), forced ones make the reply, on both endpoints, whole and streamed. The 400s
for a bad bias are tests/server/test_http_surface.py's."""

from __future__ import annotations

import pytest
from live_server import LiveServer

from localchat.engine import Engine
from localchat.models import DEFAULT_MODEL_NAME

MODEL = DEFAULT_MODEL_NAME
GREEDY = {"temperature": 0, "seed": 1}
PROMPT = "The capital of France is"  # greedy: " Paris" (78% by the raw logits)


def token_id(engine: Engine, text: str) -> str:
    """The id of the one token `text` is, as logit_bias's keys write it (the server runs the same model)."""
    (token,) = engine.backend.tokenize(text, add_bos=False, special=False)
    return str(token)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_banned_first_token_never_comes_and_logprobs_stay_the_raw_ones(server: LiveServer, engine: Engine, stream: bool) -> None:
    """The reply starts otherwise; its first position's raw log-probabilities still put " Paris" first (the bias
    moves the draw, not the model's distribution that logprobs report, as llama-server's and vLLM's)."""
    client = server.client()
    ask = {"model": MODEL, "prompt": PROMPT, "max_tokens": 8, "logprobs": 2, **GREEDY}
    plain = client.completions.create(**ask)  # type: ignore[call-overload]
    assert plain.choices[0].logprobs.tokens[0] == " Paris"
    banned = {"logit_bias": {token_id(engine, " Paris"): -100}}
    if stream:
        pieces = [c for c in client.completions.create(**ask, extra_body=banned, stream=True) if c.choices]  # type: ignore[call-overload]
        tokens = [token for c in pieces if c.choices[0].logprobs for token in c.choices[0].logprobs.tokens or []]
        first = next(c.choices[0].logprobs.top_logprobs[0] for c in pieces if c.choices[0].logprobs and c.choices[0].logprobs.tokens)
    else:
        logprobs = client.completions.create(**ask, extra_body=banned).choices[0].logprobs  # type: ignore[call-overload]
        tokens, first = logprobs.tokens, logprobs.top_logprobs[0]
    assert tokens and " Paris" not in tokens
    assert max(first, key=first.get) == " Paris" and first[" Paris"] == pytest.approx(plain.choices[0].logprobs.token_logprobs[0], abs=0.3)


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_a_forced_token_makes_the_chat_reply(server: LiveServer, engine: Engine, stream: bool) -> None:
    ask = {"model": MODEL, "messages": [{"role": "user", "content": "What is the capital of Japan?"}], "max_tokens": 6,
           "logprobs": True, "extra_body": {"logit_bias": {token_id(engine, " banana"): 100}}, **GREEDY}
    client = server.client()
    if stream:
        chunks = [c for c in client.chat.completions.create(**ask, stream=True) if c.choices]  # type: ignore[call-overload]
        tokens = [e.token for c in chunks if c.choices[0].logprobs for e in c.choices[0].logprobs.content or []]
        finish = chunks[-1].choices[0].finish_reason
    else:
        choice = client.chat.completions.create(**ask).choices[0]  # type: ignore[call-overload]
        tokens, finish = [e.token for e in choice.logprobs.content], choice.finish_reason
    assert tokens == [" banana"] * 6 and finish == "length"


def test_banned_tokens_never_come_in_a_drawn_reply(server: LiveServer, engine: Engine) -> None:
    """Drawn from the whole distribution at temperature 1: " the" and "," come often in a story, and never once banned."""
    ask = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 48, "logprobs": 0, "temperature": 1.0,
           "extra_body": {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "ignore_eos": True}}
    client = server.client()
    plain = [token for seed in (1, 2) for token in client.completions.create(**ask, seed=seed).choices[0].logprobs.tokens]  # type: ignore[call-overload]
    assert " the" in plain and "," in plain
    ask["extra_body"] = {**ask["extra_body"], "logit_bias": {token_id(engine, " the"): -100, token_id(engine, ","): -100}}  # type: ignore[dict-item]
    for seed in (1, 2):
        tokens = client.completions.create(**ask, seed=seed).choices[0].logprobs.tokens  # type: ignore[call-overload]
        assert len(tokens) == 48 and " the" not in tokens and "," not in tokens


def test_a_banned_token_stays_out_of_a_reply_that_copies_its_prompt_by_drafts(server: LiveServer, engine: Engine) -> None:
    """`serve` drafts by prompt lookup (--lookup-draft) as the reply copies the passage, and the reply never has the
    banned " narrow". Whether a step drafts " narrow" itself depends on the slot's timings, which earlier tests
    left (drafting is chosen where it pays): that drafts of it are refused is tests/test_speculative.py's, on a
    session."""
    passage = "The keeper climbed the narrow stairs at dusk, trimmed the wick and polished the great lens."
    counted = ("localchat_draft_tokens_total", "localchat_draft_tokens_accepted_total")
    before = [server.metric(name) for name in counted]
    body = {"temperature": 0, "repeat_penalty": 1, "dry_multiplier": 0, "logit_bias": {token_id(engine, " narrow"): -100}}
    reply = server.client().completions.create(model=MODEL, prompt=f"{passage}\n{passage}\n{passage}\nThe keeper",
                                               max_tokens=24, logprobs=0, extra_body=body)
    tokens = reply.choices[0].logprobs.tokens  # type: ignore[union-attr]
    assert tokens and tokens[:2] == [" climbed", " the"] and " narrow" not in tokens
    drafted, accepted = (server.metric(name) - was for name, was in zip(counted, before, strict=True))
    assert 0 < accepted <= drafted
