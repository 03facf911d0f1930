"""response_format through the real server and the default model, driven by the openai client:
every reply parses and follows its schema (constrained decoding), checked here by a small
validator of the JSON Schema keywords these schemas use, independent of llguidance.

Free-length numbers are few here: a grammar bounds a number's value, not its digits, and the
270M model sampled at 0.8 may write fraction digits until max_tokens."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

import pytest
from live_server import LiveServer
from pydantic import BaseModel, Field

from localchat.models import DEFAULT_MODEL_NAME

MODEL = DEFAULT_MODEL_NAME
NAME = {"type": "string", "minLength": 1, "maxLength": 12}

SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0, "maximum": 150}}, "required": ["name", "age"]},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"]},
    {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False},
    {"type": "object", "properties": {"tags": {"type": "array", "items": NAME, "minItems": 2, "maxItems": 3}}, "required": ["tags"]},
    {"type": "object", "properties": {"score": {"type": "integer", "minimum": 0, "maximum": 10}}, "required": ["score"]},
    {"type": "object", "properties": {"year": {"type": "integer", "minimum": 1900, "maximum": 2100}}, "required": ["year"]},
    {"type": "object", "properties": {"code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{2}$"}}, "required": ["code"]},
    {"type": "object", "properties": {"owner": {"type": "object", "properties": {"name": NAME, "email": {"type": "string", "pattern": "^[a-z]{1,8}@[a-z]{1,8}\\.com$"}}, "required": ["name", "email"]}}, "required": ["owner"]},
    {"type": "object", "properties": {"id": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 999}, {"type": "string", "maxLength": 6}]}}, "required": ["id"]},
    {"type": "array", "items": {"type": "integer", "minimum": 1, "maximum": 9}, "minItems": 3, "maxItems": 3},
    {"type": "object", "properties": {"point": {"type": "array", "items": {"type": "integer", "minimum": -90, "maximum": 90}, "minItems": 2, "maxItems": 2}}, "required": ["point"]},
    {"type": "object", "properties": {"city": NAME, "country": NAME, "population": {"type": "integer", "minimum": 0, "maximum": 2000000000}}, "required": ["city", "country", "population"]},
    {"type": "object", "properties": {"status": {"const": "done"}, "count": {"type": "integer", "minimum": 0, "maximum": 5}}, "required": ["status", "count"]},
    {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "object", "properties": {"sku": NAME, "qty": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["sku", "qty"], "additionalProperties": False}, "minItems": 1, "maxItems": 2}}, "required": ["items"]},
    {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "percent": {"type": "number", "minimum": 0, "maximum": 100, "multipleOf": 0.5}}, "required": ["answer", "percent"]},
    {"type": "object", "properties": {"value": {"anyOf": [{"type": "boolean"}, {"type": "null"}]}}, "required": ["value"]},
    {"type": "object", "properties": {"date": {"type": "string", "pattern": "^20[0-9]{2}-[01][0-9]-[0-3][0-9]$"}}, "required": ["date"]},
    {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "object", "properties": {"c": {"type": "integer", "minimum": -5, "maximum": 5}}, "required": ["c"]}}, "required": ["b"]}}, "required": ["a"]},
    {"type": "object", "properties": {"title": NAME, "pages": {"type": "integer", "minimum": 1, "maximum": 900}, "genre": {"enum": ["novel", "poetry", "essay"]}}, "required": ["title", "pages", "genre"], "additionalProperties": False},
    {"type": "object", "properties": {"shape": {"anyOf": [
        {"type": "object", "properties": {"kind": {"const": "circle"}, "r": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["kind", "r"], "additionalProperties": False},
        {"type": "object", "properties": {"kind": {"const": "square"}, "side": {"type": "integer", "minimum": 1, "maximum": 9}}, "required": ["kind", "side"], "additionalProperties": False},
    ]}}, "required": ["shape"]},
]


def closed(schema: Any) -> Any:
    """`schema` with additionalProperties false on every object, as OpenAI's strict mode asks
    (open objects let a small model add keys until max_tokens)."""
    if isinstance(schema, list):
        return [closed(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    walked = {key: closed(value) for key, value in schema.items()}
    return {"additionalProperties": False, **walked} if schema.get("type") == "object" else walked


SCHEMAS = closed(SCHEMAS)
JSON_TYPES: dict[str, Any] = {
    "object": dict, "array": list, "string": str, "boolean": bool, "null": type(None),
    "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
}


def violations(value: Any, schema: dict[str, Any], at: str = "$") -> list[str]:
    """Where `value` breaks `schema` (the keywords SCHEMAS use); empty when it follows it."""
    if "anyOf" in schema:
        return [] if any(not violations(value, option, at) for option in schema["anyOf"]) else [f"{at}: no anyOf option fits"]
    kind = schema.get("type")
    if kind is not None:
        check = JSON_TYPES[kind]
        if not (check(value) if callable(check) and not isinstance(check, type) else isinstance(value, check)):
            return [f"{at}: not {kind}"]
    found = []
    if "enum" in schema and value not in schema["enum"]:
        found.append(f"{at}: {value!r} not in enum")
    if "const" in schema and value != schema["const"]:
        found.append(f"{at}: {value!r} is not {schema['const']!r}")
    bounds = [("minimum", lambda v, b: v >= b), ("maximum", lambda v, b: v <= b), ("minLength", lambda v, b: len(v) >= b),
              ("maxLength", lambda v, b: len(v) <= b), ("minItems", lambda v, b: len(v) >= b), ("maxItems", lambda v, b: len(v) <= b),
              ("multipleOf", lambda v, b: float(v / b).is_integer())]
    found += [f"{at}: {key} {schema[key]} broken by {value!r}" for key, holds in bounds if key in schema and not holds(value, schema[key])]
    if "pattern" in schema and not re.search(schema["pattern"], value):
        found.append(f"{at}: {value!r} does not match {schema['pattern']}")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        found += [f"{at}: '{key}' missing" for key in schema.get("required", []) if key not in value]
        if schema.get("additionalProperties") is False:
            found += [f"{at}: '{key}' not allowed" for key in value if key not in properties]
        for key, item in value.items():
            found += violations(item, properties.get(key, {}), f"{at}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            found += violations(item, schema["items"], f"{at}[{i}]")
    return found


def test_the_validator_catches_what_it_checks() -> None:
    assert violations({"code": "AB-12"}, SCHEMAS[6]) and violations([1, 2], SCHEMAS[9]) and violations({"id": "toolong"}, SCHEMAS[8])
    assert violations({"shape": {"kind": "circle", "side": 3}}, SCHEMAS[19]) and violations({"ok": True, "x": 1}, SCHEMAS[2])
    assert not violations({"shape": {"kind": "square", "side": 3}}, SCHEMAS[19]) and not violations([1, 2, 3], SCHEMAS[9])


def test_twenty_schemas_give_replies_that_follow_them(server: LiveServer) -> None:
    client = server.client()

    def ask(number: int) -> tuple[str, str | None]:
        reply = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Answer in JSON."}], max_tokens=60, temperature=0.8, seed=number,
            response_format={"type": "json_schema", "json_schema": {"name": f"s{number}", "schema": SCHEMAS[number], "strict": True}},
        )
        return reply.choices[0].message.content or "", reply.choices[0].finish_reason

    with ThreadPoolExecutor(4) as pool:
        replies = list(pool.map(ask, range(len(SCHEMAS))))
    failures = [(i, text, finish, violations(json.loads(text), SCHEMAS[i]) if finish == "stop" else "cut")
                for i, (text, finish) in enumerate(replies)]
    assert [f for f in failures if f[3]] == [], "\n".join(map(str, failures))


def test_json_object_gives_an_object(server: LiveServer) -> None:
    reply = server.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "A JSON object about a cat."}], max_tokens=60, temperature=0, seed=1,
        response_format={"type": "json_object"},
    )
    text = reply.choices[0].message.content or ""
    assert text.startswith("{")
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)


@pytest.mark.parametrize("response_format", [
    {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMAS[11]}},
    {"type": "json_object"},
], ids=["json_schema", "json_object"])
def test_stop_strings_never_cut_a_json_reply(server: LiveServer, response_format: dict[str, Any]) -> None:
    """The reply is held to its grammar: a stop string such as "}" would cut the JSON short. (A free
    object may run to max_tokens: it must then be the text so far, its stop strings in it.)"""
    ask = {"model": MODEL, "messages": [{"role": "user", "content": "A JSON object about Paris."}], "max_tokens": 80,
           "temperature": 0, "seed": 1, "response_format": response_format, "stop": ["}", ",", '"']}
    client = server.client()
    chunks = list(client.chat.completions.create(**ask, stream=True))  # type: ignore[call-overload]
    whole = client.chat.completions.create(**ask).choices[0]  # type: ignore[call-overload]
    streamed = ("".join(c.choices[0].delta.content or "" for c in chunks if c.choices), chunks[-1].choices[0].finish_reason)
    for text, finish in [(whole.message.content or "", whole.finish_reason), streamed]:
        assert text.startswith('{"'), text  # the stop string '"' did not cut it at its second character
        if response_format["type"] == "json_schema" or finish == "stop":
            assert finish == "stop" and not violations(json.loads(text), SCHEMAS[11] if response_format["type"] == "json_schema" else {})


@pytest.mark.parametrize(
    ("response_format", "message"),
    [
        ({"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "bogus"}}}, "Invalid type"),
        ({"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "string", "pattern": "a("}}}, "regex"),
        ({"type": "json_schema"}, "needs a json_schema"),
        ({"type": "xml"}, "response_format"),
    ],
)
def test_a_schema_that_cannot_be_used_is_a_400(server: LiveServer, response_format: dict[str, Any], message: str) -> None:
    answer = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "response_format": response_format})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert message in error["message"] and error["param"] is not None and "response_format" in error["param"]


class Pet(BaseModel):
    name: str = Field(max_length=12)
    species: Literal["cat", "dog", "bird"]
    age: int = Field(ge=0, le=30)


def test_the_openai_client_parses_into_a_pydantic_model(server: LiveServer) -> None:
    client = server.client()
    parse = client.chat.completions.parse if hasattr(client.chat.completions, "parse") else client.beta.chat.completions.parse
    reply = parse(model=MODEL, messages=[{"role": "user", "content": "Describe a pet."}], response_format=Pet, max_tokens=60,
                  temperature=0, seed=1)
    pet = reply.choices[0].message.parsed
    assert isinstance(pet, Pet) and pet.species in ("cat", "dog", "bird") and 0 <= pet.age <= 30
