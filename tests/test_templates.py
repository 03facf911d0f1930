"""Chat templates: rendering, the fallback, and the sandbox."""

from __future__ import annotations

import pytest

from localchat.templates import ChatTemplate, Message, TemplateError

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
        "{{ self.__init__.__globals__['os'].system('echo pwned') }}",
        "{{ cycler.__init__.__globals__.os.popen('id').read() }}",
        # The immutable sandbox also forbids mutating the messages.
        "{{ messages.append({'role': 'user', 'content': 'x'}) }}",
    ],
)
def test_a_malicious_template_cannot_run_code(payload: str) -> None:
    template = ChatTemplate(payload, origin="model")
    with pytest.raises(TemplateError):
        template.render([Message("user", "Hi")])


def test_raise_exception_in_a_template_becomes_a_clear_error() -> None:
    template = ChatTemplate.for_model(None, "gemma3", bos_token="", eos_token="")
    with pytest.raises(TemplateError, match="system message only at the start"):
        template.render([Message("user", "Hi"), Message("system", "late")])


def test_a_template_that_does_not_parse_is_reported() -> None:
    with pytest.raises(TemplateError, match="does not parse"):
        ChatTemplate("{% for %}", origin="model")
