"""The `localchat` command as a user runs it: real process, real model."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import requests
from gguf import GGUFReader

from localchat.models import DEFAULT_MODEL_NAME, inspect_gguf
from localchat.planner import OneReply


def localchat(*args: str, home: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LOCALCHAT_HOME": str(home)}
    return subprocess.run(
        [sys.executable, "-m", "localchat", *args], capture_output=True, text=True, env=env, input=stdin, timeout=300
    )


def test_run_streams_an_answer_and_reports_stats(localchat_home: Path, default_model: Path) -> None:
    result = localchat("run", "--stats", "-n", "12", "--temperature", "0", "Name three colours.", home=localchat_home)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    stats = json.loads(result.stderr.strip().splitlines()[-1])
    required = {"model_path", "backend", "prompt_tokens", "completion_tokens", "completion_ids", "ttft_s", "prefill_tok_s", "decode_tok_s", "peak_rss_mb", "messages_left_out"}
    assert required <= stats.keys()
    assert stats["backend"] == "llama.cpp" and stats["model_path"] == str(default_model)
    assert stats["completion_tokens"] == len(stats["completion_ids"]) <= 12
    assert stats["decode_tok_s"] > 0 and stats["peak_rss_mb"] > 100
    # The sampler the reply used: the flag over the model's family defaults (SmolLM2: top-p 0.9).
    assert (stats["sampler"]["temperature"], stats["sampler"]["top_p"], stats["sampler"]["repeat_penalty"]) == (0, 0.9, 1.0)
    assert stats["sampler_defaults"] == "family: SmolLM2"
    # One reply's context: its prompt's bytes (19), what SmolLM2's template writes around it (148, its own system
    # prompt included), the slack (64) and its 12 tokens, in steps of 256.
    assert stats["n_ctx"] == 256


def test_run_list_info_and_rm_take_a_preset_by_its_name(tmp_path: Path, default_model: Path) -> None:
    """A preset (as /api/create makes one) runs its model with its system prompt, messages, sampler, stop
    strings and context; `list` and `info` say what it is a preset of; `rm` removes it and not its model."""
    from localchat.presets import ModelPreset, PresetMessage, write_preset

    opening = (PresetMessage("user", "Who are you?"), PresetMessage("assistant", "Captain Hook, matey."))
    write_preset(ModelPreset("pirate", DEFAULT_MODEL_NAME, system="You are a pirate.", messages=opening,
                             sampling=(("temperature", 0.0),), stop=("\n",), context=1024), tmp_path / "cache" / "models")
    question = "What is the capital of Japan?"
    preset = localchat("run", "-m", "pirate", "--stats", "-n", "24", question, home=tmp_path)
    assert preset.returncode == 0, preset.stderr
    by_hand = localchat("run", "--stats", "-n", "24", "--temperature", "0", "--stop", "\n", "--system", "You are a pirate.",
                        question, home=tmp_path)
    stats, hand = (json.loads(run.stderr.strip().splitlines()[-1]) for run in (preset, by_hand))
    assert stats["n_ctx"] == 1024 and stats["sampler"]["temperature"] == 0
    assert stats["sampler_defaults"] == "preset pirate over family: SmolLM2"
    assert "\n" not in preset.stdout.strip() and stats["model_path"] == str(default_model)
    # Its two opening messages are in the prompt: more tokens than the same run by hand without them.
    assert stats["prompt_tokens"] > hand["prompt_tokens"] + 10

    listed = localchat("list", home=tmp_path)
    assert re.search(r"^pirate .*\(a preset of smollm2-135m-instruct\)$", listed.stdout, re.MULTILINE), listed.stdout
    info = localchat("info", "-m", "pirate", home=tmp_path)
    assert "model      pirate: a preset of smollm2-135m-instruct" in info.stdout and "system     You are a pirate." in info.stdout
    assert "greedy (defaults: preset pirate over family: SmolLM2" in info.stdout
    removed = localchat("rm", "pirate", home=tmp_path)
    assert removed.returncode == 0 and default_model.exists()
    gone = localchat("run", "-m", "pirate", "hi", home=tmp_path)
    assert gone.returncode == 1 and "unknown model 'pirate'" in gone.stderr


def test_run_replies_within_a_presets_reply_limit_unless_n_is_given(tmp_path: Path) -> None:
    """A preset's num_predict is `run`'s reply limit where -n gives none (its context holds it); -n goes over it."""
    from localchat.presets import ModelPreset, write_preset

    greedy = (("temperature", 0.0),)
    models = tmp_path / "cache" / "models"
    write_preset(ModelPreset("terse", DEFAULT_MODEL_NAME, sampling=greedy, max_tokens=5), models)
    write_preset(ModelPreset("roomy", DEFAULT_MODEL_NAME, sampling=greedy, stop=(".",), max_tokens=3000), models)
    story = "Tell me a long story about a dragon."
    terse, given, roomy = (localchat("run", "-m", model, "--stats", *flags, story, home=tmp_path)
                           for model, flags in (("terse", ()), ("terse", ("-n", "8")), ("roomy", ())))
    terse_stats, given_stats, roomy_stats = (json.loads(run.stderr.strip().splitlines()[-1]) for run in (terse, given, roomy))
    assert (terse_stats["completion_tokens"], terse_stats["finish_reason"]) == (5, "length")
    assert (given_stats["completion_tokens"], given_stats["finish_reason"]) == (8, "length")
    assert roomy_stats["n_ctx"] > 3000 and roomy_stats["finish_reason"] == "stop"


@pytest.mark.parametrize(("model", "system"), [("default_model", None), ("default_model", "1 2 3 4 5 6 7 8 9 " * 20),
                                               ("gemma_model", None)], ids=["own template", "system prompt", "fallback"])
def test_run_fits_a_prompt_of_the_longest_tokens_its_context_allows(localchat_home: Path, request: pytest.FixtureRequest,
                                                                    model: str, system: str | None) -> None:
    """The context `run` sizes from a prompt's bytes (planner.OneReply) holds a prompt of a token a byte, digits
    here, longer than the whole context would be without its text, around a system prompt or the template's own
    (SmolLM2's), in the model's template or localchat's fallback (Gemma 3 270M carries none), with no room to
    spare but its slack."""
    path: Path = request.getfixturevalue(model)
    prompt = "0123456789 " * 175
    result = localchat("run", "-m", str(path), "--stats", "-n", "4", "--temperature", "0",
                       *(["--system", system] if system else []), prompt, home=localchat_home)
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stderr.strip().splitlines()[-1])
    facts = inspect_gguf(path)[1]
    assert stats["prompt_tokens"] > OneReply(0, 4).tokens_bound(facts)
    assert stats["messages_left_out"] == 0 and stats["completion_tokens"] >= 1
    assert stats["prompt_tokens"] + stats["completion_tokens"] <= stats["n_ctx"] < 8192
    # Sized in steps of 256 tokens, to the bound: no step more.
    assert stats["n_ctx"] - 256 < OneReply(len(prompt) + len((system or "").encode()), 4).tokens_bound(facts)


def test_run_with_lookup_drafts_takes_tokens_from_the_prompt(localchat_home: Path, default_model: Path) -> None:
    text = "the quick brown fox jumps over the lazy dog, " * 2
    result = localchat("run", "--stats", "-n", "24", "--temperature", "0", "--repeat-penalty", "1", "--dry-multiplier", "0",
                       "--lookup-draft", "8", f"Repeat exactly: {text}", home=localchat_home)
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stderr.strip().splitlines()[-1])
    assert 0 < stats["accepted_tokens"] <= stats["drafted_tokens"] and stats["accepted_tokens"] < stats["completion_tokens"] <= 24


@pytest.mark.parametrize("model", ["engine", "gemma_gguf_engine"])
def test_no_token_holds_less_than_a_byte_of_text(request: pytest.FixtureRequest, model: str) -> None:
    """What `run` sizes its context by (planner.OneReply), on both real tokenizers (BPE and SentencePiece)."""
    backend = request.getfixturevalue(model).backend
    texts = ["東京は日本の首都です。", "🙂🙃👍🏽🇯🇵", "0123456789" * 5, " \n\t  \n" * 8, "a" * 100, "Ünïcödé façade naïve",
             bytes(range(1, 128)).decode(), "<|im_start|> <end_of_turn> </s>"]
    for text in texts:
        assert len(backend.tokenize(text, add_bos=False, special=False)) <= len(text.encode()), text


@pytest.mark.slow  # runs the real model without the default_model fixture
def test_raw_greedy_runs_are_repeatable_and_read_stdin(localchat_home: Path) -> None:
    outputs = [
        # No drafts: whether a step drafts is timed (DraftPace), and a drafted step rounds apart at a near tie.
        localchat("run", "--raw", "-n", "8", "--temperature", "0", "--lookup-draft", "0", "-",
                  home=localchat_home, stdin="The capital of France is").stdout
        for _ in range(2)
    ]
    assert outputs[0] == outputs[1] and "Paris" in outputs[0]


def test_bytes_that_are_not_utf8_are_read_as_the_replacement_character(localchat_home: Path, default_model: Path) -> None:
    """A prompt typed in a Latin-1 terminal reaches Python as lone surrogates, which no UTF-8 encoder
    takes: in an argument and on stdin, each such byte is read as U+FFFD."""
    env = {**os.environ, "LOCALCHAT_HOME": str(localchat_home)}
    prompt = b"Caf\xe9 au lait?"
    for args, stdin in [([os.fsdecode(prompt)], None), (["-"], prompt)]:
        done = subprocess.run([sys.executable, "-m", "localchat", "run", "-n", "2", "--raw", "--stats", *args], input=stdin,
                              capture_output=True, env=env, timeout=300)
        assert done.returncode == 0 and b"Traceback" not in done.stderr, done.stderr.decode(errors="replace")
        assert json.loads(done.stderr.decode().splitlines()[-1])["completion_tokens"] >= 1


def test_run_holds_prompt_and_reply_to_a_context_smaller_than_llama_cpp_makes(localchat_home: Path, default_model: Path) -> None:
    """llama.cpp makes 256 cells for `--ctx 16` (llama-completion and llama-server then run in 256);
    here the 16 asked for hold the prompt and the reply, which ends at them (its last token sampled,
    not evaluated), and a chat prompt longer than them is one line."""
    result = localchat("run", "--ctx", "16", "--raw", "--stats", "-n", "100", "--temperature", "0", "Count: 1, 2, 3,",
                       home=localchat_home)
    assert result.returncode == 0, result.stderr
    stats = json.loads(result.stderr.strip().splitlines()[-1])
    assert stats["n_ctx"] == 16 and stats["prompt_tokens"] + stats["completion_tokens"] <= 16 + 1
    chat = localchat("run", "--ctx", "16", "hi", home=localchat_home)
    assert chat.returncode == 1 and "but the context holds 16" in chat.stderr
    assert len(chat.stderr.strip().splitlines()) == 1


def test_serve_on_port_0_names_the_port_the_system_chose_and_the_context_asked(localchat_home: Path, tmp_path: Path) -> None:
    log = tmp_path / "serve.log"
    with log.open("wb") as stream:
        server = subprocess.Popen([sys.executable, "-m", "localchat", "serve", "--port", "0", "--ctx", "16", "--parallel", "1"],
                                  stdout=stream, stderr=stream, env={**os.environ, "LOCALCHAT_HOME": str(localchat_home)})
    try:
        deadline = time.monotonic() + 120
        while "serving" not in log.read_text() and server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        banner = next(line for line in log.read_text().splitlines() if "serving" in line)
        found = re.search(r"on http://127\.0\.0\.1:(\d+)/v1 \(1 slots, context (\d+)", banner)
        assert found is not None, banner
        port, n_ctx = int(found[1]), int(found[2])
        assert port != 0 and n_ctx == 16
        while server.poll() is None and time.monotonic() < deadline:  # listening once uvicorn has started
            with contextlib.suppress(requests.ConnectionError):
                assert requests.get(f"http://127.0.0.1:{port}/health", timeout=10).json()["status"] == "ok"
                break
            time.sleep(0.2)
        else:
            raise AssertionError(log.read_text())
    finally:
        server.terminate()
        server.wait(timeout=60)


# A real Ctrl-C (SIGINT) sent as a module is imported: while the command's modules import, and while its
# arguments' parser is built (localchat.models is imported for -m's help).
CTRL_C_AT = """
import os, runpy, signal, sys, tomllib

class CtrlC:
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, CtrlC())
sys.argv = ["localchat", "list"]
if {entry!r} == "python -m localchat":
    runpy.run_module("localchat", run_name="__main__", alter_sys=True)
else:  # as pip's script runs pyproject.toml's entry point
    with open({pyproject!r}, "rb") as file:
        module, function = tomllib.load(file)["project"]["scripts"]["localchat"].split(":")
    sys.exit(getattr(__import__(module, fromlist=[function]), function)())
"""


@pytest.mark.parametrize("entry", ["python -m localchat", "pyproject's entry point"])
@pytest.mark.parametrize("module", ["localchat.planner", "localchat.models"])
def test_ctrl_c_while_the_command_starts_ends_it_quietly(localchat_home: Path, entry: str, module: str) -> None:
    pyproject = str(Path(__file__).parents[1] / "pyproject.toml")
    result = subprocess.run([sys.executable, "-c", CTRL_C_AT.format(module=module, entry=entry, pyproject=pyproject)],
                            capture_output=True, text=True, timeout=300, env={**os.environ, "LOCALCHAT_HOME": str(localchat_home)})
    assert (result.returncode, result.stdout, result.stderr) == (130, "", "\n")


def test_info_explains_the_plan(localchat_home: Path) -> None:
    result = localchat("info", home=localchat_home)
    assert result.returncode == 0, result.stderr
    for expected in ("model", "cpu", "ram", "build", "plan", "llama.cpp", "context"):
        assert expected in result.stdout
    # SmolLM2-135M: 30 layers x 3 KV heads x (64 + 64) x f16 a token, for the 8192 tokens of its training context.
    assert "KV cache 180.0 MiB for the plan's 8192 tokens, 22.5 KiB a token (f16)" in result.stdout


@pytest.mark.parametrize("command", [[], ["run"], ["bench"], ["info"], ["chat"], ["serve"], ["convert"]])
def test_every_command_answers_help(localchat_home: Path, command: list[str]) -> None:
    result = localchat(*command, "--help", home=localchat_home)
    assert result.returncode == 0 and "usage: localchat" in result.stdout


@pytest.mark.parametrize(("args", "command"), [(["run", "--bogus", "hi"], "run"), (["serve", "--bogus"], "serve"),
                                             (["--bogus"], "chat"), (["convert", "x", "--to", "gguf", "--bogus"], "convert")])
def test_an_unknown_option_shows_its_command_s_usage(localchat_home: Path, args: list[str], command: str) -> None:
    result = localchat(*args, home=localchat_home)
    assert result.returncode == 2 and result.stderr.startswith(f"usage: localchat {command} "), result.stderr
    assert result.stderr.endswith(f"localchat {command}: error: unrecognized arguments: --bogus\n")


def test_the_model_option_names_the_model_used_without_it(localchat_home: Path) -> None:
    for command in ("run", "serve", "info"):
        result = localchat(command, "--help", home=localchat_home)
        assert f"(default: {DEFAULT_MODEL_NAME})" in " ".join(result.stdout.split()), command


def _bad_files(tmp_path: Path, default_model: Path) -> dict[str, Path]:
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(default_model.read_bytes()[: 50_000_000])
    not_gguf = tmp_path / "notes.gguf"
    not_gguf.write_text("hello")
    empty = tmp_path / "empty.gguf"
    empty.touch()
    folder = tmp_path / "folder"
    folder.mkdir()
    return {"truncated": truncated, "not GGUF": not_gguf, "empty": empty, "folder": folder, "missing": tmp_path / "nope.gguf"}


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ("truncated", "is truncated"),
        ("not GGUF", "is not a GGUF file"),
        ("empty", "is empty"),
        ("folder", "not an ONNX model"),
        ("missing", "does not exist"),
    ],
)
def test_a_bad_model_file_gets_one_clear_line(tmp_path: Path, localchat_home: Path, default_model: Path, case: str, message: str) -> None:
    path = _bad_files(tmp_path, default_model)[case]
    result = localchat("run", "-m", str(path), "hi", home=localchat_home)
    assert result.returncode == 1
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["run", "-m", "no-such-model", "hi"], "unknown model 'no-such-model'"),
        (["run", "--temperature", "-1", "hi"], "temperature must be >= 0"),
        (["run", "--top-p", "1.5", "hi"], "top_p must be in"),
        (["run", "-n", "0", "hi"], "-n must be >= 1, got 0"),
        (["run", "-n", "-2000", "hi"], "-n must be >= 1, got -2000"),
        (["run", "--lookup-draft", "99", "hi"], "lookup_draft must be in [0, 63]"),
        (["run", "-m", "http://127.0.0.1:1/v1", "--raw", "hi"], "--raw works with local models only"),
        (["run", "-m", "http://127.0.0.1:1/v1", "--lookup-draft", "4", "hi"], "--lookup-draft works with local models only"),
        (["run", "--draft-model", "/no/such/draft.gguf", "hi"], "draft model: model file /no/such/draft.gguf does not exist"),
        (["run", "-m", "http://127.0.0.1:1/v1", "--draft-model", "x.gguf", "hi"], "--draft-model works with local models only"),
        (["chat", "-m", "http://127.0.0.1:1/v1", "--draft-model", "x.gguf"], "--draft-model works with local models only"),
        (["run", "-m", "http://127.0.0.1:1/v1", "--lora", "x.gguf", "hi"], "--lora works with local models only"),
        (["chat", "-m", "http://127.0.0.1:1/v1", "--lora", "x.gguf"], "--lora works with local models only"),
        (["run", "--lora", "/no/such/adapter.gguf", "hi"], "/no/such/adapter.gguf cannot be read"),
        (["run", "--lora", f"{__file__}:abc", "hi"], "the scale 'abc' is not a number"),
        (["run", "-m", "http:///v1", "hi"], "is not a server's address"),
        (["run", "-m", "http://[::1", "hi"], "is not a server's address"),
        (["run", "-m", "http://127.0.0.1:port/v1", "hi"], "is not a server's address"),
        (["chat"], "the chat app needs a terminal"),  # stdout is a pipe here
        (["serve", "--host", "nosuchhost.invalid"], "--host nosuchhost.invalid"),
        (["run", "-m", "http://127.0.0.1:1/v1", "hi"], "cannot reach http://127.0.0.1:1/v1"),
        # The sampler options a remote request carries are no local-only ones: they reach the (missing) server.
        (["run", "-m", "http://127.0.0.1:1/v1", "--temperature", "0", "--top-p", "0.9", "--seed", "1", "-n", "5", "hi"],
         "cannot reach http://127.0.0.1:1/v1"),
        (["run", ""], "the prompt is empty"),
        (["run", " \n"], "the prompt is empty"),
        (["run", "-m", "http://127.0.0.1:1/v1", ""], "the prompt is empty"),
        (["run", "--ctx", "64", "word " * 2000], "context holds"),
        (["info", "--ctx", "4"], "context size 4 is too small"),
        (["run", "--gpu-layers", "-5", "hi"], "GPU layers must be >= 0"),
        (["info", "--gpu-layers", "-1"], "GPU layers must be >= 0"),
        (["bench", "--gpu-layers", "-1"], "GPU layers must be >= 0"),
        (["serve", "--gpu-layers", "-1"], "GPU layers must be >= 0"),
    ],
)
def test_bad_input_gets_one_clear_line(localchat_home: Path, args: list[str], message: str) -> None:
    result = localchat(*args, home=localchat_home)
    assert result.returncode == 1, result.stdout
    assert message in result.stderr and "Traceback" not in result.stderr


def test_an_empty_prompt_on_stdin_is_one_line(localchat_home: Path) -> None:
    result = localchat("run", "-", home=localchat_home, stdin="\n")
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert result.stderr == "localchat: error: the prompt read from stdin is empty: pipe the text to answer into " \
                            "`localchat run -`, or give it as the last argument\n"


# Options only a local model's decoding reads, with a value each; run's and chat's model options first.
LOCAL_ONLY_OPTIONS = [["--ctx", "512"], ["--threads", "2"], ["--gpu-layers", "0"], ["--top-k", "40"], ["--min-p", "0.1"],
                      ["--repeat-penalty", "1.1"], ["--dry-multiplier", "0.8"]]


@pytest.mark.parametrize("option", LOCAL_ONLY_OPTIONS, ids=[option[0] for option in LOCAL_ONLY_OPTIONS])
def test_an_option_only_a_local_model_reads_is_refused_for_a_remote_server(localchat_home: Path, option: list[str]) -> None:
    """Refused before the server is reached (port 1 listens to nothing), rather than ignored."""
    refusal = f"localchat: error: {option[0]} works with local models only: a remote server decodes as it is set up\n"
    run = localchat("run", "-m", "http://127.0.0.1:1/v1", *option, "hi", home=localchat_home)
    assert (run.returncode, run.stderr) == (1, refusal)
    if option[0] in ("--ctx", "--threads", "--gpu-layers"):
        chat = localchat("chat", "-m", "http://127.0.0.1:1/v1", *option, home=localchat_home)
        assert (chat.returncode, chat.stderr) == (1, refusal)


def test_what_the_system_refuses_is_one_line(tmp_path: Path, localchat_home: Path, default_model: Path) -> None:
    """A port in use (found before the model loads), a home that is a file, a reader that leaves early."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = localchat("serve", "--port", str(taken.getsockname()[1]), home=localchat_home)
    assert busy.returncode == 1 and "Address already in use; another program listens there" in busy.stderr
    assert "serving" not in busy.stderr and "Traceback" not in busy.stderr
    home_file = tmp_path / "home"
    home_file.write_text("")
    in_a_file = localchat("run", "-n", "1", "hi", home=home_file)
    assert in_a_file.returncode == 1 and "Not a directory" in in_a_file.stderr and "LOCALCHAT_HOME" in in_a_file.stderr
    assert "Traceback" not in in_a_file.stderr
    hub_cache = subprocess.run([sys.executable, "-m", "localchat", "list"], capture_output=True, text=True, timeout=300,
                               env={**os.environ, "LOCALCHAT_HOME": str(localchat_home), "HF_HUB_CACHE": str(home_file)})
    assert hub_cache.returncode == 1 and "is not a folder: point HF_HUB_CACHE" in hub_cache.stderr
    env = {**os.environ, "LOCALCHAT_HOME": str(localchat_home)}
    reader = subprocess.Popen([sys.executable, "-m", "localchat", "run", "-n", "200", "--raw", "Count: 1, 2, 3,"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    assert reader.stdout is not None and reader.stderr is not None
    reader.stdout.read(1)
    reader.stdout.close()  # as `| head -c 1` leaves
    assert reader.wait(timeout=300) == 128 + signal.SIGPIPE and b"Traceback" not in reader.stderr.read()


def test_a_model_whose_output_is_not_a_number_is_one_line(tmp_path: Path, localchat_home: Path, default_model: Path) -> None:
    """Broken weights (here the last norm's, NaN) give no logit to compare: one line, sampled or greedy."""
    broken = tmp_path / "nan.gguf"
    shutil.copyfile(default_model, broken)
    norm = next(t for t in GGUFReader(default_model).tensors if t.name == "output_norm.weight")
    with broken.open("r+b") as stream:
        stream.seek(norm.data_offset)
        stream.write(np.full(norm.n_elements, np.nan, dtype=np.float32).tobytes())
    for flags in ([], ["--temperature", "0"]):
        result = localchat("run", "-m", str(broken), "-n", "3", *flags, "hi", home=localchat_home)
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr[-2000:]
        assert "the model's output is not a number (NaN)" in result.stderr
