"""Chat templates: rendering, the fallback, and the sandbox."""

from __future__ import annotations

import json

import pytest
from chat_format_cases import template

from localchat.templates import (
    THINKING_SWITCHES,
    ChatTemplate,
    Message,
    TemplateError,
    TemplateRefusedError,
    ToolCall,
)

CONVERSATION = [Message("system", "Be brief."), Message("user", "Hi"), Message("assistant", "Hello!"), Message("user", "Bye")]


def test_gemma_fallback_folds_the_system_prompt_into_the_first_turn() -> None:
    template = ChatTemplate.for_model(None, "gemma3", bos_token="<bos>", eos_token="<eos>")
    assert template.render(CONVERSATION) == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    assert "gemma.jinja" in template.origin


def test_other_architectures_fall_back_to_chatml() -> None:
    template = ChatTemplate.for_model(None, "llama", bos_token="<s>", eos_token="</s>")
    assert template.render([Message("user", "Hi")]) == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_a_model_template_is_used_when_present() -> None:
    source = "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}"
    template = ChatTemplate.for_model(source, "llama", bos_token="", eos_token="")
    assert template.render([Message("user", "Hi")]) == "[user]Hi[assistant]"


@pytest.mark.parametrize(
    "payload",
    [
        # CVE-2024-34359: reach os through Python internals from a template.
        "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "{{ cycler.__init__.__globals__.os.getpid() }}",  # renders a pid without the sandbox
        "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
        # The immutable sandbox also forbids mutating the messages.
        "{{ messages.append({'role': 'user', 'content': 'x'}) }}",
    ],
)
def test_a_malicious_template_cannot_run_code(payload: str) -> None:
    template = ChatTemplate(payload, origin="model")
    with pytest.raises(TemplateError, match="tried something unsafe"):  # the sandbox refused, not any other error
        template.render([Message("user", "Hi")])


def test_raise_exception_in_a_template_becomes_a_clear_error() -> None:
    template = ChatTemplate.for_model(None, "gemma3", bos_token="", eos_token="")
    with pytest.raises(TemplateError, match="system message only at the start"):
        template.render([Message("user", "Hi"), Message("system", "late")])


def test_a_template_that_does_not_parse_is_reported() -> None:
    with pytest.raises(TemplateError, match="does not parse"):
        ChatTemplate("{% for %}", origin="model")


def test_template_refusals_quote_the_templates_rule() -> None:
    template = ChatTemplate("{{ raise_exception('Only user and assistant roles are supported!') }}", origin="model")
    with pytest.raises(TemplateRefusedError) as refused:
        template.render([Message("user", "Hi")])
    assert refused.value.rule == "Only user and assistant roles are supported!"
    assert str(refused.value) == "the model's chat template refused this conversation: Only user and assistant roles are supported!"


def test_variables_a_conversation_leaves_out_are_undefined_not_errors() -> None:
    # Qwen 2.5's first line, and the tool-call checks most templates make on every message.
    source = (
        "{%- if tools %}[tools]{% endif %}"
        "{%- for m in messages %}{{ m.content }}{% if m.tool_calls %}[calls]{% endif %}"
        "{{ m.tool_call_id }}{% if m.tool_calls is not defined %}.{% endif %}{% endfor %}"
        "{{- enable_thinking }}"
    )
    assert ChatTemplate(source).render([Message("user", "Hi"), Message("assistant", "Yo")]) == "Hi.Yo."


def test_loop_controls_work() -> None:
    source = "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}{{ m.content }}{% break %}{% endfor %}"
    assert ChatTemplate(source).render(CONVERSATION) == "Hi"


def test_tojson_keeps_text_and_takes_json_dumps_options() -> None:
    source = "{{ tools[0] | tojson }}|{{ tools[0] | tojson(indent=2) }}|{{ tools[0] | tojson(separators=(',', ':')) }}|{{ '<b>' | tojson }}"
    text = ChatTemplate(source).render([], tools=[{"city": "Zürich", "n": 1}])
    assert text == '{"city": "Zürich", "n": 1}|{\n  "city": "Zürich",\n  "n": 1\n}|{"city":"Zürich","n":1}|"<b>"'


def test_tools_and_extra_keywords_reach_the_template() -> None:
    source = "{{ tools | map(attribute='function.name') | join(',') }}/{{ enable_thinking }}/{{ bos_token }}"
    tools = [{"type": "function", "function": {"name": "get_weather"}}, {"type": "function", "function": {"name": "get_time"}}]
    template = ChatTemplate(source, bos_token="<s>")
    assert template.render([], tools=tools, enable_thinking=False) == "get_weather,get_time/False/<s>"
    assert template.render([], tools=[], bos_token="<bos>") == "//<bos>"


@pytest.mark.parametrize(("name", "enable_thinking", "own"), [
    ("kimi_k3", False, {"thinking": False}),  # on by default
    ("minimax_m3", False, {"thinking_mode": "disabled"}),
    ("granite3_3", True, {"thinking": True}),  # off by default
])
def test_enable_thinking_sets_the_switch_a_template_reads(name: str, enable_thinking: bool, own: dict[str, object]) -> None:
    """`serve --no-think`, reasoning_effort "none" and the chat app's switch set enable_thinking: a template that
    reads another switch gets that one, in its own values; one set by the caller stays as given."""
    chat, model_template = [Message("user", "Hi")], template(name)
    assert model_template.render(chat, enable_thinking=enable_thinking) == model_template.render(chat, **own) != model_template.render(chat)
    [switch] = own
    opposite = {switch: THINKING_SWITCHES[switch][1 if enable_thinking else 0]}
    assert model_template.render(chat, enable_thinking=enable_thinking, **opposite) == model_template.render(chat, **opposite)


def test_a_template_without_a_thinking_switch_reads_none() -> None:
    assert template("qwen3").thinking_switches == {"enable_thinking"}
    assert template("llama3_1").thinking_switches == set()
    assert ChatTemplate("{{ message.thinking }}{% set thinking = 1 %}{{ thinking }}").thinking_switches == set()


def test_the_generation_block_writes_its_body() -> None:
    source = "{% for m in messages %}{% generation %}[{{ m.content }}]{% endgeneration %}{% endfor %}"
    assert ChatTemplate(source).render([Message("assistant", "Yo")]) == "[Yo]"


def test_messages_reach_the_template_as_openai_shaped_dicts() -> None:
    call = ToolCall("call0abcd", "get_weather", {"city": "Bern"})
    source = "{{ messages | tojson }}"
    text = ChatTemplate(source).render(
        [Message("assistant", "", tool_calls=(call,)), Message("tool", "18", tool_call_id="call0abcd"), {"role": "user", "content": None}]
    )
    assert json.loads(text) == [
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call0abcd", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Bern"}}}
        ]},
        {"role": "tool", "content": "18", "tool_call_id": "call0abcd"},
        {"role": "user", "content": None},
    ]


def test_reasoning_goes_under_both_names_templates_read() -> None:
    source = "{% for m in messages %}{{ m.reasoning_content }}|{{ m.thinking }}{% endfor %}"
    assert ChatTemplate(source).render([Message("assistant", "42", reasoning="think")]) == "think|think"
    assert ChatTemplate(source).render([{"role": "assistant", "content": "42", "thinking": "hm"}]) == "hm|hm"


def test_template_variables_are_plain_data() -> None:
    # A rich object's methods are out of the template's reach: it sees a placeholder.
    assert ChatTemplate("{{ tools[0] }}").render([], tools=[object()]) == "<object>"  # type: ignore[list-item]


@pytest.mark.parametrize(
    "payload",
    [
        "{% set ns = namespace() %}{% set ns._private = 1 %}",
        "{{ namespace(__class__=1) }}",
        "{{ dict.__class__.__mro__ }}",
    ],
)
def test_template_helpers_keep_the_sandbox_closed(payload: str) -> None:
    with pytest.raises(TemplateError, match="unsafe"):
        ChatTemplate(payload).render([])
