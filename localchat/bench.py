"""`localchat bench`: prefill and decode speed, speculative decoding, KV reuse across turns,
prefix-cache hits."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from importlib.resources import files

from localchat.backends.base import ARGMAX
from localchat.chat import Chat, tokenize_chat
from localchat.engine import Engine
from localchat.errors import ContextOverflowError
from localchat.hardware import MIB, peak_rss_bytes
from localchat.session import GenerationSettings, GenerationStats
from localchat.settings import DEFAULT_LOOKUP_DRAFT
from localchat.templates import Message

PREFILL_TOKENS = 512
DECODE_TOKENS = 128
TURN_REPLY_TOKENS = 64
TURN_SYSTEM_TOKENS = 400
TURN_QUESTIONS = (
    "Who kept the ledger, and for how long?",
    "What changed in the ledger during the last winter?",
    "Why did engineers value the ledger?",
    "How was the lamp powered over the years?",
    "What did visiting children learn at the tower?",
    "What does the last entry in the notebook say?",
)
GREEDY = ARGMAX
# Speculative decoding is measured on two tasks: a reply that copies much of its ~500-token
# prompt (fixing a text's spelling) and one that does not (a story).
GROUNDED_PROMPT_TOKENS = 500
OPEN_ENDED_PROMPT = "Write a long story about a dragon who learns to bake bread.\n\nOnce upon a time"
# The prefix cache is measured on a chat with a long system prompt after two others with it, displaced by another.
PREFIX_SYSTEM_TOKENS = 1000
PREFIX_EARLIER_QUESTIONS = ("Summarise the story in one sentence.", "Where does the story take place?")
PREFIX_HIT_QUESTION = "Who built the tower?"
PREFIX_REPLY_TOKENS = 8


def bench_text() -> str:
    return files("localchat.assets").joinpath("bench_text.txt").read_text(encoding="utf-8")


def _text_of_tokens(engine: Engine, n_tokens: int) -> str:
    """A prefix of the benchmark text about `n_tokens` long."""
    tokens = engine.backend.tokenize(bench_text(), add_bos=False, special=False)
    if len(tokens) < n_tokens:
        raise ValueError(f"the benchmark text has only {len(tokens)} tokens")
    return b"".join(engine.backend.token_bytes(t) for t in tokens[:n_tokens]).decode("utf-8", errors="ignore")


def grounded_prompt(engine: Engine, n_tokens: int = GROUNDED_PROMPT_TOKENS) -> str:
    """An input-grounded task: a text of about `n_tokens` to be written out again."""
    return f"Text with typos:\n{_text_of_tokens(engine, n_tokens)}\n\nThe same text with its spelling corrected:\n"


@dataclass(frozen=True)
class SpeculationResult:
    """Decode speed of one task without and with prompt-lookup drafting (greedy, so the reply is
    the same), and the share of drafted tokens accepted."""

    task: str
    plain_tok_s: float
    lookup_tok_s: float
    acceptance: float | None
    same_reply: bool

    @property
    def speedup(self) -> float:
        return self.lookup_tok_s / self.plain_tok_s if self.plain_tok_s else 0.0


@dataclass(frozen=True)
class BenchResult:
    model_path: str
    backend: str
    n_threads: int
    n_ctx: int
    prefill_tokens: int
    prefill_tok_s: float
    decode_tokens: int
    decode_tok_s: float
    decode_shipped_tok_s: float
    shipped_sampler: str
    ttft_turns_reuse: tuple[float, ...]
    ttft_turns_cold: tuple[float, ...]
    prefix_hit_ttft: float
    prefix_cold_ttft: float
    prefix_restored: bool  # the hit restored the saved state (else computing was measured faster)
    speculation: tuple[SpeculationResult, ...]
    peak_rss_mb: float

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def _first_token(chat: Chat) -> GenerationStats:
    generation = chat.reply(GenerationSettings(max_tokens=1, sampler=GREEDY))
    generation.text()
    assert generation.stats is not None
    return generation.stats


@dataclass(frozen=True)
class SpeedResult:
    prefill_tok_s: float  # PREFILL_TOKENS from an empty cache
    decode_tok_s: float  # DECODE_TOKENS after them, greedy
    decode_shipped_tok_s: float  # the same, with the model's default sampler (as a reply gets it unless told otherwise)
    shipped_sampler: str  # that sampler, in a few words


def measure_speed(engine: Engine) -> SpeedResult:
    """Prefill tok/s over PREFILL_TOKENS from an empty cache; decode tok/s over DECODE_TOKENS after them,
    greedy and with the model's default sampler (no drafts either way)."""
    session = engine.sessions[0]
    prompt = engine.backend.tokenize(bench_text(), add_bos=True, special=False)[:PREFILL_TOKENS]
    session.reset()
    session.generate(prompt[:16], GenerationSettings(max_tokens=4, sampler=GREEDY)).text()  # warm-up
    session.reset()
    shipped = replace(engine.sampler_defaults.settings, seed=0)
    runs = []
    for sampler in (GREEDY, shipped):  # the second keeps the prompt's KV cache: its decode alone differs
        generation = session.generate(prompt, GenerationSettings(max_tokens=DECODE_TOKENS, sampler=sampler, ignore_eos=True))
        generation.text()
        assert generation.stats is not None
        runs.append(generation.stats)
    greedy, default = runs
    return SpeedResult(greedy.prefill_tok_s, greedy.decode_tok_s, default.decode_tok_s, shipped.describe())


def measure_speculation(engine: Engine, tokens: int = DECODE_TOKENS, draft: int = DEFAULT_LOOKUP_DRAFT,
                        ) -> list[SpeculationResult]:
    """Each task decoded `tokens` greedy tokens without and with drafts of up to `draft` tokens,
    the prompt kept in the KV cache between the two."""
    session = engine.sessions[0]
    results = []
    for task, text in (("input-grounded", grounded_prompt(engine)), ("open-ended", OPEN_ENDED_PROMPT)):
        prompt = engine.backend.tokenize(text, add_bos=True, special=False)
        session.reset()
        runs = []
        for lookup in (0, draft):
            generation = session.generate(prompt, GenerationSettings(max_tokens=tokens, sampler=GREEDY, ignore_eos=True,
                                                                     lookup_draft=lookup))
            generation.text()
            assert generation.stats is not None
            runs.append(generation.stats)
        plain, drafted = runs
        results.append(SpeculationResult(
            task=task, plain_tok_s=plain.decode_tok_s, lookup_tok_s=drafted.decode_tok_s,
            acceptance=drafted.accepted_tokens / drafted.drafted_tokens if drafted.drafted_tokens else None,
            same_reply=plain.completion_ids == drafted.completion_ids,
        ))
    session.reset()
    return results


def measure_turns(engine: Engine) -> tuple[list[float], list[float]]:
    """TTFT for each turn of a 6-turn chat with a ~400-token system prompt: reusing the KV cache,
    then recomputing the same prompts from scratch."""
    engine.prefix_cache.clear()
    engine.sessions[0].reset()
    chat = engine.new_chat(_text_of_tokens(engine, TURN_SYSTEM_TOKENS))
    reuse: list[float] = []
    for question in TURN_QUESTIONS:
        generation = chat.send(question, GenerationSettings(max_tokens=TURN_REPLY_TOKENS, sampler=GREEDY))
        chat.commit(generation.text())
        assert generation.stats is not None
        reuse.append(generation.stats.ttft_s)
    cold: list[float] = []
    user_indexes = [i for i, m in enumerate(chat.messages) if m.role == "user"]
    for index in user_indexes:
        engine.prefix_cache.clear()
        engine.sessions[0].reset()
        replay = Chat(engine.sessions[0], engine.template, list(chat.messages[: index + 1]))
        cold.append(_first_token(replay).ttft_s)
    return reuse, cold


def measure_prefix_cache(engine: Engine) -> tuple[float, float, bool]:
    """TTFT of a new chat sharing a ~1k-token system prompt with two earlier, since displaced, chats
    (a prefix-cache hit, restored unless computing is measured faster), and of the same chat with
    nothing cached; and whether the hit was restored. Two: where saved states are restored whole alone
    (Backend.saved_states_rewind), the second saves the part it shares with the first on its way."""
    system = _text_of_tokens(engine, PREFIX_SYSTEM_TOKENS)
    session = engine.sessions[0]
    engine.prefix_cache.clear()
    session.reset()
    reply = GenerationSettings(max_tokens=PREFIX_REPLY_TOKENS, sampler=GREEDY)
    for question in PREFIX_EARLIER_QUESTIONS:
        engine.new_chat(system).send(question, reply).text()
    # Another conversation takes the KV cache; the last one is saved to the prefix cache.
    other = engine.new_chat()
    other.send("Write a haiku about autumn.", reply).text()
    hit = Chat(session, engine.template, [Message("system", system), Message("user", PREFIX_HIT_QUESTION)])
    skipped = engine.prefix_cache.skipped
    hit_stats = _first_token(hit)
    restored = hit_stats.prefix_cache_tokens > 0
    if not restored and engine.prefix_cache.skipped == skipped:
        raise RuntimeError("the prefix cache missed a prompt it should hold")
    engine.prefix_cache.clear()
    session.reset()
    cold = Chat(session, engine.template, [Message("system", system), Message("user", PREFIX_HIT_QUESTION)])
    return hit_stats.ttft_s, _first_token(cold).ttft_s, restored


def context_needed(engine: Engine) -> int:
    """The smallest context that holds each measurement's prompt with its reply (a turn's reply
    stood for by as many tokens of the benchmark text)."""
    backend, template = engine.backend, engine.template
    grounded = backend.tokenize(grounded_prompt(engine), add_bos=True, special=False)
    turns = [Message("system", _text_of_tokens(engine, TURN_SYSTEM_TOKENS))]
    for question in TURN_QUESTIONS:
        turns += [Message("user", question), Message("assistant", _text_of_tokens(engine, TURN_REPLY_TOKENS))]
    prefix = [Message("system", _text_of_tokens(engine, PREFIX_SYSTEM_TOKENS)), Message("user", PREFIX_EARLIER_QUESTIONS[0])]
    return max(
        PREFILL_TOKENS + DECODE_TOKENS,
        len(grounded) + DECODE_TOKENS,
        len(tokenize_chat(backend, template, turns[:-1])) + TURN_REPLY_TOKENS,
        len(tokenize_chat(backend, template, prefix)) + PREFIX_REPLY_TOKENS,
    )


def run_bench(engine: Engine) -> BenchResult:
    """Every measurement; a context too small for them is refused before the first."""
    needed = context_needed(engine)
    if engine.backend.n_ctx < needed:
        raise ContextOverflowError(f"a context of {engine.backend.n_ctx} tokens is too small for the benchmark's prompts: "
                                   f"give --ctx {needed} or more")
    speed = measure_speed(engine)
    speculation = measure_speculation(engine)
    reuse, cold = measure_turns(engine)
    hit, prefix_cold, restored = measure_prefix_cache(engine)
    engine.prefix_cache.clear()
    return BenchResult(
        model_path=str(engine.model_plan.model.path),
        backend=engine.backend.name,
        n_threads=engine.plan.n_threads,
        n_ctx=engine.backend.n_ctx,
        prefill_tokens=PREFILL_TOKENS,
        prefill_tok_s=speed.prefill_tok_s,
        decode_tokens=DECODE_TOKENS,
        decode_tok_s=speed.decode_tok_s,
        decode_shipped_tok_s=speed.decode_shipped_tok_s,
        shipped_sampler=speed.shipped_sampler,
        ttft_turns_reuse=tuple(reuse),
        ttft_turns_cold=tuple(cold),
        prefix_hit_ttft=hit,
        prefix_cold_ttft=prefix_cold,
        prefix_restored=restored,
        speculation=tuple(speculation),
        peak_rss_mb=peak_rss_bytes() / MIB,
    )
