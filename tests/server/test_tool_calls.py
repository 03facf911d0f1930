"""Tool calls and reasoning through the OpenAI API: the real app, scheduler and templates over a
scripted model (scripted_app.py) that writes what each family's model writes, driven by the
openai client, streamed and whole."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from chat_format_cases import (
    QWEN3,
    QWEN3_CALLS,
    TOOLS,
    TOOLS_QUESTION,
    WEATHER_TOOL,
    template_text,
)
from scripted_app import ScriptedBackend, scripted_client

from localchat.server.settings import ServerSettings
from localchat.templates import fallback_template


@pytest.fixture
def qwen3(tmp_path: Path) -> Iterator[tuple[openai.OpenAI, ScriptedBackend]]:
    backend = ScriptedBackend(QWEN3)
    with scripted_client(backend, tmp_path) as (client, _):
        yield client, backend


def _calls(message: Any) -> list[tuple[str, dict[str, Any]]]:
    return [(call.function.name, json.loads(call.function.arguments)) for call in message.tool_calls or ()]


def _assert_text_then_calls(whole: Any, chunks: list[Any], expected: list[tuple[str, dict[str, Any]]], reasoning: str | None) -> None:
    """A reply of "I'll look." (after `reasoning`) and the calls `expected`, whole and as its stream's pieces."""
    message = whole.choices[0].message
    assert _calls(message) == expected and whole.choices[0].finish_reason == "tool_calls"
    assert (message.content, getattr(message, "reasoning_content", None)) == ("I'll look.", reasoning)
    pieces = [call for chunk in chunks for call in chunk.choices[0].delta.tool_calls or ()]
    assert [call.function.name for call in pieces if call.id is not None] == [name for name, _ in expected]
    streamed = ["".join(call.function.arguments or "" for call in pieces if call.index == index) for index in range(len(expected))]
    assert [json.loads(arguments) for arguments in streamed] == [arguments for _, arguments in expected]
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks).strip() == "I'll look."


def test_calls_and_reasoning_come_back_whole_and_streamed(qwen3: tuple[openai.OpenAI, ScriptedBackend]) -> None:
    client, backend = qwen3
    backend.replies.extend([QWEN3_CALLS] * 3)
    whole = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=TOOLS)
    message = whole.choices[0].message
    assert whole.choices[0].finish_reason == "tool_calls"
    assert message.content is None and message.reasoning_content == "The user wants both."  # type: ignore[attr-defined]
    assert _calls(message) == [("get_weather", {"city": "Zürich"}), ("get_time", {"city": "Zürich"})]
    assert all(call.id.startswith("call_") and call.type == "function" for call in message.tool_calls or ())
    assert "<tools>" in backend.prompts[-1] and '"name": "get_time"' in backend.prompts[-1]

    chunks = list(client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=TOOLS, stream=True))
    deltas = [chunk.choices[0].delta for chunk in chunks]
    pieces = [(call.index, call) for delta in deltas for call in delta.tool_calls or ()]
    firsts: dict[int, Any] = {}
    for index, call in pieces:
        firsts.setdefault(index, call)
    assert [(c.id is not None, c.type, c.function.name, c.function.arguments) for c in firsts.values()] == [
        (True, "function", "get_weather", ""), (True, "function", "get_time", "")]
    assert all(call.id is None and call.function.name is None for index, call in pieces if call is not firsts[index])
    assert "".join(d.reasoning_content or "" for d in deltas) == "The user wants both."  # type: ignore[attr-defined]
    for index, expected in enumerate(message.tool_calls or ()):
        assert "".join(call.function.arguments or "" for i, call in pieces if i == index) == expected.function.arguments
    assert chunks[-1].choices[0].finish_reason == "tool_calls"

    # The SDK's stream helper assembles the pieces into the same calls.
    with client.chat.completions.stream(model="scripted", messages=TOOLS_QUESTION, tools=TOOLS) as stream:
        final = stream.get_final_completion()
    assert _calls(final.choices[0].message) == _calls(message)


def test_markers_that_are_control_tokens_are_read(tmp_path: Path) -> None:
    """Mistral's [TOOL_CALLS]/[ARGS] and gpt-oss's channels are control tokens that print nothing:
    the server has the reply show them, reads them, and none reaches the client."""
    mistral = ScriptedBackend(template_text("mistral_small3_2"), ("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"))
    mistral.replies.append('[TOOL_CALLS]get_weather[ARGS]{"city": "Bern"}[TOOL_CALLS]get_time[ARGS]{"city": "Bern"}')
    with scripted_client(mistral, tmp_path) as (client, _):
        reply = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=TOOLS)
    assert _calls(reply.choices[0].message) == [("get_weather", {"city": "Bern"}), ("get_time", {"city": "Bern"})]

    harmony = ("<|channel|>", "<|message|>", "<|end|>", "<|start|>", "<|constrain|>", "<|call|>", "<|return|>")
    gpt_oss = ScriptedBackend(template_text("gpt_oss"), harmony)
    gpt_oss.replies.extend(["<|channel|>analysis<|message|>Simple.<|end|><|start|>assistant<|channel|>final<|message|>Sunny.<|return|>"] * 2)
    with scripted_client(gpt_oss, tmp_path) as (client, _):
        whole = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, extra_body={"reasoning_effort": "low"})
        chunks = list(client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, stream=True))
    assert "Reasoning: low" in gpt_oss.prompts[0] and "Reasoning: medium" in gpt_oss.prompts[1]
    assert whole.choices[0].message.content == "Sunny." and whole.choices[0].finish_reason == "stop"
    assert whole.choices[0].message.reasoning_content == "Simple."  # type: ignore[attr-defined]
    streamed = [(c.choices[0].delta.content or "", c.choices[0].delta.reasoning_content or "") for c in chunks]  # type: ignore[attr-defined]
    assert ("".join(c for c, _ in streamed), "".join(r for _, r in streamed)) == ("Sunny.", "Simple.")


def test_a_named_function_is_forced(qwen3: tuple[openai.OpenAI, ScriptedBackend]) -> None:
    """The server writes the call's opening through the name: the model only writes arguments. The reply ends as
    OpenAI's chat completions end a call tool_choice named: "stop", streamed or not (vLLM's match them)."""
    client, backend = qwen3
    backend.replies.extend(['{"city": "Oslo"}}\n</tool_call>'] * 2)
    choice = {"type": "function", "function": {"name": "get_time"}}
    reply = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=TOOLS, tool_choice=choice)  # type: ignore[arg-type]
    # What Qwen3's template writes before a call in a reply of nothing else: an empty think block.
    assert backend.prompts[-1].endswith('<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n{"name": "get_time", "arguments": ')
    assert _calls(reply.choices[0].message) == [("get_time", {"city": "Oslo"})] and reply.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=TOOLS, tool_choice=choice, stream=True))  # type: ignore[arg-type]
    first_call = chunks[1].choices[0].delta.tool_calls  # right after the role, before the model wrote a token
    assert first_call is not None and first_call[0].function is not None and first_call[0].function.name == "get_time"
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]


def test_required_makes_the_model_pick_a_function(qwen3: tuple[openai.OpenAI, ScriptedBackend]) -> None:
    client, backend = qwen3
    backend.replies.append('get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>')
    reply = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=TOOLS, tool_choice="required")
    assert backend.prompts[-1].endswith('<tool_call>\n{"name": "')
    assert _calls(reply.choices[0].message) == [("get_weather", {"city": "Oslo"})]
    assert reply.choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize(("choice", "finish_reason"), [({"type": "function", "function": {"name": "get_weather"}}, "stop"),
                                                       ("required", "tool_calls")])
def test_a_model_that_would_not_call_still_returns_a_valid_call(qwen3: tuple[openai.OpenAI, ScriptedBackend], choice: Any,
                                                                finish_reason: str) -> None:
    """A forced call is constrained to its grammar: the stand-in model's script (plain text) is
    refused token by token, and what it may write instead is a call whose arguments follow the schema."""
    client, backend = qwen3
    backend.replies.extend(["I would rather chat about the weather."] * 2)
    reply = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=TOOLS, tool_choice=choice)
    calls = _calls(reply.choices[0].message)
    assert len(calls) == 1 and calls[0][0] in ("get_weather", "get_time") and calls[0][1] == {"city": ""}
    assert reply.choices[0].finish_reason == finish_reason and reply.choices[0].message.content is None
    streamed = list(client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=TOOLS, tool_choice=choice, stream=True))
    arguments = "".join(call.function.arguments or "" for chunk in streamed for call in chunk.choices[0].delta.tool_calls or ()
                        if call.function is not None)
    assert json.loads(arguments) == {"city": ""}


def test_without_parallel_calls_the_reply_ends_after_its_first_call(tmp_path: Path) -> None:
    backend = ScriptedBackend(QWEN3, seconds_per_token=0.002)
    script = QWEN3_CALLS + "\nAnd more text the model goes on writing." * 80  # 3,000 tokens: 6 s unless stopped
    backend.replies.append(script)
    with scripted_client(backend, tmp_path) as (client, _):
        reply = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=TOOLS, parallel_tool_calls=False)
    assert _calls(reply.choices[0].message) == [("get_weather", {"city": "Zürich"})]
    assert reply.choices[0].finish_reason == "tool_calls"
    assert reply.usage is not None and reply.usage.completion_tokens < len(script) / 2  # stopped, not run to its end


def test_stop_strings_end_the_text_outside_calls_only(qwen3: tuple[openai.OpenAI, ScriptedBackend]) -> None:
    """tool_choice auto: a call's text is the function's and its arguments', no place for the reply
    to end (a stop "}" would cut the arguments); the text around calls ends at a stop string as usual."""
    client, backend = qwen3
    backend.replies.extend([QWEN3_CALLS + "\nDone} and more."] * 2)
    whole = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=TOOLS, stop=["}", "Zü"])
    assert _calls(whole.choices[0].message) == [("get_weather", {"city": "Zürich"}), ("get_time", {"city": "Zürich"})]
    assert whole.choices[0].finish_reason == "tool_calls" and whole.choices[0].message.content == "Done"
    with client.chat.completions.stream(model="scripted", messages=TOOLS_QUESTION, tools=TOOLS, stop=["}", "Zü"]) as stream:
        final = stream.get_final_completion()
    assert _calls(final.choices[0].message) == _calls(whole.choices[0].message)

    backend.replies.append('It is} <tool_call>\n{"name": "get_time", "arguments": {"city": "Bern"}}\n</tool_call>')
    cut = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=TOOLS, stop="}")
    assert (cut.choices[0].message.content, cut.choices[0].message.tool_calls, cut.choices[0].finish_reason) == ("It is", None, "stop")


def test_tool_choice_none_shows_no_tools_and_reads_no_calls(qwen3: tuple[openai.OpenAI, ScriptedBackend]) -> None:
    client, backend = qwen3
    backend.replies.append('<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    reply = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=TOOLS, tool_choice="none")
    assert "get_time" not in backend.prompts[-1]
    assert reply.choices[0].message.tool_calls is None and reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].message.content == '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>'


def test_a_reply_held_to_a_response_format_is_never_read_as_a_call(tmp_path: Path) -> None:
    """With Gemma's template calls are bare JSON where the reply begins, as a JSON answer is."""
    backend = ScriptedBackend(fallback_template("gemma3"))
    backend.replies.append('{"name": "Bob"}')
    schema = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    with scripted_client(backend, tmp_path) as (client, _):
        reply = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=TOOLS, response_format={
            "type": "json_schema", "json_schema": {"name": "person", "schema": schema}})
    assert reply.choices[0].message.content == '{"name": "Bob"}' and reply.choices[0].message.tool_calls is None


# Upstage Solar Open's and Tencent Hy3's markers, control tokens in their vocabularies.
SOLAR_CONTROL = ("<|begin|>", "<|end|>", "<|think|>", "<|content|>", "<|tool_calls|>", "<|tool_call:begin|>", "<|tool_call:name|>",
                 "<|tool_call:args|>", "<|tool_call:end|>", "<|calls|>")
HY3_CONTROL = tuple(f"<{tag}:opensource>" for tag in ("think", "/think", "tool_calls", "/tool_calls", "tool_call", "/tool_call", "tool_sep",
                                                       "arg_key", "/arg_key", "arg_value", "/arg_value"))
# GigaChat 3's separators (their newlines in the tokens) and 3.1's call token, control tokens in their vocabularies.
GIGACHAT_CONTROL = ("<|role_sep|>\n", "<|message_sep|>\n\n", "<|function_call|>")
GEMMA4_CONTROL = ("<|tool_call>", "<tool_call|>", '<|"|>', "<|channel>", "<channel|>", "<|turn>", "<turn|>")
HISTORY: list[dict[str, Any]] = [
    *TOOLS_QUESTION,
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_7f3a9b2c", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Zürich"}'}}]},
    {"role": "tool", "tool_call_id": "call_7f3a9b2c", "content": "21 °C, clear"},
]


@pytest.mark.parametrize(("template", "control", "expected"), ids=["qwen3", "mistral_small3_2", "llama3_1", "qwen3_coder", "glm4_6", "nemotron_nano_v2", "seed_oss", "minimax_m2",
                                                                   "deepseek_v3_1", "deepseek_v3_2", "deepseek_v4", "kimi_k2", "minicpm5", "lfm2", "gemma4",
                                                                   "apertus", "solar_open", "hy3", "gemma_fallback"], argvalues=[
    (QWEN3, (), ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Zürich"}}\n</tool_call>',
                 "<tool_response>\n21 °C, clear\n</tool_response>"]),
    (template_text("mistral_small3_2"), (),
     ['[TOOL_CALLS]get_weather[CALL_ID]', '[ARGS]{"city": "Zürich"}', "[TOOL_CONTENT]21 °C, clear[/TOOL_RESULTS]"]),
    (template_text("llama3_1"), (),
     ['{"name": "get_weather", "parameters": {"city": "Zürich"}}', "ipython<|end_header_id|>\n\n\"21 °C, clear\""]),
    (template_text("qwen3_coder"), (),
     ["<tool_call>\n<function=get_weather>\n<parameter=city>\nZürich\n</parameter>\n</function>\n</tool_call>",
      "<tool_response>\n21 °C, clear\n</tool_response>"]),
    (template_text("glm4_6"), (),
     ["<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Zürich</arg_value>\n</tool_call>",
      "<|observation|>\n<tool_response>\n21 °C, clear\n</tool_response>"]),
    (template_text("nemotron_nano_v2"), (),
     ['<TOOLCALL>[{"name": "get_weather", "arguments": {"city": "Zürich"}}]</TOOLCALL>', "<TOOL_RESPONSE>[21 °C, clear]</TOOL_RESPONSE>"]),
    (template_text("seed_oss"), (),
     ["<seed:tool_call>\n<function=get_weather>\n<parameter=city>Zürich</parameter>\n</function>\n</seed:tool_call>",
      "<seed:bos>tool\n21 °C, clear<seed:eos>"]),
    (template_text("minimax_m2"), (),
     ['<minimax:tool_call>\n<invoke name="get_weather">\n<parameter name="city">Zürich</parameter>\n</invoke>\n</minimax:tool_call>',
      "<response>21 °C, clear</response>"]),
    (template_text("deepseek_v3_1"), (),
     ['<｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Zürich"}<｜tool▁call▁end｜>',
      "<｜tool▁output▁begin｜>21 °C, clear<｜tool▁output▁end｜>"]),
    (template_text("deepseek_v3_2"), (),
     [('<｜DSML｜function_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Zürich</｜DSML｜parameter>\n'
       "</｜DSML｜invoke>\n</｜DSML｜function_calls>"), "<function_results>\n<result>21 °C, clear</result>\n</function_results>"]),
    (template_text("deepseek_v4"), (),
     [('<｜DSML｜tool_calls>\n<｜DSML｜invoke name="get_weather">\n<｜DSML｜parameter name="city" string="true">Zürich</｜DSML｜parameter>\n'
       "</｜DSML｜invoke>\n</｜DSML｜tool_calls>"), "<｜User｜><tool_result>21 °C, clear</tool_result><｜Assistant｜>"]),
    (template_text("kimi_k2"), (),
     ['<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{"city": "Zürich"}<|tool_call_end|>',
      "21 °C, clear<|im_end|>"]),
    (template_text("minicpm5"), (),
     ['<function name="get_weather"><param name="city">Zürich</param></function>', "<tool_response>\n21 °C, clear\n</tool_response>"]),
    (template_text("lfm2"), (),
     ['<|tool_call_start|>[get_weather(city="Zürich")]<|tool_call_end|>', "<|im_start|>tool\n<|tool_response_start|>21 °C, clear<|tool_response_end|>"]),
    (template_text("gemma4"), GEMMA4_CONTROL,
     ['<|tool_call>call:get_weather{city:<|"|>Zürich<|"|>}<tool_call|>',
      '<|tool_response>response:get_weather{value:<|"|>21 °C, clear<|"|>}<tool_response|>']),
    (template_text("apertus"), (), ['<|tools_prefix|>[{"get_weather": {"city": "Zürich"}}]<|tools_suffix|>[21 °C, clear]']),
    (template_text("solar_open"), SOLAR_CONTROL,
     [('<|begin|>assistant<|tool_calls|><|tool_call:begin|>call_7f3a9b2c<|tool_call:name|>get_weather<|tool_call:args|>{"city": "Zürich"}'
      "<|tool_call:end|><|calls|>"), ("<|tool_response:begin|>call_7f3a9b2c<|tool_response:name|>get_weather<|tool_response:result|>"
      "21 °C, clear<|tool_response:end|><|end|><|begin|>assistant")]),
    (template_text("hy3"), HY3_CONTROL,
     [("<tool_calls:opensource>\n<tool_call:opensource>get_weather<tool_sep:opensource>\n<arg_key:opensource>city</arg_key:opensource>\n"
      "<arg_value:opensource>Zürich</arg_value:opensource>\n</tool_call:opensource>\n</tool_calls:opensource>"),
      "<tool_responses:opensource>\n<tool_response:opensource>\n21 °C, clear\n</tool_response:opensource>\n</tool_responses:opensource>"]),
    (fallback_template("gemma3"), (), ["reply with only a JSON object", '{"name": "get_weather", "arguments": {"city": "Zürich"}}',
                                       "<start_of_turn>user\n21 °C, clear<end_of_turn>"]),
])
def test_tool_results_render_through_the_template_and_the_model_answers(tmp_path: Path, template: str, control: tuple[str, ...],
                                                                        expected: list[str]) -> None:
    backend = ScriptedBackend(template, control)
    backend.replies.append("It is 21 °C and clear.")
    with scripted_client(backend, tmp_path) as (client, _):
        reply = client.chat.completions.create(model="scripted", messages=HISTORY, tools=TOOLS)  # type: ignore[arg-type]
        if backend.prompts[-1].rstrip().endswith("<think>"):
            # The prompt opened the model's thinking (Nemotron Nano 2, MiniMax-M2): it was all thought; a model closes it.
            assert reply.choices[0].message.content == ""
            backend.replies.append("Sure.</think>It is 21 °C and clear.")
            reply = client.chat.completions.create(model="scripted", messages=HISTORY, tools=TOOLS)  # type: ignore[arg-type]
    assert [text for text in expected if text not in backend.prompts[-1]] == []
    assert reply.choices[0].message.content == "It is 21 °C and clear." and reply.choices[0].finish_reason == "stop"


def test_thinking_is_turned_off_by_the_request_or_the_server(tmp_path: Path) -> None:
    backend = ScriptedBackend(QWEN3)
    backend.replies.extend(["Hi."] * 4)
    off = "<|im_start|>assistant\n<think>\n\n</think>\n\n"
    with scripted_client(backend, tmp_path) as (client, _):
        client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION)
        client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, extra_body={"reasoning_effort": "none"})
    with scripted_client(backend, tmp_path, ServerSettings(enable_thinking=False)) as (client, _):
        client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION)
    assert [prompt.endswith(off) for prompt in backend.prompts] == [False, True, True, True]


def test_reasoning_is_split_out_without_tools(qwen3: tuple[openai.OpenAI, ScriptedBackend]) -> None:
    client, backend = qwen3
    backend.replies.append("<think>\nParis, surely.\n</think>\n\nParis.")
    reply = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION)
    assert reply.choices[0].message.content == "Paris."
    assert reply.choices[0].message.reasoning_content == "Paris, surely."  # type: ignore[attr-defined]


@pytest.mark.parametrize(("extra", "param"), [
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_moon"}}}, "tool_choice"),
    ({"tools": [WEATHER_TOOL, WEATHER_TOOL]}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "no spaces allowed"}}]}, "tools.0.function.name"),
    ({"messages": [*TOOLS_QUESTION, {"role": "tool", "content": "21"}]}, "messages.1.tool_call_id"),
    ({"messages": [*TOOLS_QUESTION, {"role": "assistant", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]}, "messages.1.tool_calls.0.function.arguments"),
    ({"chat_template_kwargs": {"messages": []}}, "chat_template_kwargs"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}}, "response_format"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"d": {"type": "string",
       "format": "no-such-format"}}}}}], "tool_choice": "required"}, "tools"),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio"),
    ({"top_logprobs": 2}, "top_logprobs"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"modalities": ["text", "audio"]}, "modalities"),
])
def test_requests_localchat_cannot_honour_get_400_naming_the_field(qwen3: tuple[openai.OpenAI, ScriptedBackend], extra: dict[str, Any],
                                                                   param: str) -> None:
    client, _ = qwen3
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, extra_body=extra)  # type: ignore[arg-type]
    error = refused.value.body
    assert isinstance(error, dict) and error["param"] == param, error


def test_harmless_fields_are_accepted(qwen3: tuple[openai.OpenAI, ScriptedBackend]) -> None:
    client, backend = qwen3
    backend.replies.append("Hi.")
    reply = client.chat.completions.create(
        model="scripted", messages=TOOLS_QUESTION, user="u1", metadata={"k": "v"}, store=False, logprobs=False, response_format={"type": "text"},
        extra_body={"service_tier": "auto", "some_other_servers_option": 3})
    assert reply.choices[0].message.content == "Hi."


def test_unsupported_completion_fields_get_400(qwen3: tuple[openai.OpenAI, ScriptedBackend]) -> None:
    client, _ = qwen3
    for extra in ({"echo": True}, {"best_of": 3}, {"logprobs": 6}, {"suffix": "end"}):
        with pytest.raises(openai.BadRequestError) as refused:
            client.completions.create(model="scripted", prompt="Hi", extra_body=extra)
        assert isinstance(refused.value.body, dict) and refused.value.body["param"] == next(iter(extra))


# Qwen3-Coder writes calls as markup; its arguments' values are typed by the tool's schema.
CODER_TOOLS = [*TOOLS, {"type": "function", "function": {"name": "forecast", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "hourly": {"type": "boolean"}}, "required": ["city", "days"]}}}]
CODER_CALLS = ("I'll look.\n<tool_call>\n<function=forecast>\n<parameter=city>\nZürich\n</parameter>\n<parameter=days>\n3\n"
               "</parameter>\n<parameter=hourly>\nfalse\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n"
               "<parameter=city>\nZürich\n</parameter>\n</function>\n</tool_call>")


@pytest.fixture
def coder(tmp_path: Path) -> Iterator[tuple[openai.OpenAI, ScriptedBackend]]:
    backend = ScriptedBackend(template_text("qwen3_coder"))
    with scripted_client(backend, tmp_path) as (client, _):
        yield client, backend


def test_qwen3_coder_markup_calls_come_back_typed_whole_and_streamed(coder: tuple[openai.OpenAI, ScriptedBackend]) -> None:
    client, backend = coder
    backend.replies.extend([CODER_CALLS] * 2)
    expected = [("forecast", {"city": "Zürich", "days": 3, "hourly": False}), ("get_time", {"city": "Zürich"})]
    whole = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=CODER_TOOLS)
    assert _calls(whole.choices[0].message) == expected and whole.choices[0].finish_reason == "tool_calls"
    assert whole.choices[0].message.content == "I'll look.\n"
    assert "<function>\n<name>forecast</name>" in backend.prompts[-1]
    chunks = list(client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=CODER_TOOLS, stream=True))
    pieces = [call for chunk in chunks for call in chunk.choices[0].delta.tool_calls or ()]
    assert [(call.index, call.function.name) for call in pieces if call.id is not None] == [(0, "forecast"), (1, "get_time")]
    streamed = ["".join(call.function.arguments or "" for call in pieces if call.index == index) for index in (0, 1)]
    assert [json.loads(arguments) for arguments in streamed] == [arguments for _, arguments in expected]
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == "I'll look.\n"


def test_qwen3_coder_calls_without_their_wrapper_come_back_typed_whole_and_streamed(coder: tuple[openai.OpenAI, ScriptedBackend]) -> None:
    """`<function=...>` blocks with no `<tool_call>` around them (small, quantized Qwen3-Coders write them so),
    streamed a character a token: the same typed calls as wrapped ones; without tools, the text is content."""
    client, backend = coder
    bare = CODER_CALLS.replace("<tool_call>\n", "").replace("\n</tool_call>", "")
    backend.replies.extend([bare] * 3)
    expected = [("forecast", {"city": "Zürich", "days": 3, "hourly": False}), ("get_time", {"city": "Zürich"})]
    whole = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=CODER_TOOLS).choices[0]
    assert _calls(whole.message) == expected and whole.finish_reason == "tool_calls"
    assert whole.message.content == "I'll look.\n"
    chunks = list(client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=CODER_TOOLS, stream=True))
    pieces = [call for chunk in chunks for call in chunk.choices[0].delta.tool_calls or ()]
    assert [(call.index, call.function.name) for call in pieces if call.id is not None] == [(0, "forecast"), (1, "get_time")]
    streamed = ["".join(call.function.arguments or "" for call in pieces if call.index == index) for index in (0, 1)]
    assert [json.loads(arguments) for arguments in streamed] == [arguments for _, arguments in expected]
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == "I'll look.\n"
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    untooled = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION).choices[0].message
    assert untooled.content == bare and not untooled.tool_calls


def test_qwen3_coder_text_that_mentions_a_function_block_stays_content(coder: tuple[openai.OpenAI, ScriptedBackend]) -> None:
    client, backend = coder
    mention = "Write <function=get_time> and then its parameters."
    backend.replies.extend([mention] * 2)
    whole = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=CODER_TOOLS).choices[0]
    assert whole.message.content == mention and not whole.message.tool_calls and whole.finish_reason == "stop"
    chunks = list(client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=CODER_TOOLS, stream=True))
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == mention
    assert not any(chunk.choices[0].delta.tool_calls for chunk in chunks) and chunks[-1].choices[0].finish_reason == "stop"


def test_qwen3_coder_round_trip_renders_the_call_and_its_result(coder: tuple[openai.OpenAI, ScriptedBackend]) -> None:
    """The call the server returned goes back in the history: the template writes it as markup again."""
    client, backend = coder
    backend.replies.extend([CODER_CALLS, "Sunny for three days."])
    first = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=CODER_TOOLS).choices[0].message
    results = [{"role": "tool", "tool_call_id": call.id, "content": text} for call, text in zip(first.tool_calls or (), ("sunny", "09:30"), strict=True)]
    history = [*TOOLS_QUESTION, first.model_dump(exclude_none=True), *results]
    answer = client.chat.completions.create(model="scripted", messages=history, tools=CODER_TOOLS)  # type: ignore[arg-type]
    assert answer.choices[0].message.content == "Sunny for three days."
    assert ("<parameter=days>\n3\n</parameter>\n<parameter=hourly>\nFalse\n</parameter>" in backend.prompts[-1]
            and "<tool_response>\nsunny\n</tool_response>\n<tool_response>\n09:30\n</tool_response>" in backend.prompts[-1])


def test_qwen3_coder_forced_calls_follow_the_parameters_grammar(coder: tuple[openai.OpenAI, ScriptedBackend]) -> None:
    """Named: the server writes `<tool_call>\\n<function=NAME>\\n`; a grammar holds the parameter blocks
    to the schema (a model that would write text instead still makes a call whose values parse)."""
    client, backend = coder
    backend.replies.extend(["<parameter=city>\nOslo\n</parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
                            "forecast>\n<parameter=city>\nOslo\n</parameter>\n<parameter=days>\nseveral\n</parameter>\n</function>\n</tool_call>"])
    named = {"type": "function", "function": {"name": "forecast"}}
    reply = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=CODER_TOOLS, tool_choice=named)  # type: ignore[arg-type]
    assert backend.prompts[-1].endswith("<|im_start|>assistant\n<tool_call>\n<function=forecast>\n")
    assert _calls(reply.choices[0].message) == [("forecast", {"city": "Oslo", "days": 2})]
    required = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=CODER_TOOLS, tool_choice="required",
                                              max_tokens=200)
    assert backend.prompts[-1].endswith("<tool_call>\n<function=")
    [(name, arguments)] = _calls(required.choices[0].message)
    assert name == "forecast" and arguments["city"] == "Oslo" and isinstance(arguments["days"], int)


def test_glm_markup_calls_and_forced_calls(tmp_path: Path) -> None:
    """GLM-4.5/4.6 through the same machinery: typed calls, and a named call forced by its opening and grammar."""
    backend = ScriptedBackend(template_text("glm4_6"))
    backend.replies.extend([("\n<think>Look it up.</think>\n<tool_call>forecast\n<arg_key>city</arg_key>\n<arg_value>Zürich</arg_value>\n"
                             "<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>"),
                            "<arg_key>city</arg_key>\n<arg_value>Oslo</arg_value>\n<arg_key>days</arg_key>\n<arg_value>two</arg_value>\n</tool_call>"])
    with scripted_client(backend, tmp_path) as (client, _):
        reply = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=CODER_TOOLS)
        assert _calls(reply.choices[0].message) == [("forecast", {"city": "Zürich", "days": 3})]
        assert reply.choices[0].message.reasoning_content == "Look it up."  # type: ignore[attr-defined]
        named = {"type": "function", "function": {"name": "forecast"}}
        forced = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=CODER_TOOLS, tool_choice=named)  # type: ignore[arg-type]
    assert backend.prompts[-1].endswith("<|assistant|>\n<think></think>\n<tool_call>forecast\n")
    [(name, arguments)] = _calls(forced.choices[0].message)
    assert name == "forecast" and arguments["city"] == "Oslo" and isinstance(arguments["days"], int)


GEMMA4_CALLS = ('<|channel>thought\nThe forecast tool.<channel|>I\'ll look.<|tool_call>call:forecast{city:<|"|>Zürich, CH<|"|>,days:3,'
                'hourly:false}<tool_call|><|tool_call>call:get_time{city:<|"|>Zürich<|"|>}<tool_call|>')


@pytest.fixture
def gemma4(tmp_path: Path) -> Iterator[tuple[openai.OpenAI, ScriptedBackend]]:
    backend = ScriptedBackend(template_text("gemma4"), GEMMA4_CONTROL)
    with scripted_client(backend, tmp_path) as (client, _):
        yield client, backend


def test_gemma4_calls_and_thoughts_come_back_whole_and_streamed(gemma4: tuple[openai.OpenAI, ScriptedBackend]) -> None:
    """Gemma 4's calls (its own object notation between control tokens) come back as OpenAI's, with its thought
    apart; its tools are declared in its notation."""
    client, backend = gemma4
    backend.replies.extend([GEMMA4_CALLS] * 2)
    expected = [("forecast", {"city": "Zürich, CH", "days": 3, "hourly": False}), ("get_time", {"city": "Zürich"})]
    whole = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=CODER_TOOLS)
    message = whole.choices[0].message
    assert _calls(message) == expected and whole.choices[0].finish_reason == "tool_calls"
    assert (message.content, message.reasoning_content) == ("I'll look.", "The forecast tool.")  # type: ignore[attr-defined]
    assert '<|tool>declaration:forecast{' in backend.prompts[-1]
    chunks = list(client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=CODER_TOOLS, stream=True))
    pieces = [call for chunk in chunks for call in chunk.choices[0].delta.tool_calls or ()]
    assert [(call.index, call.function.name) for call in pieces if call.id is not None] == [(0, "forecast"), (1, "get_time")]
    streamed = ["".join(call.function.arguments or "" for call in pieces if call.index == index) for index in (0, 1)]
    assert [json.loads(arguments) for arguments in streamed] == [arguments for _, arguments in expected]
    assert "".join(chunk.choices[0].delta.content or "" for chunk in chunks) == "I'll look."


def test_gemma4_text_that_only_looks_like_a_call_stays_content(gemma4: tuple[openai.OpenAI, ScriptedBackend]) -> None:
    """A section whose body is no call in Gemma's notation is the reply's text, as the model wrote it."""
    client, backend = gemma4
    written = ['<|tool_call>write call:name{...}<tool_call|> to call.', "Use call:forecast{days:3} to call."]
    backend.replies.extend(written)
    replies = [client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=CODER_TOOLS).choices[0].message
               for _ in written]
    assert [(reply.content, reply.tool_calls) for reply in replies] == [(text, None) for text in written]


@pytest.mark.parametrize("quote_token", [True, False], ids=["quote_is_a_control_token", "quote_is_text"])
def test_gemma4_forced_calls_follow_its_notation_s_grammar(tmp_path: Path, quote_token: bool) -> None:
    """Named: the server writes `<|tool_call>call:NAME`; a grammar holds the object to the schema in Gemma's
    notation (a model that would write a word for a number still makes a call whose values parse)."""
    control = tuple(marker for marker in GEMMA4_CONTROL if quote_token or marker != '<|"|>')
    backend = ScriptedBackend(template_text("gemma4"), control)
    with scripted_client(backend, tmp_path) as (client, _):
        _gemma4_forced_calls(client, backend)


def _gemma4_forced_calls(client: openai.OpenAI, backend: ScriptedBackend) -> None:
    backend.replies.extend(['{city:<|"|>Oslo<|"|>,days:2}<tool_call|>', 'forecast{city:<|"|>Oslo<|"|>,days:several}<tool_call|>'])
    named = {"type": "function", "function": {"name": "forecast"}}
    reply = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=CODER_TOOLS, tool_choice=named)  # type: ignore[arg-type]
    assert backend.prompts[-1].endswith("<|turn>model\n<|channel>thought\n<channel|><|tool_call>call:forecast")
    assert _calls(reply.choices[0].message) == [("forecast", {"city": "Oslo", "days": 2})]
    required = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=CODER_TOOLS, tool_choice="required",
                                              max_tokens=200)
    assert backend.prompts[-1].endswith("<|tool_call>call:")
    [(name, arguments)] = _calls(required.choices[0].message)
    assert name == "forecast" and arguments["city"] == "Oslo" and isinstance(arguments["days"], int)


DEEPSEEK_CONTROL = ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>")
# DeepSeek V3.2's and V4's calls (DSML), each value marked a string or not.
DSML_FORECAST = ('<｜DSML｜invoke name="forecast">\n<｜DSML｜parameter name="city" string="true">Zürich</｜DSML｜parameter>\n'
                 '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name="get_time">\n'
                 '<｜DSML｜parameter name="city" string="true">Zürich</｜DSML｜parameter>\n</｜DSML｜invoke>\n')
KIMI_CONTROL = ("<|tool_calls_section_begin|>", "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>",
                "<|tool_calls_section_end|>")


@pytest.mark.parametrize(("template", "control", "reply", "reasoning"), ids=["nemotron_nano_v2", "seed_oss", "minimax_m2", "deepseek_v3_1", "deepseek_v3_2",
                                                                          "deepseek_v4", "kimi_k2", "minicpm5", "lfm2", "solar_open", "hy3",
                                                                          "glm4_7_flash", "apriel1_6"], argvalues=[
    ("nemotron_nano_v2", (), ('Weather.</think>I\'ll look.<TOOLCALL>[{"name": "forecast", "arguments": {"city": "Zürich", "days": 3}}, '
     '{"name": "get_time", "arguments": {"city": "Zürich"}}]</TOOLCALL>'), "Weather."),
    ("seed_oss", (), ("<seed:think>Weather.</seed:think>I'll look.<seed:tool_call>\n<function=forecast>\n<parameter=city>Zürich</parameter>\n"
     "<parameter=days>3</parameter>\n</function>\n</seed:tool_call><seed:tool_call>\n<function=get_time>\n<parameter=city>Zürich"
     "</parameter>\n</function>\n</seed:tool_call>"), "Weather."),
    ("minimax_m2", (), ('Weather.</think>\n\nI\'ll look.<minimax:tool_call>\n<invoke name="forecast">\n<parameter name="city">Zürich</parameter>\n'
     '<parameter name="days">3</parameter>\n</invoke>\n<invoke name="get_time">\n<parameter name="city">Zürich</parameter>\n</invoke>\n'
     "</minimax:tool_call>"), "Weather."),
    ("deepseek_v3_1", DEEPSEEK_CONTROL, ('I\'ll look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>forecast<｜tool▁sep｜>{"city": "Zürich", "days": 3}'
     '<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{"city": "Zürich"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>'), None),
    ("deepseek_v3_2", (), ("I'll look.<｜DSML｜function_calls>\n" + DSML_FORECAST + "</｜DSML｜function_calls>"), None),
    # V4 with `｜DSML｜` a control token: its markers read alike whether a vocabulary makes it one or not.
    ("deepseek_v4", ("｜DSML｜",), ("I'll look.<｜DSML｜tool_calls>\n" + DSML_FORECAST + "</｜DSML｜tool_calls>"), None),
    ("kimi_k2", KIMI_CONTROL, ('I\'ll look.<|tool_calls_section_begin|><|tool_call_begin|>functions.forecast:0<|tool_call_argument_begin|>'
     '{"city": "Zürich", "days": 3}<|tool_call_end|><|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>{"city": "Zürich"}'
     "<|tool_call_end|><|tool_calls_section_end|>"), None),
    ("minicpm5", (), ('I\'ll look.<function name="forecast"><param name="city">Zürich</param><param name="days">3</param></function>'
                      '<function name="get_time"><param name="city">Zürich</param></function>'), None),
    ("lfm2", ("<|tool_call_start|>", "<|tool_call_end|>"), ('I\'ll look.<|tool_call_start|>[forecast(city="Zürich", days=3), '
     'get_time(city="Zürich")]<|tool_call_end|>'), None),
    ("solar_open", SOLAR_CONTROL, ('<|think|>Weather.<|end|><|begin|>assistant<|content|>I\'ll look.<|tool_calls|><|tool_call:begin|>a1b2c3d4e5'
     '<|tool_call:name|>forecast<|tool_call:args|>{"city": "Zürich", "days": 3}<|tool_call:end|><|tool_call:begin|>f6g7h8i9j0'
     '<|tool_call:name|>get_time<|tool_call:args|>{"city": "Zürich"}<|tool_call:end|><|calls|>'), "Weather."),
    ("hy3", HY3_CONTROL, ("I'll look.<tool_calls:opensource>\n<tool_call:opensource>forecast<tool_sep:opensource>\n<arg_key:opensource>city"
     "</arg_key:opensource>\n<arg_value:opensource>Zürich</arg_value:opensource>\n<arg_key:opensource>days</arg_key:opensource>\n"
     "<arg_value:opensource>3</arg_value:opensource>\n</tool_call:opensource>\n<tool_call:opensource>get_time<tool_sep:opensource>\n"
     "<arg_key:opensource>city</arg_key:opensource>\n<arg_value:opensource>Zürich</arg_value:opensource>\n</tool_call:opensource>\n"
     "</tool_calls:opensource>"), None),
    ("glm4_7_flash", (), ("Weather.</think>I'll look.<tool_call>forecast<arg_key>city</arg_key><arg_value>Zürich</arg_value><arg_key>days"
     "</arg_key><arg_value>3</arg_value></tool_call><tool_call>get_time<arg_key>city</arg_key><arg_value>Zürich</arg_value></tool_call>"),
     "Weather."),
    ("apriel1_6", (), ('Weather.\n[BEGIN FINAL RESPONSE]\nI\'ll look.<tool_calls>[{"name": "forecast", "arguments": {"city": "Zürich", "days": 3}}, '
                       '{"name": "get_time", "arguments": {"city": "Zürich"}}]</tool_calls>'), "Weather."),
])
def test_more_families_calls_come_back_whole_and_streamed(tmp_path: Path, template: str, control: tuple[str, ...], reply: str,
                                                          reasoning: str | None) -> None:
    """Nemotron Nano 2 (a JSON list), Seed-OSS, MiniMax-M2, DeepSeek V3.2/V4, Hy3 and GLM-4.7 (markup), Apriel (a JSON list), DeepSeek V3.1, Kimi K2 and Solar Open
    (a call per header):
    each family's calls come back as OpenAI's, with its thinking apart, whole and streamed."""
    backend = ScriptedBackend(template_text(template), control)
    backend.replies.extend([reply] * 2)
    with scripted_client(backend, tmp_path) as (client, _):
        whole = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=CODER_TOOLS)
        chunks = list(client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=CODER_TOOLS, stream=True))
    _assert_text_then_calls(whole, chunks, [("forecast", {"city": "Zürich", "days": 3}), ("get_time", {"city": "Zürich"})], reasoning)


def test_lfm2_forced_calls_follow_the_keywords_grammar(tmp_path: Path) -> None:
    """Named: the server writes `<|tool_call_start|>[NAME(`; a grammar holds the keywords to the schema (a word for a
    number still makes a call whose values parse)."""
    backend = ScriptedBackend(template_text("lfm2"), ("<|tool_call_start|>", "<|tool_call_end|>"))
    backend.replies.extend(['city="Oslo", days=2)]<|tool_call_end|>', 'forecast(city="Oslo", days=several)]<|tool_call_end|>'])
    named = {"type": "function", "function": {"name": "forecast"}}
    with scripted_client(backend, tmp_path) as (client, _):
        reply = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=CODER_TOOLS, tool_choice=named)  # type: ignore[arg-type]
        assert backend.prompts[-1].endswith("<|im_start|>assistant\n<|tool_call_start|>[forecast(")
        assert _calls(reply.choices[0].message) == [("forecast", {"city": "Oslo", "days": 2})]
        required = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=CODER_TOOLS, tool_choice="required",
                                                  max_tokens=200)
    assert backend.prompts[-1].endswith("<|tool_call_start|>[")
    [(name, arguments)] = _calls(required.choices[0].message)
    assert name == "forecast" and arguments["city"] == "Oslo" and isinstance(arguments["days"], int)


def test_minicpm5_forced_calls_open_a_section_without_wrapper(tmp_path: Path) -> None:
    """MiniCPM 5's call has no wrapper: the server's opening `<function name="NAME">` is the section's start and
    a grammar holds the parameter blocks."""
    backend = ScriptedBackend(template_text("minicpm5"))
    backend.replies.extend(['<param name="city">Oslo</param><param name="days">2</param></function>',
                            'forecast"><param name="city">Oslo</param><param name="days">two</param></function>'])
    named = {"type": "function", "function": {"name": "forecast"}}
    with scripted_client(backend, tmp_path) as (client, _):
        reply = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=CODER_TOOLS, tool_choice=named)  # type: ignore[arg-type]
        assert backend.prompts[-1].endswith('<function name="forecast">')
        assert _calls(reply.choices[0].message) == [("forecast", {"city": "Oslo", "days": 2})]
        required = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=CODER_TOOLS, tool_choice="required",
                                                  max_tokens=200)
    [(name, arguments)] = _calls(required.choices[0].message)
    assert name == "forecast" and arguments["city"] == "Oslo" and isinstance(arguments["days"], int)


@pytest.mark.parametrize(("template", "wrapper", "lead"), [("deepseek_v3_2", "function_calls", ""), ("deepseek_v4", "tool_calls", "\n\n")])
def test_dsml_forced_calls_follow_the_marked_parameters_grammar(tmp_path: Path, template: str, wrapper: str, lead: str) -> None:
    """Named: the server writes `<｜DSML｜WRAPPER>\\n<｜DSML｜invoke name="NAME">\\n`; a grammar holds the parameter blocks
    to the schema, each marked by its type (a model that would mark a number a string still makes a call whose values parse)."""
    backend = ScriptedBackend(template_text(template))
    closing = f"</｜DSML｜invoke>\n</｜DSML｜{wrapper}>"
    backend.replies.extend([
        '<｜DSML｜parameter name="city" string="true">Oslo</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="false">2</｜DSML｜parameter>\n'
        + closing,
        'forecast">\n<｜DSML｜parameter name="city" string="true">Oslo</｜DSML｜parameter>\n<｜DSML｜parameter name="days" string="true">two'
        "</｜DSML｜parameter>\n" + closing])
    named = {"type": "function", "function": {"name": "forecast"}}
    with scripted_client(backend, tmp_path) as (client, _):
        reply = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=CODER_TOOLS, tool_choice=named)  # type: ignore[arg-type]
        assert backend.prompts[-1].endswith(f'</think>{lead}<｜DSML｜{wrapper}>\n<｜DSML｜invoke name="forecast">\n')
        assert _calls(reply.choices[0].message) == [("forecast", {"city": "Oslo", "days": 2})]
        required = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=CODER_TOOLS, tool_choice="required",
                                                  max_tokens=200)
    assert backend.prompts[-1].endswith(f'<｜DSML｜{wrapper}>\n<｜DSML｜invoke name="')
    [(name, arguments)] = _calls(required.choices[0].message)
    assert name == "forecast" and arguments["city"] == "Oslo" and isinstance(arguments["days"], int)


@pytest.mark.parametrize(("template", "opening"), ids=["gigachat3", "gigachat3_1"], argvalues=[
    ("gigachat3", "<|message_sep|>\n\nfunction call<|role_sep|>\n"), ("gigachat3_1", "<|function_call|>")])
def test_gigachat_calls_come_back_whole_streamed_forced_and_rendered(tmp_path: Path, template: str, opening: str) -> None:
    """GigaChat 3 (a message of the `function call` role after the reply's) and 3.1 (`<|function_call|>`): the text, then
    one call as a JSON object, whole and streamed; forced, the server writes the opening and a grammar holds the rest; a
    past call and its result render through the template."""
    backend = ScriptedBackend(template_text(template), GIGACHAT_CONTROL, n_ctx=8192)  # its system prompt: 5,000 characters, tokens here
    call = f'{opening}{{"name": "forecast", "arguments": {{"city": "Zürich", "days": 3}}}}<|message_sep|>\n\n'
    backend.replies.extend([f"I'll look.{call}"] * 2 + ['{"city": "Oslo", "days": 2}}', 'forecast", "arguments": {"city": "Oslo", "days": "two"}}',
                                                         "It is 21 °C and clear.<|message_sep|>\n\n"])
    named = {"type": "function", "function": {"name": "forecast"}}
    with scripted_client(backend, tmp_path) as (client, _):
        whole = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=CODER_TOOLS)
        chunks = list(client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=CODER_TOOLS, stream=True))
        reply = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=CODER_TOOLS, tool_choice=named)  # type: ignore[arg-type]
        assert backend.prompts[-1].endswith(f'assistant<|role_sep|>\n{opening}{{"name": "forecast", "arguments": ')
        required = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=CODER_TOOLS, tool_choice="required",
                                                  max_tokens=200)
        assert backend.prompts[-1].endswith(f'assistant<|role_sep|>\n{opening}{{"name": "')
        answer = client.chat.completions.create(model="scripted", messages=HISTORY, tools=TOOLS)  # type: ignore[arg-type]
    assert (f'assistant<|role_sep|>\n{opening}{{"name": "get_weather", "arguments": {{"city": "Zürich"}}}}<|message_sep|>\n\n'
            "function result<|role_sep|>\n21 °C, clear<|message_sep|>\n\n") in backend.prompts[-1]
    assert answer.choices[0].message.content == "It is 21 °C and clear." and answer.choices[0].finish_reason == "stop"
    _assert_text_then_calls(whole, chunks, [("forecast", {"city": "Zürich", "days": 3})], None)
    assert _calls(reply.choices[0].message) == [("forecast", {"city": "Oslo", "days": 2})]
    [(name, arguments)] = _calls(required.choices[0].message)
    assert name == "forecast" and arguments["city"] == "Oslo" and isinstance(arguments["days"], int)


# Kimi K3's tag tokens, control tokens in its vocabulary, and an argument's block (its key, JSON type and text).
K3_CONTROL = ("<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>")
K3_ARGUMENT = '<|open|>argument key="{}" type="{}"<|sep|>{}<|close|>argument<|sep|>'


def test_kimi_k3_calls_come_back_whole_streamed_forced_and_rendered(tmp_path: Path) -> None:
    """Kimi K3 (XTML tags of control tokens): the thinking its prompt opened, the response and the typed calls come back
    whole and streamed; forced, the server closes the thinking and writes the call's opening, a grammar types the
    argument blocks (a model that would call a boolean a string still makes a call whose values parse); a past call and
    its result render through the template."""
    backend = ScriptedBackend(template_text("kimi_k3"), K3_CONTROL)
    closing = "<|close|>call<|sep|><|close|>tools<|sep|>"
    calls = ('<|open|>tools<|sep|><|open|>call tool="forecast" index="1"<|sep|>' + K3_ARGUMENT.format("city", "string", "Zürich")
             + K3_ARGUMENT.format("days", "number", "3") + '<|close|>call<|sep|><|open|>call tool="get_time" index="2"<|sep|>'
             + K3_ARGUMENT.format("city", "string", "Zürich") + closing + "<|close|>message<|sep|>")
    backend.replies.extend(["Weather.<|close|>think<|sep|><|open|>response<|sep|>I'll look.<|close|>response<|sep|>" + calls] * 2 + [
        K3_ARGUMENT.format("city", "string", "Oslo") + K3_ARGUMENT.format("days", "number", "2") + closing,
        'forecast" index="1"<|sep|>' + K3_ARGUMENT.format("city", "string", "Oslo") + K3_ARGUMENT.format("days", "number", "2")
        + K3_ARGUMENT.format("hourly", "string", "no") + closing,
        "Done.<|close|>think<|sep|><|open|>response<|sep|>It is 21 °C and clear.<|close|>response<|sep|><|close|>message<|sep|>"])
    named = {"type": "function", "function": {"name": "forecast"}}
    with scripted_client(backend, tmp_path) as (client, _):
        whole = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=CODER_TOOLS)
        chunks = list(client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=CODER_TOOLS, stream=True))
        reply = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=CODER_TOOLS, tool_choice=named)  # type: ignore[arg-type]
        # As the template writes a reply that is a call alone: the think section closed, an empty response, the tools.
        assert backend.prompts[-1].endswith('<|open|>think<|sep|><|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|>'
                                            '<|open|>tools<|sep|><|open|>call tool="forecast" index="1"<|sep|>')
        required = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=CODER_TOOLS, tool_choice="required",
                                                  max_tokens=200)
        assert backend.prompts[-1].endswith('<|open|>tools<|sep|><|open|>call tool="')
        answer = client.chat.completions.create(model="scripted", messages=HISTORY, tools=TOOLS)  # type: ignore[arg-type]
    assert ('<|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|>' + K3_ARGUMENT.format("city", "string", "Zürich") + closing
            + '<|close|>message<|sep|><|end_of_msg|><|open|>message role="tool" tool="get_weather" index="1"<|sep|>21 °C, clear') in backend.prompts[-1]
    assert (answer.choices[0].message.content, getattr(answer.choices[0].message, "reasoning_content", None)) == ("It is 21 °C and clear.", "Done.")
    _assert_text_then_calls(whole, chunks, [("forecast", {"city": "Zürich", "days": 3}), ("get_time", {"city": "Zürich"})], "Weather.")
    assert _calls(reply.choices[0].message) == [("forecast", {"city": "Oslo", "days": 2})]
    assert _calls(required.choices[0].message) == [("forecast", {"city": "Oslo", "days": 2, "hourly": False})]


# MiniMax-M3's namespace token (before each tag of its calls) and thinking markers, control tokens in its vocabulary.
MM3 = "]<]minimax[>["
MM3_CONTROL = (MM3, "<mm:think>", "</mm:think>")
ROUTE_TOOLS = [{"type": "function", "function": {"name": "route", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "stops": {"type": "array", "items": {"type": "object", "properties": {
        "city": {"type": "string"}, "nights": {"type": "integer"}}, "required": ["city", "nights"]}}}, "required": ["city", "stops"]}}}]


def _mm3(key: str, text: str) -> str:
    """An element as MiniMax-M3 writes an argument, an object's member or an array's item."""
    return f"{MM3}<{key}>{text}{MM3}</{key}>"


def test_minimax_m3_calls_come_back_whole_streamed_forced_and_rendered(tmp_path: Path) -> None:
    """MiniMax-M3 (M2's markup, every tag after its namespace token): the thinking, the text and the typed calls come back
    whole and streamed; forced, the server writes the call's opening and a grammar holds the nested elements to the schema
    (a model that would write a number as a word still makes a call whose values parse); a past call and its result render
    through the template."""
    backend = ScriptedBackend(template_text("minimax_m3"), MM3_CONTROL)
    closing = f"{MM3}</invoke>\n{MM3}</tool_call>"
    calls = (f'{MM3}<tool_call>\n{MM3}<invoke name="forecast">' + _mm3("city", "Zürich") + _mm3("days", "3") + f"{MM3}</invoke>\n"
             f'{MM3}<invoke name="get_time">' + _mm3("city", "Zürich") + closing)
    backend.replies.extend(["<mm:think>Weather.</mm:think>I'll look." + calls] * 2 + [
        _mm3("city", "Oslo") + _mm3("stops", _mm3("item", _mm3("city", "Bergen") + _mm3("nights", "2"))) + closing,
        'route">' + _mm3("city", "Oslo") + _mm3("stops", _mm3("item", _mm3("city", "Bergen") + _mm3("nights", "two"))) + closing,
        "</mm:think>It is 21 °C and clear."])
    named = {"type": "function", "function": {"name": "route"}}
    with scripted_client(backend, tmp_path) as (client, _):
        whole = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=CODER_TOOLS)
        chunks = list(client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=CODER_TOOLS, stream=True))
        reply = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=ROUTE_TOOLS, tool_choice=named)  # type: ignore[arg-type]
        # A reply without thinking begins after `</mm:think>`, as the template writes one.
        assert backend.prompts[-1].endswith(f']~b]ai\n</mm:think>{MM3}<tool_call>\n{MM3}<invoke name="route">')
        required = client.chat.completions.create(model="scripted", messages=TOOLS_QUESTION, tools=ROUTE_TOOLS, tool_choice="required",  # type: ignore[arg-type]
                                                  max_tokens=200)
        assert backend.prompts[-1].endswith(f'{MM3}<tool_call>\n{MM3}<invoke name="')
        answer = client.chat.completions.create(model="scripted", messages=HISTORY, tools=TOOLS)  # type: ignore[arg-type]
    assert (f'</mm:think>{MM3}<tool_call>\n{MM3}<invoke name="get_weather">' + _mm3("city", "Zürich") + closing
            + "[e~[\n]~b]tool\n<response>21 °C, clear</response>") in backend.prompts[-1]
    assert answer.choices[0].message.content == "It is 21 °C and clear." and answer.choices[0].finish_reason == "stop"
    _assert_text_then_calls(whole, chunks, [("forecast", {"city": "Zürich", "days": 3}), ("get_time", {"city": "Zürich"})], "Weather.")
    assert _calls(reply.choices[0].message) == [("route", {"city": "Oslo", "stops": [{"city": "Bergen", "nights": 2}]})]
    [(name, arguments)] = _calls(required.choices[0].message)
    assert name == "route" and arguments["stops"][0]["city"] == "Bergen" and isinstance(arguments["stops"][0]["nights"], int)
