"""Sessions and chats on the real default model in llama.cpp: KV reuse, prefix cache, limits."""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from greedy_paths import assert_same_until_near_tie
from localchat.backends.base import ARGMAX, SamplerSettings
from localchat.backends.llamacpp import LlamaSampler
from localchat.bench import bench_text
import localchat.model_loading as model_loading
from localchat.engine import Engine
from localchat.errors import ContextOverflowError
from localchat.hardware import detect_hardware
from localchat.planner import PlanRequest
from localchat.prefix_cache import MIN_MATCH_TOKENS
from localchat.chat import Chat, tokenize_chat
from localchat.session import PREFILL_CHUNK, Generation, GenerationSettings
from localchat.settings import Settings
from localchat.templates import Message

GREEDY = GenerationSettings(max_tokens=24, sampler=ARGMAX)
GREEDY_WITH_MARGINS = dataclasses.replace(GREEDY, logprobs=2)
# Tokens a reply must share with its cold run before the cold run's first near tie ("The capital of France is
# Paris." is 7 tokens, with no near tie in the default chat model).
MIN_COMPARED = 6
SYSTEM = "You answer questions about geography. " * 12


@pytest.fixture
def fresh(engine: Engine) -> Iterator[Engine]:
    engine.sessions[0].reset()
    engine.prefix_cache.clear()
    engine.prefix_cache.skipped = 0
    yield engine
    engine.sessions[0].reset()
    engine.prefix_cache.clear()


def cold_reply(engine: Engine, messages: list[Message]) -> Generation:
    """The greedy reply computed from an empty KV cache and prefix cache, with each step's two best logprobs."""
    engine.sessions[0].reset()
    engine.prefix_cache.clear()
    generation = Chat(engine.sessions[0], engine.template, list(messages)).reply(GREEDY_WITH_MARGINS)
    generation.text()
    assert generation.stats is not None and generation.stats.cached_tokens == 0
    return generation


def assert_like_cold(reply: Generation, cold: Generation) -> None:
    """A reply whose prompt came partly from reused KV equals the cold one up to the cold one's first
    near tie: the reused positions were computed in other batches, which round apart."""
    assert reply.stats is not None
    assert_same_until_near_tie(cold.completion_ids, cold.logprobs, reply.stats.completion_ids, min_compared=MIN_COMPARED)


def test_the_default_model_answers_on_this_cpu(fresh: Engine) -> None:
    generation = fresh.new_chat().send("What is the capital of France?", GREEDY)
    text = generation.text()
    assert generation.stats is not None
    assert text.strip() and generation.stats.completion_tokens > 0
    assert generation.stats.decode_tok_s > 0 and generation.stats.ttft_s > 0


def test_on_a_cpu_with_amx_the_model_loads_without_extra_buffers_and_answers(
    default_model: Path, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama.cpp #20824: AMX weight buffers segfault on Q4_K. This machine may lack AMX, so the
    hardware and the build are described as having it; the load path is the real one."""
    hardware = detect_hardware()
    with_amx = dataclasses.replace(hardware, cpu_flags=hardware.cpu_flags | {"amx_int8", "amx_tile"})
    monkeypatch.setattr(model_loading, "detect_hardware", lambda: with_amx)
    build = model_loading._build_features("gguf")
    monkeypatch.setattr(model_loading, "_build_features", lambda model_format: dataclasses.replace(build, amx=True))
    with Engine.load(str(default_model), settings, PlanRequest(n_ctx=512)) as amx_engine:
        assert not amx_engine.plan.use_extra_bufts
        generation = amx_engine.new_chat().send("What is the capital of France?", GREEDY)
        assert generation.text().strip()


def test_a_second_turn_evaluates_only_its_new_tokens_and_matches_a_cold_run(fresh: Engine) -> None:
    chat = fresh.new_chat(SYSTEM)
    first = chat.send("What is the capital of France?", GREEDY)
    chat.commit(first.text())
    second = chat.send("And what is the capital of Japan?", GREEDY)
    chat.commit(second.text())
    assert first.stats is not None and second.stats is not None
    # Everything up to the first reply is reused; only the new user turn is evaluated.
    assert second.stats.cached_tokens >= first.stats.prompt_tokens + first.stats.completion_tokens - 2
    assert second.stats.prompt_tokens - second.stats.cached_tokens < 20
    assert_like_cold(second, cold_reply(fresh, chat.messages[:-1]))


def test_a_new_chat_with_a_known_system_prompt_restores_it_from_the_prefix_cache(fresh: Engine) -> None:
    fresh.new_chat(SYSTEM).send("What is the capital of Germany?", GREEDY).text()
    fresh.new_chat().send("Say hello.", GREEDY).text()  # takes the KV cache; the first chat is saved
    assert len(fresh.prefix_cache) == 1
    chat = fresh.new_chat(SYSTEM)
    generation = chat.send("What is the capital of Spain?", GREEDY)
    generation.text()
    assert generation.stats is not None
    assert generation.stats.prefix_cache_tokens == generation.stats.cached_tokens > 60
    assert_like_cold(generation, cold_reply(fresh, chat.messages))


def test_a_saved_prefix_is_computed_instead_where_computing_is_measured_faster(fresh: Engine) -> None:
    """As on a GPU, where a prompt is computed faster than its saved state comes back from host memory."""
    fresh.new_chat(SYSTEM).send("What is the capital of Germany?", GREEDY).text()
    fresh.new_chat().send("Say hello.", GREEDY).text()  # takes the KV cache; the first chat is saved
    costs = fresh.prefix_cache.costs
    costs.restore_s_per_byte, costs.prefill_s_per_token = 1.0, 1e-9
    try:
        chat = fresh.new_chat(SYSTEM)
        generation = chat.send("What is the capital of Spain?", GREEDY)
        generation.text()
    finally:
        costs.restore_s_per_byte = costs.prefill_s_per_token = None
    assert generation.stats is not None and generation.stats.prefix_cache_tokens == 0
    # The first chat's entry is kept for when restoring pays, beside the second's (saved as the third took the KV cache).
    assert fresh.prefix_cache.skipped == 1 and len(fresh.prefix_cache) == 2
    assert_like_cold(generation, cold_reply(fresh, chat.messages))


def test_cancel_keeps_the_kv_cache_consistent(fresh: Engine) -> None:
    chat = fresh.new_chat(SYSTEM)
    generation = chat.send("Describe the Alps.", GenerationSettings(max_tokens=200, sampler=ARGMAX))
    pieces = []
    for piece in generation:
        pieces.append(piece)
        if len(pieces) == 3:
            generation.cancel()
    assert generation.stats is not None and generation.stats.finish_reason == "cancelled"
    chat.commit("".join(pieces))
    follow_up = chat.send("What is the capital of Italy?", GREEDY)
    follow_up.text()
    assert follow_up.stats is not None
    # At least the first prompt is reused (the template may re-render the cut reply's tail).
    assert follow_up.stats.cached_tokens >= generation.stats.prompt_tokens
    assert_like_cold(follow_up, cold_reply(fresh, chat.messages))


def test_the_same_seed_gives_the_same_sample(fresh: Engine) -> None:
    settings = GenerationSettings(max_tokens=16, sampler=SamplerSettings(temperature=1.0, seed=42))
    replies = []
    for _ in range(2):
        fresh.sessions[0].reset()
        generation = fresh.new_chat().send("Tell me a story.", settings)
        generation.text()
        assert generation.stats is not None
        replies.append(generation.stats.completion_ids)
    assert replies[0] == replies[1]
    # The seed and the temperature are used: another seed, and greedy decoding, give other replies.
    for other in (SamplerSettings(temperature=1.0, seed=43), SamplerSettings(temperature=0)):
        fresh.sessions[0].reset()
        generation = fresh.new_chat().send("Tell me a story.", GenerationSettings(max_tokens=16, sampler=other))
        generation.text()
        assert generation.stats is not None and generation.stats.completion_ids != replies[0], other


def test_a_prompt_longer_than_the_context_is_refused(fresh: Engine) -> None:
    with pytest.raises(ContextOverflowError, match="context holds 2048"):
        fresh.new_chat().send("word " * 3000, GREEDY)


def test_a_long_conversation_drops_its_oldest_turns_but_keeps_the_system_prompt(fresh: Engine) -> None:
    chat = fresh.new_chat("SYSTEM-MARKER")
    for i in range(12):
        chat.messages += [Message("user", f"TURN-{i} " + "lorem ipsum " * 60), Message("assistant", "ok " * 20)]
    chat.messages.append(Message("user", "LAST-QUESTION"))
    tokens = chat.prompt_tokens(reply_room=256)
    text = b"".join(fresh.backend.token_bytes(t) for t in tokens).decode()
    assert len(tokens) + 256 <= fresh.backend.n_ctx
    assert "SYSTEM-MARKER" in text and "LAST-QUESTION" in text
    assert "TURN-0 " not in text and "TURN-11 " in text
    assert len(chat.messages) == 26  # the history itself is kept


def test_perplexity_of_the_benchmark_text_is_sane(fresh: Engine) -> None:
    tokens = fresh.backend.tokenize(bench_text(), add_bos=True, special=False)[:256]
    scores = fresh.backend.score(0, tokens)
    assert len(scores.logprobs) == 255
    assert 1.5 < scores.perplexity < 60


@pytest.mark.parametrize("process_ends", [False, True], ids=["model freed", "model left to the process end"])
def test_a_conversation_continued_after_a_restart_restores_its_kv_from_disk(tmp_path: Path, default_model: Path,
                                                                          process_ends: bool) -> None:
    """Also where `localchat run` leaves llama.cpp's memory to the process's end: the state is written first."""
    settings = Settings(cache_dir=tmp_path)  # its own disk tier
    before = Engine.load(str(default_model), settings, PlanRequest(n_ctx=2048))
    try:
        chat = before.new_chat(SYSTEM)
        first = chat.send("What is the capital of France?", GREEDY)
        chat.commit(first.text())
        history = list(chat.messages)
    finally:
        before.close(process_ends=process_ends)
    assert first.stats is not None
    with Engine.load(str(default_model), settings, PlanRequest(n_ctx=2048)) as after:
        chat = Chat(after.sessions[0], after.template, history)
        second = chat.send("And what is the capital of Japan?", GREEDY)
        second.text()
        assert second.stats is not None
        # The first turn's prompt and reply come back from the disk tier; only the new turn is computed.
        assert second.stats.prefix_cache_tokens >= first.stats.prompt_tokens + first.stats.completion_tokens - 2
        assert_like_cold(second, cold_reply(after, chat.messages))


def test_a_damaged_disk_entry_gives_the_reply_of_a_cold_run(tmp_path: Path, default_model: Path) -> None:
    settings = Settings(cache_dir=tmp_path)
    with Engine.load(str(default_model), settings, PlanRequest(n_ctx=2048)) as before:
        chat = before.new_chat(SYSTEM)
        chat.commit(chat.send("What is the capital of France?", GREEDY).text())
        history = [*chat.messages, Message("user", "And what is the capital of Japan?")]
        cold = cold_reply(before, history)
    (entry_file,) = tmp_path.rglob("*.kv")
    intact = entry_file.read_bytes()
    # A flipped bit in the token list (past the shortest match a restore needs), early in the KV state
    # and at its very end; then the intact entry.
    token_byte = len(b"LCKV2\0") + 24 + 4 * (MIN_MATCH_TOKENS + 16)
    for position in (token_byte, len(intact) // 3, len(intact) - 1, None):
        for stale in tmp_path.rglob("*.kv"):
            stale.unlink()
        damaged = bytearray(intact)
        if position is not None:
            damaged[position] ^= 0x10
        entry_file.write_bytes(bytes(damaged))
        with Engine.load(str(default_model), settings, PlanRequest(n_ctx=2048)) as after:
            generation = Chat(after.sessions[0], after.template, list(history)).reply(GREEDY)
            generation.text()
            assert generation.stats is not None
            if position is None:
                assert generation.stats.prefix_cache_tokens > 60
            else:
                assert generation.stats.prefix_cache_tokens == 0, f"the entry damaged at byte {position} was restored"
            assert_like_cold(generation, cold)


def test_a_state_saved_after_an_interrupted_evaluation_still_restores(fresh: Engine) -> None:
    session, backend = fresh.sessions[0], fresh.backend
    chat = tokenize_chat(backend, fresh.template, [Message("system", SYSTEM), Message("user", "What is the capital of Germany?")])
    prompt, question = chat[:-16], chat[-16:]  # the system prompt, then the question's turn

    def reply() -> Generation:
        generation = session.generate(prompt + question, GREEDY_WITH_MARGINS)
        generation.text()
        assert generation.stats is not None
        return generation

    session.prefill(prompt)
    # Ctrl-C right after llama_decode returned: the KV cache holds tokens the session never recorded.
    backend.evaluate(session.seq, backend.tokenize(" lorem ipsum", add_bos=False, special=False), len(session.tokens))
    session.release()  # saved to the prefix cache
    restored = reply()
    session.reset()
    fresh.prefix_cache.clear()
    cold = reply()
    assert restored.stats is not None and cold.stats is not None
    assert restored.stats.prefix_cache_tokens == len(prompt) and cold.stats.cached_tokens == 0
    assert_like_cold(restored, cold)


def test_plain_greedy_picks_what_llamas_greedy_sampler_picks(fresh: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    prompt = fresh.backend.tokenize("The history of the lighthouse begins", add_bos=True, special=False)

    def reply() -> tuple[int, ...]:
        fresh.sessions[0].reset()
        generation = fresh.sessions[0].generate(prompt, GenerationSettings(max_tokens=32, sampler=ARGMAX))
        generation.text()
        assert generation.stats is not None
        return generation.stats.completion_ids

    by_argmax = reply()
    monkeypatch.setattr(LlamaSampler, "argmax_only", False)
    assert reply() == by_argmax


def test_penalties_run_in_llamas_sampler_chain_and_change_a_repetitive_reply(fresh: Engine) -> None:
    def reply(sampler: SamplerSettings) -> tuple[int, ...]:
        fresh.sessions[0].reset()
        generation = fresh.sessions[0].generate(
            fresh.backend.tokenize("one one one one one one", add_bos=True, special=False),
            GenerationSettings(max_tokens=16, sampler=sampler),
        )
        generation.text()
        assert generation.stats is not None
        return generation.stats.completion_ids

    plain = reply(ARGMAX)
    penalised = reply(SamplerSettings(temperature=0, repeat_penalty=1.5, presence_penalty=1.0, frequency_penalty=1.0))
    assert penalised != plain
    # Each repeated token is penalised: the penalised reply repeats its most frequent token less.
    assert Counter(penalised).most_common(1)[0][1] < Counter(plain).most_common(1)[0][1]


def test_a_cancel_during_the_prompt_stops_before_evaluating_it_all(fresh: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    chat = fresh.new_chat(SYSTEM)
    generation = chat.send("lorem ipsum " * 300 + "\nWhat is the capital of France?", GREEDY)
    evaluate = fresh.backend.evaluate

    def evaluate_then_cancel(*args: object, **kwargs: object) -> object:
        result = evaluate(*args, **kwargs)
        generation.cancel()  # Escape while the first chunk of a long prompt is evaluated
        return result

    monkeypatch.setattr(fresh.backend, "evaluate", evaluate_then_cancel)
    assert generation.text() == ""
    monkeypatch.undo()
    assert generation.stats is not None and generation.stats.finish_reason == "cancelled"
    assert generation.stats.prompt_tokens > 2 * PREFILL_CHUNK
    assert len(fresh.sessions[0].tokens) == PREFILL_CHUNK  # the chunk in flight completed, no more
    retry = chat.reply(GREEDY)
    retry.text()
    assert retry.stats is not None and retry.stats.cached_tokens == PREFILL_CHUNK  # the evaluated chunk is reused
    assert_like_cold(retry, cold_reply(fresh, chat.messages))


def test_a_saved_state_the_backend_refuses_is_dropped_and_the_prompt_computed(fresh: Engine) -> None:
    chat = fresh.new_chat(SYSTEM)
    chat.messages.append(Message("user", "What is the capital of Egypt?"))
    prompt = chat.prompt_tokens(reply_room=64)
    fresh.prefix_cache.put(prompt[:-1], b"not a llama.cpp state")
    generation = chat.reply(GREEDY)
    generation.text()
    assert generation.stats is not None and generation.stats.prefix_cache_tokens == 0
    assert len(fresh.prefix_cache) == 0
    assert_like_cold(generation, cold_reply(fresh, chat.messages))
