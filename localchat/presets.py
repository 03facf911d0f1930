"""Presets: a local model under a name of its own, with its own system prompt, opening messages and
sampling defaults. They are what Ollama's `ollama create` makes from a Modelfile's FROM, SYSTEM, MESSAGE and
PARAMETER lines (localchat's /api/create makes them), and every front end honours them: `run`, the chat app
and the server load the model and start each chat from the preset.

A preset is a small JSON file in the models folder, NAME.preset.json, written whole then renamed. It names
its model rather than copying it, so deleting a preset frees nothing and deleting its model leaves the
preset unusable (it says so when loaded)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localchat.backends.base import SamplerSettings
from localchat.errors import InvalidSettingError, ModelError
from localchat.sampling_defaults import SamplerDefaults

if TYPE_CHECKING:
    from localchat.session import GenerationSettings
    from localchat.templates import Message

PRESET_SUFFIX = ".preset.json"
# A preset's name: a file name in the models folder, as /api/copy's.
PRESET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
PRESET_ROLES = ("system", "user", "assistant")
# The sampler settings a preset may set, with their types (the rest of SamplerSettings is the model's).
SAMPLING_FIELDS: dict[str, type] = {
    "temperature": float, "top_k": int, "top_p": float, "min_p": float, "repeat_penalty": float,
    "presence_penalty": float, "frequency_penalty": float, "penalty_last_n": int, "dry_multiplier": float, "seed": int,
}


@dataclass(frozen=True)
class PresetMessage:
    role: str
    content: str


@dataclass(frozen=True)
class ModelPreset:
    """`model`: the name (or path) of the model it runs, as `resolve_model` takes it."""

    name: str
    model: str
    system: str | None = None
    messages: tuple[PresetMessage, ...] = ()
    sampling: tuple[tuple[str, float | int], ...] = ()
    stop: tuple[str, ...] = ()
    max_tokens: int | None = None
    context: int | None = None
    license: str | None = None

    def __post_init__(self) -> None:
        """Every value checked, so that a preset that exists loads: a bad one says what is wrong with it."""
        if not PRESET_NAME.match(self.name):
            raise InvalidSettingError(f"preset name '{self.name}' is invalid: give letters, digits, '.', '_' and '-'")
        unknown = [field for field, _ in self.sampling if field not in SAMPLING_FIELDS]
        if unknown:
            raise InvalidSettingError(f"a preset cannot set {unknown[0]}; it sets {', '.join(SAMPLING_FIELDS)}")
        dataclasses.replace(SamplerSettings(), **dict(self.sampling))  # InvalidSettingError naming a bad value
        for message in self.messages:
            if message.role not in PRESET_ROLES:
                raise InvalidSettingError(f"a preset's message role '{message.role}' is not one of {', '.join(PRESET_ROLES)}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise InvalidSettingError("a preset's reply limit must be at least 1 token")
        if self.context is not None and self.context < 16:
            raise InvalidSettingError(f"a preset's context of {self.context} tokens is too small: give at least 16")

    def sampler(self, defaults: SamplerDefaults) -> SamplerDefaults:
        """The model's default sampler with this preset's settings over it."""
        if not self.sampling:
            return defaults
        return SamplerDefaults(dataclasses.replace(defaults.settings, **dict(self.sampling)),
                               f"preset {self.name} over {defaults.source}")

    def opening(self, messages: Sequence[Message]) -> list[Message]:
        """What a chat whose own messages are `messages` shows the model: a system prompt first (the chat's own,
        else the preset's), then the preset's messages, then the chat's. (Templates are imported here: they import
        numpy and jinja2, which planning a model leaves to the load, test_model_loading.)"""
        from localchat.templates import Message

        own_system = list(messages[:1]) if messages and messages[0].role == "system" else []
        system = own_system or ([Message("system", self.system)] if self.system else [])
        mine = [Message(m.role, m.content) for m in self.messages]  # type: ignore[arg-type]  # roles checked when made
        return [*system, *mine, *messages[len(own_system):]]

    def reply_settings(self, settings: GenerationSettings) -> GenerationSettings:
        """`settings`, a front end's defaults, with this preset's stop strings and reply limit in their place where it
        sets them."""
        return dataclasses.replace(settings, stop=self.stop or settings.stop,
                                   max_tokens=self.max_tokens if self.max_tokens is not None else settings.max_tokens)

    @property
    def text_bytes(self) -> int:
        """The UTF-8 bytes of the text it adds to a chat (its system prompt and messages)."""
        return sum(len(text.encode()) for text in [self.system or "", *(m.content for m in self.messages)])

    def as_json(self) -> dict[str, Any]:
        fields: dict[str, Any] = {"model": self.model, "system": self.system,
                                  "messages": [{"role": m.role, "content": m.content} for m in self.messages],
                                  "sampling": dict(self.sampling), "stop": list(self.stop), "max_tokens": self.max_tokens,
                                  "context": self.context, "license": self.license}
        return {key: value for key, value in fields.items() if value not in (None, [], {})}


def preset_from_json(name: str, data: Mapping[str, Any]) -> ModelPreset:
    """A preset from its JSON form (`ModelPreset.as_json`); InvalidSettingError says what is wrong."""
    def typed(key: str, kind: type, default: Any = None) -> Any:
        value = data.get(key, default)
        if value is not None and not (isinstance(value, kind) and not isinstance(value, bool)):
            raise InvalidSettingError(f"'{key}' must be {kind.__name__}")
        return value

    model = typed("model", str)
    if not model:
        raise InvalidSettingError("it names no model")
    messages = typed("messages", list, [])
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in messages):
        raise InvalidSettingError("'messages' must be a list of {\"role\", \"content\"} objects")
    sampling = typed("sampling", dict, {})
    numbers = {key: value for key, value in sampling.items()
               if isinstance(value, (int, float)) and not isinstance(value, bool) and key in SAMPLING_FIELDS}
    if len(numbers) != len(sampling):
        raise InvalidSettingError(f"'sampling' holds numbers for {', '.join(SAMPLING_FIELDS)}")
    stop = typed("stop", list, [])
    if not all(isinstance(item, str) and item for item in stop):
        raise InvalidSettingError("'stop' must be a list of strings")
    return ModelPreset(
        name, model, typed("system", str), tuple(PresetMessage(m["role"], m["content"]) for m in messages),
        tuple((key, SAMPLING_FIELDS[key](value)) for key, value in numbers.items()), tuple(stop),
        typed("max_tokens", int), typed("context", int), typed("license", str))


def preset_path(folder: Path, name: str) -> Path:
    return folder / f"{name}{PRESET_SUFFIX}"


def preset_name(path: Path) -> str:
    """The name of the preset whose file is `path`."""
    return path.name.removesuffix(PRESET_SUFFIX)


def is_preset_file(path: Path) -> bool:
    return path.name.endswith(PRESET_SUFFIX) and path.is_file()


def read_preset(path: Path) -> ModelPreset:
    """The preset in `path`; ModelError in one line when it cannot be read."""
    name = preset_name(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(data, dict):
            raise InvalidSettingError("it is not a JSON object")
        return preset_from_json(name, data)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, InvalidSettingError) as error:
        raise ModelError(f"preset {name} ({path}) cannot be read: {error}; delete it and create it again") from None


def preset_runs(path: Path) -> str | None:
    """The model the preset in `path` runs; None when the preset cannot be read."""
    try:
        return read_preset(path).model
    except ModelError:
        return None


def write_preset(preset: ModelPreset, folder: Path) -> Path:
    """`preset` written to the models folder `folder`, whole or not at all (a crash leaves the old one)."""
    target = preset_path(folder, preset.name)
    partial = target.with_name(f"{target.name}.{os.getpid()}-{threading.get_ident()}.incomplete")  # writers apart
    folder.mkdir(parents=True, exist_ok=True)
    try:
        partial.write_text(json.dumps(preset.as_json(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target
