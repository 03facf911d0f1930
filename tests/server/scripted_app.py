"""The real app, scheduler and sessions over a scripted backend: a stand-in model that writes the
replies a test queues, with a real chat template. It speaks the Backend protocol (characters as
tokens, chosen markers as control tokens that print nothing) and honours a constrained reply's
grammar as a model would: it writes its script while the grammar allows, then the allowed token it
prefers. The server's tool-call and reasoning handling runs end to end in milliseconds, driven by
the openai client."""

from __future__ import annotations

import json
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from fastapi import FastAPI
from fastapi.testclient import TestClient
from openai import OpenAI

from localchat.adapters import LoraSpec
from localchat.backends.base import LoraScales, ModelInfo, SamplerSettings, TokenScores
from localchat.constraints import TokenGuide
from localchat.engine import Engine, new_prefix_cache
from localchat.model_loading import ModelPlan
from localchat.models import ModelRef
from localchat.server.app import create_app
from localchat.server.settings import ServerSettings
from localchat.settings import Settings

BOS, EOS, UNKNOWN = 1, 2, 3
FIRST_CONTROL = 10
FIRST_CHARACTER = 100
# Its characters, one token each: ASCII, Latin to arrows, and what the tests' templates and texts hold beyond.
ALPHABET = "\t\n\r" + "".join(map(chr, range(0x20, 0x7F))) + "".join(map(chr, range(0xA0, 0x2500))) + "東京｜▁"
N_VOCAB = FIRST_CHARACTER + len(ALPHABET)
# What the stand-in model writes when its script leaves the grammar: the end, else what closes JSON
# soonest, else the allowed token with the lowest id.
PREFERRED = '"}]{'


@dataclass
class _ScriptSampler:
    tokens: deque[int]
    guide: TokenGuide | None
    prompts: list[str]
    text_of: Callable[[int], str]

    def accept(self, tokens: Sequence[int], *, reply: bool = False) -> None:
        """The decoder shows its sampler the reply's prompt first: record it."""
        self.prompts.append("".join(self.text_of(t) for t in tokens))

    def reset(self) -> None: ...

    def close(self) -> None: ...


@dataclass(eq=False)
class ScriptedBackend:
    """Writes each queued reply in turn (then EOS); records each prompt as text."""

    chat_template: str
    control: tuple[str, ...] = ()  # marker texts that are single control tokens
    seconds_per_token: float = 0.0
    n_ctx: int = 4096
    n_seq: int = 2
    name: str = "scripted"
    even_rows: bool = False
    rewinds: bool = True
    saved_states_rewind: bool = True
    first_shape_steps: float = 0.0
    replies: deque[str] = field(default_factory=deque)
    prompts: list[str] = field(default_factory=list)
    sampled: list[int] = field(default_factory=list)  # tokens written, per reply
    samplers: list[SamplerSettings] = field(default_factory=list)  # each reply's sampler settings
    lora_files: list[Path] = field(default_factory=list)
    loras: LoraScales = ()  # the adapters set now
    batches: list[tuple[LoraScales, tuple[int, ...]]] = field(default_factory=list)  # adapters and sequences of each batch
    evaluated: list[tuple[int, LoraScales]] = field(default_factory=list)  # each evaluation's sequence and adapters

    def __post_init__(self) -> None:
        self.info = ModelInfo(Path("scripted.gguf"), "scripted", "scripted", N_VOCAB, self.n_ctx, 1, BOS, EOS,
                              False, frozenset({EOS}), self.chat_template, 0)
        self._ids = {character: FIRST_CHARACTER + number for number, character in enumerate(ALPHABET)}
        self._characters = {token: character for character, token in self._ids.items()}
        self._held: dict[int, list[int]] = {}
        self._preferred = [EOS, *(self._ids[c] for c in PREFERRED)]

    def tokenize(self, text: str, *, add_bos: bool, special: bool) -> list[int]:
        if not isinstance(text, str):  # as the real backends: llguidance probes with bytes
            raise TypeError("tokenize takes text")
        tokens, position = [BOS] if add_bos else [], 0
        while position < len(text):
            marker = next((m for m in self.control if special and text.startswith(m, position)), None)
            if marker is not None:
                tokens.append(FIRST_CONTROL + self.control.index(marker))
                position += len(marker)
            else:
                tokens.append(self._ids.get(text[position], UNKNOWN))
                position += 1
        return tokens

    def token_bytes(self, token: int) -> bytes:
        return self._characters.get(token, "\ufffd" if token == UNKNOWN else "").encode()

    def token_text(self, token: int) -> str:
        if token in self._characters:
            return self._characters[token]
        if FIRST_CONTROL <= token < FIRST_CONTROL + len(self.control):
            return self.control[token - FIRST_CONTROL]
        return {BOS: "<bos>", EOS: "<eos>", UNKNOWN: "\ufffd"}.get(token, "")

    def evaluate(self, seq: int, tokens: Sequence[int], start: int) -> None:
        self.evaluated.append((seq, self.loras))
        self._held[seq] = self._held.get(seq, [])[:start] + list(tokens)

    def evaluate_batch(self, items: Sequence[tuple[int, int, int]], *, spare_cell: bool = False) -> None:
        self.batches.append((self.loras, tuple(seq for seq, _, _ in items)))
        for seq, token, position in items:
            self.evaluate(seq, [token], position)

    def evaluate_all(self, seq: int, tokens: Sequence[int], start: int) -> np.ndarray:
        """Prompt-lookup drafts are checked against the script: its next tokens are what `sample`
        gives for each row."""
        self.evaluate(seq, tokens, start)
        return np.zeros((len(tokens), N_VOCAB), dtype=np.float32)

    def truncate(self, seq: int, start: int) -> None:
        self._held[seq] = self._held.get(seq, [])[:start]

    def make_sampler(self, settings: SamplerSettings, guide: TokenGuide | None = None, *, seq: int | None = None, raw_logits: bool = False) -> _ScriptSampler:
        script = self.tokenize(self.replies.popleft(), add_bos=False, special=True) if self.replies else []
        self.sampled.append(0)
        self.samplers.append(settings)
        return _ScriptSampler(deque([*script, EOS]), guide, self.prompts, self.token_text)

    def sample(self, seq: int, sampler: _ScriptSampler, row: int = -1) -> int:  # type: ignore[override]
        time.sleep(self.seconds_per_token)
        self.sampled[-1] += 1
        token = sampler.tokens.popleft() if sampler.tokens else EOS
        if sampler.guide is not None:
            logits = np.zeros(N_VOCAB, dtype=np.float32)
            sampler.guide.mask(logits)
            allowed = logits > -np.inf
            if not allowed[token]:  # the script leaves the grammar: from here on, what the grammar lets it write
                sampler.tokens.clear()
                token = next((t for t in self._preferred if allowed[t]), int(np.argmax(allowed)))
            sampler.guide.consume(token)
        return token

    def score(self, seq: int, tokens: Sequence[int]) -> TokenScores:
        raise NotImplementedError

    def save_state(self, seq: int) -> bytes:
        return json.dumps(self._held.get(seq, [])).encode()

    def restore_state(self, seq: int, state: bytes) -> None:
        self._held[seq] = json.loads(state)

    def load_lora(self, path: Path) -> int:
        self.lora_files.append(path)
        return len(self.lora_files) - 1

    def use_loras(self, scales: LoraScales) -> None:
        self.loras = scales

    def hold_compute(self, step: Callable[[], bool]) -> None:
        while step():
            pass

    def close(self, *, process_ends: bool = False) -> None: ...


def scripted_engine(backend: ScriptedBackend, home: Path) -> Engine:
    """An engine over `backend`, its model file and prefix cache in `home`."""
    model_file = home / "scripted.gguf"
    model_file.write_bytes(b"scripted")
    plan = ModelPlan(ModelRef(model_file, "gguf", "scripted"), None, None, None, None)  # type: ignore[arg-type]
    settings_here = Settings(data_dir=home, cache_dir=home, prefix_cache_disk_bytes=0)
    return Engine(plan, backend, settings_here, new_prefix_cache(plan, settings_here))  # type: ignore[arg-type]


def scripted_app(backend: ScriptedBackend, home: Path, settings: ServerSettings | None = None,
                 loras: Sequence[LoraSpec] = ()) -> FastAPI:
    """The app over `backend`, with `loras` loaded on it."""
    engine = scripted_engine(backend, home)
    engine.add_loras(loras)
    return create_app(engine, settings or ServerSettings())


@contextmanager
def scripted_client(backend: ScriptedBackend, home: Path, settings: ServerSettings | None = None,
                    loras: Sequence[LoraSpec] = ()) -> Iterator[tuple[OpenAI, TestClient]]:
    """The app over `backend`, and an openai client and a plain HTTP client talking to it in process."""
    with TestClient(scripted_app(backend, home, settings, loras)) as http:
        yield OpenAI(base_url="http://testserver/v1", api_key="none", http_client=http, max_retries=0), http
