"""Model families as data: detected from their templates, conversations written as each template
wants them (probed), calls forced by an opening and a grammar (pure logic, real templates)."""

from __future__ import annotations

import functools
import json
import re

import pytest
from chat_format_cases import (
    ASK,
    FAMILY_OF_TEMPLATE,
    TIME,
    TIME_TOOL,
    WEATHER,
    WEATHER_TOOL,
    fmt,
    prompt_of,
    template,
)

from localchat.chat_formats import (
    GENERIC,
    ChatFormat,
    TemplateSupport,
    call_grammar,
    call_lead,
    call_opening,
    conversation_format,
    render_chat,
    template_support,
)
from localchat.reply_parser import ParsedCall, ParsedReply, parse_reply
from localchat.templates import Message, TemplateRefusedError, ToolCall


@pytest.mark.parametrize("name", list(FAMILY_OF_TEMPLATE))
def test_the_family_is_detected_from_the_template(name: str) -> None:
    assert fmt(name).name == FAMILY_OF_TEMPLATE[name]


def test_reasoning_markers_come_from_the_template() -> None:
    thinking = {name: [s.start for s in fmt(name).sections if s.kind == "reasoning"] for name in FAMILY_OF_TEMPLATE}
    assert thinking["qwen3"] == ["<think>"] and thinking["qwen2_5"] == []
    assert thinking["command_r7b_tool_use"] == ["<|START_THINKING|>"]
    assert thinking["deepseek_r1_distill"] == ["<think>"] and thinking["gemma3"] == []


def _assistant_text(name: str, messages: list[Message], fmt_: ChatFormat, support: TemplateSupport) -> tuple[str, str]:
    """What the template writes for the last (assistant) message, and the text before it: where
    it parts from the generation prompt, not inside a `<...>` marker."""
    prompt = render_chat(template(name), fmt_, support, messages[:-1], tools=[WEATHER_TOOL, TIME_TOOL])
    whole = render_chat(template(name), fmt_, support, messages, tools=[WEATHER_TOOL, TIME_TOOL], add_generation_prompt=False)
    cut = next((i for i, (a, b) in enumerate(zip(prompt, whole, strict=False)) if a != b), min(len(prompt), len(whole)))
    if whole.rfind("<", 0, cut) > whole.rfind(">", 0, cut):
        cut = whole.rfind("<", 0, cut)
    return whole[:cut], whole[cut:]


@pytest.mark.parametrize("name", list(FAMILY_OF_TEMPLATE))
def test_calls_written_into_a_history_read_back_as_those_calls(name: str) -> None:
    """What localchat writes for an assistant's calls (through the template, or into its text
    where the template shows no calls) parses back to the same calls."""
    support = template_support(template(name), fmt(name))
    conversation = conversation_format(fmt(name), support)
    calls = (WEATHER,) if conversation.one_call_per_message else (WEATHER, TIME)
    try:
        prompt, written = _assistant_text(name, [ASK, Message("assistant", "", tool_calls=calls)], conversation, support)
    except TemplateRefusedError:
        pytest.skip(f"{name} refuses a conversation ending with an assistant's calls")
    parsed = parse_reply(conversation, written, prompt=prompt)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [(c.name, dict(c.arguments)) for c in calls], written


@pytest.mark.parametrize("name", list(FAMILY_OF_TEMPLATE))
def test_a_tool_conversation_renders_through_every_template(name: str) -> None:
    """OpenAI's shape (two calls in one message, long call ids, results by id) renders with
    everything in it, whatever the template lacks."""
    support = template_support(template(name), fmt(name))
    conversation = conversation_format(fmt(name), support)
    messages = [Message("system", "Be terse."), ASK, Message("assistant", "Checking.", tool_calls=(WEATHER, TIME)),
                Message("tool", "21 °C", tool_call_id=WEATHER.id), Message("tool", "09:30", tool_call_id=TIME.id)]
    text = render_chat(template(name), conversation, support, messages, tools=[WEATHER_TOOL, TIME_TOOL])
    expected = ["get_weather", "get_time", "21 °C", "09:30", "Zürich", "東京", "city"]
    if name != "mistral_nemo":  # Nemo shows the system prompt only with the last message, a tool result here
        expected.append("Be terse.")
    assert [word for word in expected if word not in text] == []


def test_what_each_template_renders_is_probed() -> None:
    supports = {name: template_support(template(name), fmt(name)) for name in ("qwen3", "gemma3", "gemma2", "smollm3", "phi4_mini", "granite3_3")}
    assert supports["qwen3"] == TemplateSupport()
    assert supports["gemma3"] == TemplateSupport(system=True, tools=False, calls=False, results=False)
    assert supports["gemma2"] == TemplateSupport(system=False, tools=False, calls=False, results=False)
    assert supports["smollm3"].tools  # under its own name, xml_tools
    assert not supports["phi4_mini"].tools and supports["granite3_3"] == TemplateSupport(calls=False)


def test_mistral_call_ids_are_nine_letters_and_digits_and_stable() -> None:
    support = template_support(template("mistral_small3_2"), fmt("mistral_small3_2"))
    messages = [ASK, Message("assistant", "", tool_calls=(WEATHER,)), Message("tool", "21", tool_call_id=WEATHER.id)]
    first = render_chat(template("mistral_small3_2"), fmt("mistral_small3_2"), support, messages)
    ids = re.findall(r"\[CALL_ID\](\w+)\[ARGS\]", first) + re.findall(r"\[TOOL_RESULTS\](\w+)\[TOOL_CONTENT\]", first)
    assert len(ids) == 2 and ids[0] == ids[1] and len(ids[0]) == 9 and ids[0].isalnum()
    assert render_chat(template("mistral_small3_2"), fmt("mistral_small3_2"), support, messages) == first


def test_deepseek_gets_null_content_and_string_arguments() -> None:
    support = template_support(template("deepseek_r1_distill"), fmt("deepseek_r1_distill"))
    messages = [ASK, Message("assistant", "", tool_calls=(WEATHER,)), Message("tool", "21", tool_call_id=WEATHER.id)]
    text = render_chat(template("deepseek_r1_distill"), fmt("deepseek_r1_distill"), support, messages)
    assert '<｜tool▁sep｜>get_weather\n```json\n{"city": "Zürich"}\n```' in text


def test_llama_gets_one_call_per_message_each_with_its_result() -> None:
    support = template_support(template("llama3_1"), fmt("llama3_1"))
    messages = [ASK, Message("assistant", "", tool_calls=(WEATHER, TIME)),
                Message("tool", "09:30", tool_call_id=TIME.id), Message("tool", "21", tool_call_id=WEATHER.id)]
    text = render_chat(template("llama3_1"), fmt("llama3_1"), support, messages)
    order = [text.index(word) for word in ('"get_weather"', "21", '"get_time"', "09:30")]
    assert order == sorted(order)


def test_phi4_mini_reads_the_tools_from_the_system_message() -> None:
    support = template_support(template("phi4_mini"), fmt("phi4_mini"))
    text = render_chat(template("phi4_mini"), fmt("phi4_mini"), support, [ASK], tools=[WEATHER_TOOL])
    assert text.startswith('<|system|><|tool|>[{"name": "get_weather"')


@pytest.mark.parametrize("name", ["qwen3", "qwen3_coder", "glm4_6", "glm4_7_flash", "apriel1_5", "apriel1_6", "llama3_1", "mistral_nemo", "mistral_small3_2", "deepseek_r1_distill", "gpt_oss", "granite3_3",
                                  "ministral3_reasoning", "apertus", "deepseek_v3_2", "deepseek_v4", "solar_open", "hy3", "kimi_k3", "minimax_m3", "gigachat3", "gigachat3_1", "phi4_mini", "command_r7b_tool_use", "command_r_plus_tool_use", "gemma3"])
def test_a_forced_call_opening_reads_as_that_call(name: str) -> None:
    """The server writes a call's opening after the prompt, led in as the template writes a reply that is a call
    alone, or else past the reasoning the prompt opened (DeepSeek's); with the model's continuation the reply reads
    as the call, and nothing else."""
    support = template_support(template(name), fmt(name))
    conversation = conversation_format(fmt(name), support)
    prompt = render_chat(template(name), conversation, support, [ASK], tools=[WEATHER_TOOL])
    syntax = conversation.call
    written = syntax.write("get_weather", {"city": "Zürich"})
    lead = call_lead(template(name), conversation, support, [ASK], prompt, tools=[WEATHER_TOOL])
    named = call_opening(conversation, prompt, "get_weather", lead)
    required = call_opening(conversation, prompt, lead=lead)
    assert named.endswith(syntax.prefix + "get_weather" + syntax.before_arguments) and required.endswith(syntax.prefix)
    for whole in (named + written[len(syntax.prefix + "get_weather" + syntax.before_arguments):], required + written[len(syntax.prefix):]):
        parsed = parse_reply(conversation, whole, prompt=prompt)
        assert parsed.calls == [ParsedCall("get_weather", '{"city": "Zürich"}')] and parsed.content == "" and not parsed.reasoning, whole


@pytest.mark.parametrize(("thinking", "lead"), [
    (True, "<|close|>think<|sep|><|open|>response<|sep|><|close|>response<|sep|>"), (False, "<|close|>response<|sep|>")])
def test_a_kimi_k3_forced_call_follows_the_sections_its_template_writes(thinking: bool, lead: str) -> None:
    """Kimi K3 writes every reply's response section, empty or not, before its tools: a forced call closes the section
    the generation prompt opened (think, or response with thinking off) and writes the rest as the template does."""
    conversation = fmt("kimi_k3")
    support = template_support(template("kimi_k3"), conversation)
    variables = template("kimi_k3").thinking_variables(thinking)
    prompt = render_chat(template("kimi_k3"), conversation, support, [ASK], tools=[WEATHER_TOOL], template_kwargs=variables)
    found = call_lead(template("kimi_k3"), conversation, support, [ASK], prompt, tools=[WEATHER_TOOL], template_kwargs=variables)
    assert found == lead
    assert call_opening(conversation, prompt, "get_weather", found) == lead + '<|open|>tools<|sep|><|open|>call tool="get_weather" index="1"<|sep|>'


SPECIAL_LOOKING = re.compile(r"<\|[^|>]+\|>|\[[A-Z_]+\]|<｜[^｜]+｜>|｜DSML｜|\]<\]minimax\[>\[")


class _ByteVocabulary:
    """A vocabulary for llguidance: one token per byte, the family's special-looking markers as
    control tokens, and an end token."""

    def __init__(self, control: list[str]) -> None:
        self.control = {marker: 257 + number for number, marker in enumerate(control)}
        self.tokens = [bytes([b]) for b in range(256)] + [b"<eos>"] + [marker.encode() for marker in control]
        self.special_token_ids = [256, *self.control.values()]
        self.eos_token_id, self.bos_token_id = 256, None

    def __call__(self, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError("text only")
        tokens, position = [], 0
        while position < len(text):
            marker = next((m for m in self.control if text.startswith(m, position)), None)
            if marker is not None:
                tokens.append(self.control[marker])
                position += len(marker)
            else:
                tokens += list(text[position].encode())
                position += 1
        return tokens

    @functools.cached_property
    def _tokenizer(self) -> object:
        import llguidance

        return llguidance.LLTokenizer(llguidance.TokenizerWrapper(self), n_vocab=len(self.tokens), eos_token=256)

    def accepts(self, grammar: str, text: str) -> bool:
        """Whether llguidance, held to the Lark `grammar`, takes `text` whole."""
        import llguidance

        matcher = llguidance.LLMatcher(self._tokenizer, llguidance.LLMatcher.grammar_from_lark(grammar), log_level=0)
        return matcher.consume_tokens(self(text)) and matcher.is_accepting()


@pytest.mark.parametrize("name", list(FAMILY_OF_TEMPLATE))
def test_a_forced_call_grammar_accepts_the_family_call_and_refuses_others(name: str) -> None:
    """The grammar that constrains a forced call (after its opening) takes the call as the family
    writes it, arguments following the schema, and nothing else."""
    pytest.importorskip("llguidance")
    conversation = conversation_format(fmt(name), template_support(template(name), fmt(name)))
    syntax = conversation.call
    texts = (*conversation.markers, syntax.prefix, syntax.before_arguments, syntax.closing)
    vocabulary = _ByteVocabulary(sorted({m for text in texts for m in SPECIAL_LOOKING.findall(text)}))
    accepts = vocabulary.accepts
    for forced in ("get_weather", None):
        grammar = call_grammar(conversation, [WEATHER_TOOL, TIME_TOOL], forced, vocabulary.control)
        opening = syntax.prefix + ("get_weather" + syntax.before_arguments if forced else "")
        for call, valid in (({"city": "Zürich"}, True), ({}, False), ({"town": "Zürich"}, False)):
            written = syntax.write("get_weather", call)
            assert accepts(grammar, written[len(opening):]) == valid, (forced, written)
        assert not accepts(grammar, "I would rather not.")
    assert not accepts(call_grammar(conversation, [WEATHER_TOOL], "get_weather", vocabulary.control),
                       syntax.write("get_time", {"city": "Zürich"})[len(syntax.prefix):])


GLM_CALLS = {
    "glm4_7_flash": "<tool_call>get_weather<arg_key>city</arg_key><arg_value>Zürich</arg_value></tool_call>",
    "glm4_6": "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Zürich</arg_value>\n</tool_call>",
}


@pytest.mark.parametrize("name", list(GLM_CALLS))
def test_a_glm_call_is_forced_as_its_template_writes_one(name: str) -> None:
    """GLM-4.7's template writes a call with no newlines, GLM-4.6's one tag a line: a forced call is written as
    the model's own template writes one, its grammar taking that form and not the other."""
    pytest.importorskip("llguidance")
    written, other = GLM_CALLS[name], next(call for key, call in GLM_CALLS.items() if key != name)
    support = template_support(template(name), fmt(name))
    conversation = conversation_format(fmt(name), support)
    history = [ASK, Message("assistant", "", tool_calls=(ToolCall("call_1", "get_weather", {"city": "Zürich"}),))]
    assert written in render_chat(template(name), fmt(name), support, history, tools=[WEATHER_TOOL], add_generation_prompt=False)
    assert conversation.call.write("get_weather", {"city": "Zürich"}) == written
    prompt = render_chat(template(name), conversation, support, [ASK], tools=[WEATHER_TOOL])
    opening = call_opening(conversation, prompt, "get_weather")
    assert opening.endswith("<tool_call>get_weather" + ("\n" if name == "glm4_6" else ""))
    accepts = _ByteVocabulary([]).accepts
    grammar = call_grammar(conversation, [WEATHER_TOOL], "get_weather")
    assert accepts(grammar, written.removeprefix(conversation.call.prefix + "get_weather" + conversation.call.before_arguments))
    assert not accepts(grammar, other.removeprefix(conversation.call.prefix + "get_weather" + conversation.call.before_arguments))


def test_generic_is_used_when_a_template_cannot_show_tools() -> None:
    support = template_support(template("deepseek_r1_distill"), fmt("deepseek_r1_distill"))
    conversation = conversation_format(fmt("deepseek_r1_distill"), support)
    assert not support.tools and conversation.call == GENERIC.call
    parsed = parse_reply(conversation, 'Hm.</think>{"name": "get_weather", "arguments": {"city": "Zürich"}}',
                         prompt=prompt_of("deepseek_r1_distill"))
    assert parsed == ParsedReply(reasoning="Hm.", calls=[ParsedCall("get_weather", '{"city": "Zürich"}')])
    assert parse_reply(GENERIC, "x").content == "x"


CODER_TOOL = {"type": "function", "function": {"name": "forecast", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"}, "metric": {"type": "boolean"}, "hours": {"type": "array", "items": {"type": "integer"}},
    "unit": {"type": "string", "enum": ["C", "F"]}}, "required": ["city", "days"]}}}
CODER_ARGS = {"city": "Bern\n<b>", "days": 3, "metric": True, "hours": [6, 18], "unit": "C"}


def test_qwen3_coder_typed_calls_in_a_history_read_back_by_their_schema() -> None:
    """Qwen3-Coder's template writes each argument as text (Jinja's `True`, JSON for lists): read
    by the tool's schema, the call's arguments come back as they were."""
    support = template_support(template("qwen3_coder"), fmt("qwen3_coder"))
    call = Message("assistant", "", tool_calls=(ToolCall("call_1", "forecast", CODER_ARGS),))
    prompt = render_chat(template("qwen3_coder"), fmt("qwen3_coder"), support, [ASK], tools=[CODER_TOOL])
    whole = render_chat(template("qwen3_coder"), fmt("qwen3_coder"), support, [ASK, call], tools=[CODER_TOOL], add_generation_prompt=False)
    written = whole[len(prompt) - len("<|im_start|>assistant\n"):].removeprefix("<|im_start|>assistant")
    assert "<parameter=metric>\nTrue\n</parameter>" in written
    parsed = parse_reply(fmt("qwen3_coder"), written, tools={"forecast": CODER_TOOL["function"]["parameters"]})
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [("forecast", CODER_ARGS)]


def test_qwen3_coder_forced_call_grammar_types_each_parameter() -> None:
    """The forced call's grammar: the schema's parameters in its order, required ones present,
    strings as free text up to their closing tag, enums and other types by their schema."""
    pytest.importorskip("llguidance")
    vocabulary = _ByteVocabulary([])
    syntax = fmt("qwen3_coder").call
    grammar = call_grammar(fmt("qwen3_coder"), [CODER_TOOL], "forecast")

    def accepts(arguments: dict[str, object]) -> bool:
        return vocabulary.accepts(grammar, syntax.write("forecast", arguments)[len(syntax.prefix + "forecast" + syntax.before_arguments):])

    assert accepts(CODER_ARGS) and accepts({"city": "a</b>", "days": 0})
    for wrong in ({"city": "Bern"}, {"city": "Bern", "days": "three"}, {"city": "Bern", "days": 3, "unit": "K"},
                  {"days": 3, "city": "Bern"}, {"city": "x\n</parameter>", "days": 1}):
        assert not accepts(wrong), wrong


@pytest.mark.parametrize("name", ["deepseek_v3_2", "deepseek_v4"])
def test_dsml_typed_calls_in_a_history_read_back_by_their_marks(name: str) -> None:
    """DeepSeek's templates mark each value a string (written as is) or not (JSON): read by those marks, with no
    schema to type them, the call's arguments come back as they were."""
    support = template_support(template(name), fmt(name))
    call = Message("assistant", "", tool_calls=(ToolCall("call_1", "forecast", CODER_ARGS),))
    prompt, written = _assistant_text(name, [ASK, call], fmt(name), support)
    assert '<｜DSML｜parameter name="days" string="false">3</｜DSML｜parameter>' in written
    parsed = parse_reply(fmt(name), written, prompt=prompt)
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [("forecast", CODER_ARGS)]


@pytest.mark.parametrize("name", ["deepseek_v3_2", "deepseek_v4"])
def test_dsml_forced_call_grammar_marks_each_parameter_by_its_type(name: str) -> None:
    """The forced call's grammar: string="true" and free text for a string parameter, string="false" and the
    schema's JSON for the others."""
    pytest.importorskip("llguidance")
    vocabulary = _ByteVocabulary([])
    syntax = fmt(name).call
    grammar = call_grammar(fmt(name), [CODER_TOOL], "forecast")

    def accepts(text: str) -> bool:
        return vocabulary.accepts(grammar, text)

    def blocks(days_mark: str) -> str:
        return ('<｜DSML｜parameter name="city" string="true">Bern</b></｜DSML｜parameter>\n'
                f'<｜DSML｜parameter name="days" string="{days_mark}">3</｜DSML｜parameter>\n' + syntax.closing)

    assert accepts(blocks("false")) and not accepts(blocks("true"))
    opening = syntax.prefix + "forecast" + syntax.before_arguments
    assert accepts(syntax.write("forecast", CODER_ARGS)[len(opening):])
    for wrong in ({"city": "Bern", "days": "3"}, {"city": 7, "days": 3}, {"city": "Bern", "days": 3, "unit": "K"}):
        assert not accepts(syntax.write("forecast", wrong)[len(opening):]), wrong


def _kimi_k3_call() -> tuple[str, str]:
    """The prompt and what Kimi K3's template writes for an assistant's call of `forecast` with CODER_ARGS."""
    support = template_support(template("kimi_k3"), fmt("kimi_k3"))
    call = Message("assistant", "", tool_calls=(ToolCall("call_1", "forecast", CODER_ARGS),))
    return _assistant_text("kimi_k3", [ASK, call], fmt("kimi_k3"), support)


def test_kimi_k3_typed_calls_in_a_history_read_back_by_their_schema() -> None:
    """Kimi K3's template writes each argument as text with its JSON type beside it (an integer a number): read by the
    tool's schema, as llama.cpp reads them, the call's arguments come back as they were."""
    prompt, written = _kimi_k3_call()
    assert '<|open|>argument key="days" type="number"<|sep|>3<|close|>argument<|sep|>' in written
    parsed = parse_reply(fmt("kimi_k3"), written, prompt=prompt, tools={"forecast": CODER_TOOL["function"]["parameters"]})
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [("forecast", CODER_ARGS)]


def test_kimi_k3_forced_call_grammar_takes_what_its_template_writes() -> None:
    """With its tags' control tokens (which no text spells), the forced call's grammar takes the arguments and closing the
    template writes after the call's opening, each block typed as the template types it, and refuses another type."""
    pytest.importorskip("llguidance")
    vocabulary = _ByteVocabulary(["<|open|>", "<|close|>", "<|sep|>"])
    syntax = fmt("kimi_k3").call
    _, written = _kimi_k3_call()
    opening = syntax.prefix + "forecast" + syntax.before_arguments
    arguments = written[written.index(opening) + len(opening) : written.index(syntax.closing) + len(syntax.closing)]
    grammar = call_grammar(fmt("kimi_k3"), [CODER_TOOL], "forecast", vocabulary.control)
    assert vocabulary.accepts(grammar, arguments)
    assert not vocabulary.accepts(grammar, arguments.replace('"days" type="number"', '"days" type="string"'))


MINIMAX_M3_NAMESPACE = "]<]minimax[>["
ROUTE_TOOL = {"type": "function", "function": {"name": "route", "parameters": {"type": "object", "properties": {
    "city": {"type": "string"}, "days": {"type": "integer"},
    "stops": {"type": "array", "items": {"type": "object", "properties": {"city": {"type": "string"}, "nights": {"type": "integer"}},
                                         "required": ["city"]}},
    "options": {"type": "object", "properties": {"avoid": {"type": "array", "items": {"type": "string"}}, "fast": {"type": "boolean"}}},
    "grid": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}}, "required": ["city", "stops"]}}}
ROUTE_ARGS = {"city": "Bern <b>", "days": 3, "stops": [{"city": "Zürich", "nights": 2}, {"city": "東京"}],
              "options": {"avoid": ["tolls", "ferries"], "fast": True}, "grid": [[1.5, 2], []]}


def _minimax_m3_call() -> tuple[str, str]:
    """The prompt and what MiniMax-M3's template writes for an assistant's call of `route` with ROUTE_ARGS."""
    support = template_support(template("minimax_m3"), fmt("minimax_m3"))
    call = Message("assistant", "", tool_calls=(ToolCall("call_1", "route", ROUTE_ARGS),))
    return _assistant_text("minimax_m3", [ASK, call], fmt("minimax_m3"), support)


def test_minimax_m3_nested_calls_in_a_history_read_back_by_their_schema() -> None:
    """MiniMax-M3's template writes objects' members and arrays' items as nested elements, scalars as text: read by the
    tool's schema, as llama.cpp reads them, the call's arguments come back as they were, as localchat writes them too."""
    prompt, written = _minimax_m3_call()
    namespace = MINIMAX_M3_NAMESPACE
    assert f"{namespace}<grid>{namespace}<item>{namespace}<item>1.5{namespace}</item>" in written
    assert fmt("minimax_m3").call.write("route", ROUTE_ARGS) in written
    parsed = parse_reply(fmt("minimax_m3"), written, prompt=prompt, tools={"route": ROUTE_TOOL["function"]["parameters"]})
    assert [(c.name, json.loads(c.arguments)) for c in parsed.calls] == [("route", ROUTE_ARGS)]


def test_minimax_m3_forced_call_grammar_takes_what_its_template_writes() -> None:
    """With its namespace a control token, the forced call's grammar takes the nested elements and closing the template
    writes after the call's opening, and refuses an array written as JSON, an item of another type or a missing member."""
    pytest.importorskip("llguidance")
    vocabulary = _ByteVocabulary([MINIMAX_M3_NAMESPACE])
    syntax = fmt("minimax_m3").call
    _, written = _minimax_m3_call()
    opening = syntax.prefix + "route" + syntax.before_arguments
    arguments = written[written.index(opening) + len(opening) : written.index(syntax.closing) + len(syntax.closing)]
    grammar = call_grammar(fmt("minimax_m3"), [ROUTE_TOOL], "route", vocabulary.control)
    assert vocabulary.accepts(grammar, arguments)
    for wrong in ({**ROUTE_ARGS, "grid": "[[1.5, 2], []]"}, {**ROUTE_ARGS, "stops": [{"city": "Bern", "nights": "two"}]},
                  {**ROUTE_ARGS, "stops": [{"nights": 2}]}, {"city": "Bern"}):
        assert not vocabulary.accepts(grammar, syntax.write("route", wrong)[len(opening):]), wrong
