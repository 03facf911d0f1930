"""llama.cpp's backend sampling (the plan's choice where the output layer is on a GPU), run here on the CPU
backend, which implements the same graph operations: the same greedy replies as sampling on the host, drafts
verified from the rows the device drew, and the host's sampler wherever a reply needs the raw logits."""

from __future__ import annotations

import dataclasses
import queue
from collections.abc import Iterator
from pathlib import Path

import pytest
from greedy_paths import assert_same_until_near_tie

from localchat.backends.base import ARGMAX, SamplerSettings
from localchat.backends.llamacpp import LlamaCppBackend
from localchat.backends.llamacpp_sampler import DeviceSampler, LlamaSampler
from localchat.engine import Engine
from localchat.model_loading import plan_model
from localchat.hardware import GIB, Hardware
from localchat.planner import PlanRequest, plan_offload
from localchat.scheduler import ReplyDone, ReplyEvent, Scheduler, TextDelta
from localchat.chat import tokenize_chat
from localchat.session import GenerationSettings, Session
from localchat.settings import Settings
from localchat.templates import Message
from test_planner import LLAMA_CUDA_BUILD, MISTRAL_7B_Q4_K_M, RTX_3090, machine

COPY = "Copy this text exactly: The keeper climbed the narrow stairs at dusk and trimmed the wick."


def engine_sampling_on_the_device(settings: Settings, model: Path, n_seq: int) -> Engine:
    model_plan = plan_model(str(model), settings, PlanRequest(n_ctx=1024, n_seq=n_seq))
    model_plan = dataclasses.replace(model_plan, plan=dataclasses.replace(model_plan.plan, backend_sampling=True))
    return Engine.from_plan(model_plan, settings)


@pytest.fixture(scope="module")
def device(settings: Settings, default_model: Path) -> Iterator[Engine]:
    """The default model with sampling on the device, two sequences (serve's slots)."""
    with engine_sampling_on_the_device(settings, default_model, 2) as engine:
        yield engine


@pytest.fixture(scope="module")
def device_alone(settings: Settings, default_model: Path) -> Iterator[Engine]:
    """The default model with sampling on the device, one sequence (run, the chat app)."""
    with engine_sampling_on_the_device(settings, default_model, 1) as engine:
        yield engine


def test_the_plan_samples_on_the_gpu_only_with_the_output_layer_there() -> None:
    whole = plan_offload(MISTRAL_7B_Q4_K_M, machine(gpus=(RTX_3090,)), LLAMA_CUDA_BUILD)
    assert whole.n_gpu_layers > MISTRAL_7B_Q4_K_M.n_layers and whole.backend_sampling and whole.load_params.backend_sampling
    small = dataclasses.replace(RTX_3090, total_bytes=6 * GIB, free_bytes=5 * GIB)
    partial = plan_offload(MISTRAL_7B_Q4_K_M, machine(gpus=(small,)), LLAMA_CUDA_BUILD)
    assert 0 < partial.n_gpu_layers <= MISTRAL_7B_Q4_K_M.n_layers and not partial.backend_sampling
    cpu = plan_offload(MISTRAL_7B_Q4_K_M, Hardware("CPU", 2, 2, frozenset(), 16 * GIB, 16 * GIB), LLAMA_CUDA_BUILD)
    assert not cpu.backend_sampling
    slots = plan_offload(MISTRAL_7B_Q4_K_M, machine(gpus=(RTX_3090,)), LLAMA_CUDA_BUILD, PlanRequest(n_seq=4))
    assert slots.backend_sampling and any(reason.startswith("greedy replies sampled on the GPU") for reason in slots.reasons)


def reply(session: Session, prompt: list[int], settings: GenerationSettings) -> tuple[list[int], object]:
    session.reset()
    generation = session.generate(prompt, settings)
    generation.text()
    assert generation.stats is not None
    return list(generation.stats.completion_ids), generation


def test_greedy_replies_drawn_on_the_device_equal_the_host_s(device: Engine, engine: Engine) -> None:
    prompt = tokenize_chat(device.backend, device.template, [Message("user", COPY)])
    assert isinstance(device.backend.make_sampler(ARGMAX, seq=0), DeviceSampler)
    host = engine.sessions[0]
    host.reset()
    reference = host.generate(prompt, GenerationSettings(max_tokens=24, sampler=ARGMAX, logprobs=2))
    reference.text()
    for draft in (0, 8):
        ids, generation = reply(device.sessions[0], prompt, GenerationSettings(max_tokens=24, sampler=ARGMAX, lookup_draft=draft))
        assert_same_until_near_tie(reference.completion_ids, reference.logprobs, ids, min_compared=12)
        if draft:  # the drafted rows were drawn on the device and taken where they matched
            assert generation.stats.accepted_tokens > 0  # type: ignore[attr-defined]


def test_a_reply_needing_the_raw_logits_or_a_history_is_sampled_on_the_host(device: Engine) -> None:
    backend = device.backend
    assert isinstance(backend, LlamaCppBackend)
    assert isinstance(backend.make_sampler(ARGMAX, seq=1, raw_logits=True), LlamaSampler)  # logprobs
    assert isinstance(backend.make_sampler(dataclasses.replace(ARGMAX, repeat_penalty=1.1), seq=1), LlamaSampler)
    assert isinstance(backend.make_sampler(ARGMAX), LlamaSampler)  # no sequence named
    prompt = backend.tokenize("The capital of France is", add_bos=True, special=False)
    ids, generation = reply(device.sessions[1], prompt, GenerationSettings(max_tokens=6, sampler=ARGMAX, logprobs=2))
    assert [entry.token for entry in generation.logprobs] == ids  # type: ignore[attr-defined]
    banned = dataclasses.replace(ARGMAX, logit_bias=((ids[0], -100.0),))  # added to the row on the host
    assert isinstance(backend.make_sampler(banned, seq=0), LlamaSampler)
    assert ids[0] not in reply(device.sessions[0], prompt, GenerationSettings(max_tokens=6, sampler=banned))[0]


def test_a_finished_reply_s_chain_comes_off_its_sequence_where_the_context_has_several(device: Engine) -> None:
    """Every decode's graph carries the chain of each sequence that has one, active or not: on a context of
    several sequences (serve's slots) a reply's chain is released when it ends, and the sequence's raw
    logits are read back again."""
    backend = device.backend
    session = device.sessions[0]
    prompt = backend.tokenize("The capital of France is", add_bos=True, special=False)
    reply(session, prompt, GenerationSettings(max_tokens=4, sampler=ARGMAX))
    backend.evaluate(0, [prompt[-1]], len(session.tokens))
    assert backend.logits(0).shape == (backend.info.n_vocab,)
    session.reset()


def test_a_context_of_several_sequences_draws_only_greedy_replies_on_the_device(device: Engine, device_alone: Engine) -> None:
    drawn = SamplerSettings()  # llama.cpp's default chain
    assert isinstance(device.backend.make_sampler(ARGMAX, seq=0), DeviceSampler)
    assert isinstance(device.backend.make_sampler(drawn, seq=0), LlamaSampler)
    assert isinstance(device_alone.backend.make_sampler(drawn, seq=0), DeviceSampler)


def test_seeded_sampling_on_the_device_repeats_and_depends_on_the_seed(device_alone: Engine) -> None:
    prompt = tokenize_chat(device_alone.backend, device_alone.template, [Message("user", "Write a story about a dragon.")])
    drawn = [SamplerSettings(temperature=1.0, seed=seed) for seed in (7, 7, 8)]
    assert isinstance(device_alone.backend.make_sampler(drawn[0], seq=0), DeviceSampler)
    runs = [reply(device_alone.sessions[0], prompt, GenerationSettings(max_tokens=16, sampler=sampler))[0] for sampler in drawn]
    assert runs[0] == runs[1] and runs[0] != runs[2]


def test_batched_replies_are_drawn_on_the_device_for_each_sequence(device: Engine) -> None:
    questions = ["What is the capital of Japan?", "What is the capital of Italy?"]
    alone = []
    for question in questions:
        prompt = tokenize_chat(device.backend, device.template, [Message("user", question)])
        alone.append(reply(device.sessions[0], prompt, GenerationSettings(max_tokens=12, sampler=ARGMAX))[0])
    device.sessions[0].reset()
    scheduler = Scheduler(device, max_waiting=0)
    scheduler.start()
    try:
        sinks: list[queue.SimpleQueue[ReplyEvent]] = [queue.SimpleQueue() for _ in questions]
        for question, sink in zip(questions, sinks, strict=True):
            prompt = tokenize_chat(device.backend, device.template, [Message("user", question)])
            scheduler.submit(prompt, GenerationSettings(max_tokens=12, sampler=ARGMAX), sink.put)
        together = []
        for sink in sinks:
            while not isinstance(event := sink.get(timeout=60), ReplyDone):
                assert isinstance(event, TextDelta), event
            together.append(list(event.stats.completion_ids))
    finally:
        scheduler.close()
    # "The capital of X is Y." : the model is sure of every token of it.
    assert [t[:6] for t in together] == [a[:6] for a in alone]
