"""The `localchat` command: parse arguments, call the engine, print. Nothing else lives here."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import gc
import json
import os
import signal
import socket
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from localchat.backends.base import SamplerSettings
from localchat.errors import InvalidSettingError, LocalchatError, ModelError
from localchat.hardware import MIB, peak_rss_bytes
from localchat.interrupts import INTERRUPTED_EXIT, Terminated, interruptible
from localchat.planner import ONE_REPLY_TOKENS, ModelFacts, OneReply, Plan, PlanRequest, kv_cache_bytes
from localchat.settings import DEFAULT_LOOKUP_DRAFT, Settings
from localchat.unicode_text import well_formed

if TYPE_CHECKING:
    from localchat.constraints import Constraint
    from localchat.adapters import LoraSpec
    from localchat.engine import Engine
    from localchat.hub import HubModelName
    from localchat.model_loading import ModelLoading
    from localchat.models import InstalledModel
    from localchat.presets import ModelPreset
    from localchat.remote_endpoint import RemoteEndpoint
    from localchat.session import GenerationSettings

Handler = Callable[[argparse.Namespace], int]


class _CommandParser(argparse.ArgumentParser):
    """A command's parser: an option it does not know is an error in its own usage (argparse would hand it
    up to the top parser, whose usage names no option of the command)."""

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        parsed, unknown = super().parse_known_args(args, namespace)
        if unknown:
            self.error(f"unrecognized arguments: {' '.join(unknown)}")
        return parsed, unknown


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    from localchat.models import DEFAULT_MODEL_NAME

    parser.add_argument("-m", "--model", help="a .gguf file, an ONNX model folder, a name from `localchat list`, or a "
                        f"Hugging Face GGUF repo as user/repo[:QUANT], pulled on first use (default: {DEFAULT_MODEL_NAME})")
    parser.add_argument("--ctx", type=int, help="context size in tokens (default: chosen from the model and memory)")
    parser.add_argument("--threads", type=int, help="CPU threads (default: the physical cores)")
    parser.add_argument("--gpu-layers", type=int, help="layers to offload to the GPU (default: as many as fit)")


DECODED_REMOTELY = "works with local models only: a remote server decodes as it is set up"
# The options only a local model reads (by argparse's dest: the option is --dest, dashed), with why each is refused with
# a remote server's -m rather than ignored. A remote request carries OpenAI's fields alone (localchat.remote._request).
LOCAL_ONLY_OPTIONS = {
    "raw": "works with local models only: a remote server applies its own chat template",
    **dict.fromkeys(("ctx", "threads", "gpu_layers", "draft_model", "lora", "lookup_draft",
                     "top_k", "min_p", "repeat_penalty", "dry_multiplier"), DECODED_REMOTELY),
}


def _add_remote_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--remote-model", metavar="NAME", help="with -m http://HOST:PORT/v1: the server's model to use "
                        "(default: its only one; or write -m http://HOST:PORT/v1#NAME)")
    parser.add_argument("--api-key", dest="remote_api_key", metavar="KEY",
                        help="with -m http://HOST:PORT/v1: the server's API key (default: $LOCALCHAT_REMOTE_API_KEY)")


def _remote(args: argparse.Namespace) -> RemoteEndpoint | None:
    """The remote server `-m` names (an http(s) URL), else None."""
    from localchat.remote_endpoint import remote_endpoint

    return remote_endpoint(args.model, remote_model=args.remote_model, api_key=args.remote_api_key)


def _refuse_local_only_options(args: argparse.Namespace) -> None:
    """Raise for the first option of LOCAL_ONLY_OPTIONS that `args` gives (its command may not have them all)."""
    for dest, why in LOCAL_ONLY_OPTIONS.items():
        value = getattr(args, dest, None)
        if value is not None and value is not False:  # --gpu-layers 0 is given
            raise InvalidSettingError(f"--{dest.replace('_', '-')} {why}")


def _plan_request(args: argparse.Namespace, n_seq: int = 1) -> PlanRequest:
    return PlanRequest(n_ctx=args.ctx, n_gpu_layers=args.gpu_layers, n_threads=args.threads, n_seq=n_seq)


# Sampler flags and the SamplerSettings field each sets; unset, the model's defaults hold
# (localchat.sampling_defaults: its file's, its family's, else llama.cpp's, shown by --stats).
SAMPLER_FLAGS = {"temperature": "temperature", "top_k": "top_k", "top_p": "top_p", "min_p": "min_p",
                 "repeat_penalty": "repeat_penalty", "dry_multiplier": "dry_multiplier", "seed": "seed"}


def _add_sampler_options(parser: argparse.ArgumentParser) -> None:
    fallback = SamplerSettings()
    model_default = "default: the model's, else %s"
    parser.add_argument("--temperature", type=float, help=f"0 for greedy ({model_default % fallback.temperature})")
    parser.add_argument("--top-k", type=int, help=f"({model_default % fallback.top_k})")
    parser.add_argument("--top-p", type=float, help=f"({model_default % fallback.top_p})")
    parser.add_argument("--min-p", type=float, help=f"({model_default % fallback.min_p})")
    parser.add_argument("--repeat-penalty", type=float, help=f"1 disables it ({model_default % fallback.repeat_penalty})")
    parser.add_argument("--dry-multiplier", type=float,
                        help=f"DRY repetition penalty; 0 disables it ({model_default % fallback.dry_multiplier})")
    parser.add_argument("--seed", type=int, help="random seed, for repeatable sampling")


def _add_lookup_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lookup-draft", type=int, metavar="N",
                        help="prompt-lookup speculative decoding: draft up to N tokens copied from the prompt and the reply, "
                             "checked in one step, fewer while drafts are rejected; the same reply, faster when it repeats "
                             f"its input; 0 turns it off (default: {DEFAULT_LOOKUP_DRAFT})")


def _add_draft_model_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--draft-model", metavar="MODEL",
                        help="speculative decoding by a smaller model with the same vocabulary (e.g. a Q4_K_M of the same "
                             "checkpoint, or the family's small model) where prompt lookup has no draft, while it makes decoding "
                             "faster (timed as it goes); -m's forms")


def _add_lora_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lora", action="append", metavar="FILE[:SCALE]",
                        help="a LoRA adapter for the model, as GGUF (localchat convert ADAPTER_DIR --to gguf), applied at "
                             "SCALE (default 1); repeatable")


def _lora_specs(args: argparse.Namespace) -> tuple[LoraSpec, ...]:
    from localchat.adapters import LoraSpec

    return tuple(LoraSpec.parse(text) for text in args.lora or ())


def _start_loading(args: argparse.Namespace, request: PlanRequest) -> ModelLoading:
    """The model of `-m` planned, its load started on a thread of its own: what the command imports
    next is imported beside it."""
    from localchat.model_loading import start_loading

    return start_loading(args.model, Settings(), request)


def _load_engine(args: argparse.Namespace, loading: ModelLoading) -> Engine:
    """`loading`'s model, with the draft model of `--draft-model` and the adapters of `--lora` if given."""
    from localchat.engine import Engine

    return Engine.load(loading, draft_model=args.draft_model, loras=_lora_specs(args))


def _decode_here(engine: Engine) -> None:
    """A command that decodes on the main thread alone runs llama.cpp's decodes in place (see
    localchat.backends.llamacpp._ComputeThread)."""
    if engine.backend.name == "llama.cpp":
        from localchat.backends.llamacpp import decode_on_this_thread

        decode_on_this_thread()


def _lookup_draft(args: argparse.Namespace) -> int:
    return DEFAULT_LOOKUP_DRAFT if args.lookup_draft is None else args.lookup_draft


def _sampler_settings(args: argparse.Namespace, defaults: SamplerSettings | None) -> SamplerSettings | None:
    """`defaults` with the sampler flags given over them; None (the model's own) when none are given
    and no defaults are known (a remote server keeps its own)."""
    given = {field: getattr(args, flag) for flag, field in SAMPLER_FLAGS.items() if getattr(args, flag) is not None}
    if not given and defaults is None:
        return None
    return dataclasses.replace(defaults or SamplerSettings(), **given)


def _json_schema(path: Path) -> Constraint:
    """The reply's constraint from a JSON schema file; a file that cannot be used is one error line."""
    from localchat.constraints import Constraint

    try:
        source = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise InvalidSettingError(f"--json-schema: cannot read {path} ({error})") from None
    try:
        return Constraint("json_schema", source)
    except InvalidSettingError as error:
        raise InvalidSettingError(f"--json-schema {path}: {error}") from None


def _generation_settings(args: argparse.Namespace, preset: ModelPreset | None = None) -> GenerationSettings:
    """run's flags over `preset`'s stop strings and reply limit, over run's defaults."""
    from localchat.session import GenerationSettings

    constraint = _json_schema(args.json_schema) if args.json_schema is not None else None
    settings = GenerationSettings(max_tokens=ONE_REPLY_TOKENS, constraint=constraint, lookup_draft=_lookup_draft(args))
    if preset is not None:
        settings = preset.reply_settings(settings)
    flags = {"max_tokens": args.n, "stop": tuple(args.stop or ()) or None}
    return dataclasses.replace(settings, **{name: value for name, value in flags.items() if value is not None})


def _prompt(args: argparse.Namespace) -> str:
    """run's prompt: its argument, or stdin's text for `-`. An empty one (an unset shell variable, an empty pipe) is
    refused, not answered."""
    from_stdin = args.prompt == "-"
    # Bytes that are not UTF-8, in an argument or on stdin, are read as U+FFFD (localchat.unicode_text).
    prompt = sys.stdin.buffer.read().decode("utf-8", "replace") if from_stdin else args.prompt
    if prompt.strip():
        return prompt
    if from_stdin:
        raise InvalidSettingError("the prompt read from stdin is empty: pipe the text to answer into `localchat run -`, "
                                  "or give it as the last argument")
    raise InvalidSettingError("the prompt is empty: give the text to answer as the last argument, or - to read it from stdin")


def cmd_run(args: argparse.Namespace) -> int:
    if args.n is not None and args.n < 1:  # said as the flag: the setting's own check would name max_tokens
        raise InvalidSettingError(f"-n must be >= 1, got {args.n}")
    prompt = _prompt(args)
    endpoint = _remote(args)
    if endpoint is not None:
        _refuse_local_only_options(args)
        # Without -n the server's own limit holds (its model's num_predict, else its context), as for Ollama's CLI.
        settings = dataclasses.replace(_generation_settings(args), max_tokens=args.n, sampler=_sampler_settings(args, None))
        return _run_remote(args, endpoint, prompt, settings)
    # One reply: a context no larger than it can fill is made (and its KV cache cleared) sooner.
    one_reply = OneReply(len(prompt.encode()) + len((args.system or "").encode()), args.n)
    request = dataclasses.replace(_plan_request(args), one_reply=one_reply)
    with _start_loading(args, request) as loading:
        settings = _generation_settings(args)  # the session's imports, beside the load
        engine = _load_engine(args, loading)
    try:
        _decode_here(engine)
        if engine.preset is not None:  # its stop strings and reply limit, under the flags
            settings = _generation_settings(args, engine.preset)
        settings = dataclasses.replace(settings, sampler=_sampler_settings(args, engine.sampler_defaults.settings))
        left_out = 0
        if args.raw:
            tokens = engine.backend.tokenize(prompt, add_bos=engine.backend.info.add_bos, special=True)
            generation = engine.sessions[0].generate(tokens, settings)
        else:
            chat = engine.new_chat(args.system)
            generation = chat.send(prompt, settings)
            left_out = chat.prompt.left_out if chat.prompt is not None else 0
        _stream(generation)
        stats = generation.stats
        if args.stats and stats is not None:
            record = {
                "model_path": str(engine.model_plan.model.path),
                "backend": engine.backend.name,
                "n_ctx": engine.backend.n_ctx,
                "n_threads": engine.plan.n_threads,
                "prompt_tokens": stats.prompt_tokens,
                # Messages the prompt left out to fit n_ctx (the TUI marks where its view starts).
                "messages_left_out": left_out,
                "completion_tokens": stats.completion_tokens,
                "completion_ids": list(stats.completion_ids),
                "finish_reason": stats.finish_reason,
                "ttft_s": round(stats.ttft_s, 4),
                "prefill_tok_s": round(stats.prefill_tok_s, 2),
                "decode_tok_s": round(stats.decode_tok_s, 2),
                "drafted_tokens": stats.drafted_tokens,
                "accepted_tokens": stats.accepted_tokens,
                "peak_rss_mb": round(peak_rss_bytes() / MIB, 1),
                # What the reply was sampled with, and where the model's defaults among it came from.
                "sampler": dataclasses.asdict(stats.sampler) if stats.sampler is not None else None,
                "sampler_defaults": engine.sampler_defaults.source,
            }
            print(json.dumps(record), file=sys.stderr)
    finally:
        engine.close(process_ends=args.process_ends)
    return 0


def _stream(generation: Iterable[str]) -> None:
    for piece in generation:
        sys.stdout.write(piece)
        sys.stdout.flush()
    sys.stdout.write("\n")


def _run_remote(args: argparse.Namespace, endpoint: RemoteEndpoint, prompt: str, settings: GenerationSettings) -> int:
    """`run` on a remote server: the same reply and statistics, measured from its stream."""
    from localchat.remote import RemoteServer

    with RemoteServer(endpoint) as server:
        generation = server.new_chat(args.system).send(prompt, settings)
        _stream(generation)
        stats = generation.stats
        if args.stats and stats is not None:
            record = {
                "remote": endpoint.base_url,
                "model": server.model,
                "backend": server.backend_name,
                "prompt_tokens": stats.prompt_tokens,
                "cached_tokens": stats.cached_tokens,
                "completion_tokens": stats.completion_tokens,
                "finish_reason": stats.finish_reason,
                "ttft_s": round(stats.ttft_s, 4),
                "decode_tok_s": round(generation.tokens_per_second, 2),
            }
            print(json.dumps(record), file=sys.stderr)
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from localchat.bench import run_bench
    from localchat.engine import Engine

    # The benchmark clears the prefix cache as it goes: keep it off the user's disk tier.
    settings = Settings(prefix_cache_disk_bytes=0)
    with Engine.load(args.model, settings, _plan_request(args)) as engine:
        _decode_here(engine)
        result = run_bench(engine)
    if args.json:
        print(json.dumps(result.as_dict()))
        return 0
    reuse, cold = result.ttft_turns_reuse, result.ttft_turns_cold
    rows = [
        ("model", result.model_path),
        ("backend / threads / context", f"{result.backend} / {result.n_threads} / {result.n_ctx}"),
        (f"prefill ({result.prefill_tokens} tokens)", f"{result.prefill_tok_s:.1f} tok/s"),
        (f"decode ({result.decode_tokens} tokens, greedy)", f"{result.decode_tok_s:.1f} tok/s"),
        ("decode, as shipped", f"{result.decode_shipped_tok_s:.1f} tok/s ({result.decode_shipped_tok_s / result.decode_tok_s:.2f}x "
                               f"greedy), the model's default sampler: {result.shipped_sampler}"),
        *((f"decode, {r.task}, lookup drafts, greedy",
           f"{r.lookup_tok_s:.1f} vs {r.plain_tok_s:.1f} tok/s plain ({r.speedup:.2f}x), "
           f"{'-' if r.acceptance is None else f'{r.acceptance:.0%}'} of drafted tokens accepted"
           f"{'' if r.same_reply else ', reply differs (a near tie)'}") for r in result.speculation),
        ("TTFT per turn, KV reuse (ms)", " ".join(f"{t * 1000:.0f}" for t in reuse)),
        ("TTFT per turn, recomputed (ms)", " ".join(f"{t * 1000:.0f}" for t in cold)),
        ("turn 6 / turn 1 (reuse)", f"{reuse[-1] / reuse[0]:.2f}x"),
        ("turn 6 recomputed / reused", f"{cold[-1] / reuse[-1]:.1f}x"),
        ("prefix-cache hit TTFT", f"{result.prefix_hit_ttft * 1000:.0f} ms"
                                  f"{'' if result.prefix_restored else ' (computed: measured faster than restoring)'}"),
        ("prefix cold TTFT", f"{result.prefix_cold_ttft * 1000:.0f} ms"),
        ("hit / cold", f"{result.prefix_hit_ttft / result.prefix_cold_ttft:.2f}x"),
        ("peak RSS", f"{result.peak_rss_mb:.0f} MiB"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")
    return 0


def _memory_line(facts: ModelFacts, plan: Plan) -> str:
    """What the plan's context keeps beside the weights: its KV cache, and any recurrent state."""
    per_token = f"{facts.kv_bytes_per_token / 1024:.1f} KiB a token (f16)"
    line = f"KV cache {_size(kv_cache_bytes(facts, plan.n_ctx, plan.kv_type))} for the plan's {plan.n_ctx} tokens, {per_token}"
    if facts.state_bytes_per_sequence:
        line += f"; a recurrent state of {_size(facts.state_bytes_per_sequence)} a sequence"
    return line


def cmd_info(args: argparse.Namespace) -> int:
    from localchat.model_loading import plan_model
    from localchat.models import PACKAGED_MODELS, inspect_gguf
    from localchat.native import build_advice
    from localchat.sampling_defaults import sampler_defaults

    model_plan = plan_model(args.model, Settings(), _plan_request(args))
    hw, facts, plan = model_plan.hardware, model_plan.facts, model_plan.plan
    packaged = PACKAGED_MODELS.get(model_plan.model.name)
    preset = model_plan.model.preset
    note = f": {packaged.note}" if packaged is not None else f": a preset of {preset.model}" if preset is not None else ""
    print(f"model      {model_plan.model.name}{note}")
    print(f"           {model_plan.model.path} ({model_plan.model.format}, {facts.weight_bytes / MIB:.0f} MiB of weights, "
          f"{facts.n_layers} layers, trained context {facts.n_ctx_train})")
    if model_plan.model.format == "gguf":
        metadata = {k: str(v) for k, v in inspect_gguf(model_plan.model.path)[0].metadata.items() if k.startswith("general.")}
    else:
        from localchat.backends.onnx import sampling_metadata

        metadata = sampling_metadata(model_plan.model.path)
    defaults = sampler_defaults(metadata)
    if preset is not None:
        defaults = preset.sampler(defaults)
        if preset.system:
            print(f"system     {preset.system}")
    print(f"sampler    {defaults.settings.describe()} (defaults: {defaults.source}; flags and requests go over them)")
    print(f"memory     {_memory_line(facts, plan)}")
    for line in facts.details:
        print(f"           {line}")
    print(f"cpu        {hw.cpu_name}: {hw.physical_cores} cores, {hw.logical_cores} threads"
          f"{', AMX' if hw.has_amx else ''}")
    print(f"ram        {hw.ram_available_bytes / 1024**3:.1f} GiB available of {hw.ram_total_bytes / 1024**3:.1f} GiB")
    if hw.gpus:
        for gpu in hw.gpus:
            print(f"gpu {gpu.index}      {gpu.name}: {gpu.free_bytes / 1024**3:.1f} GiB free of {gpu.total_bytes / 1024**3:.1f} GiB")
    else:
        print("gpu        none found (NVML)")
    print(f"build      {model_plan.build.description}; GPU offload {'yes' if model_plan.build.gpu_offload else 'no'}")
    if model_plan.model.format == "gguf" and (advice := build_advice()) is not None:
        print(f"           {advice}")
    print(f"plan       {plan.describe()}")
    for reason in plan.reasons:
        print(f"  - {reason}")
    return 0


def _log_model_changes() -> None:
    """The server's line per model load and unload goes to stderr, beside its other messages."""
    import logging

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("localchat: %(message)s"))
    log = logging.getLogger("localchat.server.app")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False


def cmd_serve(args: argparse.Namespace) -> int:
    from localchat.server.settings import ServerSettings

    settings = ServerSettings(
        host=args.host,
        port=args.port,
        api_key=args.api_key or os.environ.get("LOCALCHAT_API_KEY"),
        cors_origins=tuple(args.cors_origin or ()),
        queue_size=args.queue,
        enable_thinking=False if args.no_think else None,
        max_models=args.max_models,
        allow_pull=args.allow_pull,
        allow_model_changes=args.allow_model_changes,
        lookup_draft=_lookup_draft(args),
        max_reply_tokens=args.max_reply_tokens,
    )
    app_settings, request = Settings(), _plan_request(args, n_seq=args.parallel)
    listening = _listening_socket(settings.host, settings.port)
    port = listening.getsockname()[1]  # the one the system chose for --port 0
    with _start_loading(args, request) as loading:
        # The web stack's imports, beside the load.
        from localchat.server.app import serve
        from localchat.models import prune_uploads
        from localchat.server.served_models import EngineLoader

        prune_uploads(app_settings)
        engine = _load_engine(args, loading)
    with engine:
        # Every other model is planned on the machine as it was before this one loaded.
        loader = EngineLoader(app_settings, request, engine.model_plan.hardware, queue_size=settings.queue_size,
                              allow_pull=settings.allow_pull)
        print(
            f"localchat: serving {engine.model_plan.model.name} on http://{settings.host}:{port}/v1 "
            f"({args.parallel} slots, context {engine.backend.n_ctx}"
            f"{', API key required' if settings.api_key else ''}); a request naming another local model loads it"
            f"{f' (at most {settings.max_models} loaded)' if settings.max_models else ''}",
            file=sys.stderr,
            flush=True,
        )
        _log_model_changes()
        serve(engine, settings, loader, listening)
    return 0


def _listening_socket(host: str, port: int) -> socket.socket:
    """The server's socket, bound before the model loads: a port in use or a host not of this machine
    is one line at once, not a load and then uvicorn's error."""
    try:
        address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
        listening = socket.socket(address[0], socket.SOCK_STREAM)
    except OSError as error:
        raise InvalidSettingError(f"--host {host}: {error.strerror or error}") from None
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
    try:
        listening.bind(address[4])
    except OSError as error:
        listening.close()
        advice = "another program listens there: give another --port" if error.errno == errno.EADDRINUSE else (
            "give an address of this machine as --host (127.0.0.1, or 0.0.0.0 for every network)")
        raise InvalidSettingError(f"cannot listen on {host}:{port}: {error.strerror}; {advice}") from None
    return listening


def cmd_chat(args: argparse.Namespace) -> int:
    from localchat.model_loading import ProgressRelay, start_loading

    remote = _remote(args)
    if remote is not None:
        _refuse_local_only_options(args)
    if not (sys.stdin.isatty() and sys.stdout.isatty()):  # Textual would draw into a pipe and wait for keys for ever
        raise InvalidSettingError("the chat app needs a terminal; from a pipe or a script, `localchat run PROMPT` "
                                  "answers one prompt (`-` reads it from stdin)")
    settings, request, loras = Settings(), _plan_request(args), _lora_specs(args)
    # The model loads while the app is imported and drawn. One that cannot be planned is left to
    # the app, which says why and offers another.
    progress = ProgressRelay()
    loading: ModelLoading | None = None
    if remote is None:
        with contextlib.suppress(LocalchatError):
            loading = start_loading(args.model, settings, request, on_progress=progress)
    from localchat.tui.app import run_chat_app

    try:
        return run_chat_app(args.model, settings, request, remote=remote, draft_model=args.draft_model, loras=loras,
                            loading=loading, loading_progress=progress)
    finally:
        if loading is not None:
            loading.close()  # the app quit while the model loaded: waited for and freed


def _pull(name: HubModelName, settings: Settings) -> None:
    """Pull and say what happened on stderr; Ctrl-C says that the next pull resumes."""
    from localchat.hub import pull

    try:
        result = pull(name, settings)
    except KeyboardInterrupt:
        print(f"\nlocalchat: pull interrupted; `localchat pull {name}` resumes where it stopped", file=sys.stderr)
        raise
    model, files = result.model, len(result.model.model.files)
    what = f"{model.name} ({files} file{'s' if files > 1 else ''}, {_size(model.size)})"
    if not result.checked_hub:
        print(f"localchat: {what} is in the cache (offline: not compared with the hub): {model.path}", file=sys.stderr)
    elif result.fetched_bytes:
        print(f"localchat: pulled {what}, fetched {_size(result.fetched_bytes)}, checksums verified: {model.path}", file=sys.stderr)
    else:
        print(f"localchat: {what} is up to date in the cache, nothing fetched: {model.path}", file=sys.stderr)


def _pull_on_first_use(model: str | None) -> None:
    """A Hugging Face model not yet in the cache is pulled before it loads, saying so."""
    from localchat.hub import find_cached
    from localchat.models import hub_model_name

    settings = Settings()
    name = hub_model_name(model, settings)
    if name is None or settings.hf_offline or find_cached(name, settings) is not None:
        return  # offline, loading it says what is missing
    print(f"localchat: {name} is not in the cache yet; pulling it from the Hugging Face hub", file=sys.stderr, flush=True)
    _pull(name, settings)


def cmd_pull(args: argparse.Namespace) -> int:
    from localchat.hub import HubModelName

    name = HubModelName.parse(args.name)
    if name is None:
        raise ModelError(f"'{args.name}' is not a Hugging Face model name: write user/repo or user/repo:QUANT (hf.co/user/repo:QUANT works too)")
    _pull(name, Settings())
    return 0


def _size(n_bytes: int) -> str:
    return f"{n_bytes / 2**30:.1f} GiB" if n_bytes >= 2**30 else f"{n_bytes / 2**20:.1f} MiB"


def _count(n: int | None) -> str:
    if n is None:
        return "-"
    return f"{n / 1e9:.1f}B" if n >= 1e9 else f"{n / 1e6:.0f}M" if n >= 1e6 else f"{n / 1e3:.0f}K"


def _since(when: float | None, now: float) -> str:
    if when is None:
        return "never"
    seconds = max(now - when, 0)
    for unit, size in (("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= size:
            n = int(seconds // size)
            return f"{n} {unit}{'s' if n > 1 else ''} ago"
    return "just now"


def _list_row(model: InstalledModel, now: float) -> tuple[str, ...]:
    return (
        model.name, model.quantization or "-", _size(model.size) if model.size else "-", _count(model.parameters),
        str(model.context_length or "-"), model.architecture or "-", _since(model.last_used, now),
        f"({model.pending})" if model.pending else f"(a preset of {model.preset_of})" if model.preset_of else str(model.path),
    )


def cmd_list(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from localchat.models import installed_models

    models = installed_models(Settings())
    if args.json:
        print(json.dumps([{**asdict(m), "path": str(m.path)} for m in models]))
        return 0
    if not models:
        print("no models yet: `localchat pull user/repo:QUANT` fetches one from the Hugging Face hub")
        return 0
    now = time.time()
    rows = [("NAME", "QUANT", "SIZE", "PARAMS", "CONTEXT", "ARCH", "LAST USED", "WHERE"), *(_list_row(m, now) for m in models)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(width) for cell, width in zip(row, widths)) + "  " + row[-1])
    for model in models:
        if model.problem:
            print(f"! {model.name}: {model.problem}")
    return 0


def cmd_rm(args: argparse.Namespace) -> int:
    from localchat.models import remove_model

    removed = remove_model(args.name, Settings())
    print(f"removed {', '.join(removed.names)}: {_size(removed.freed_bytes)} freed")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="localchat", description="Chat with a language model on your own machine.")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_CommandParser)

    chat = commands.add_parser("chat", help="open the chat app (the default command)")
    _add_model_options(chat)
    _add_remote_options(chat)
    _add_draft_model_option(chat)
    _add_lora_option(chat)
    chat.set_defaults(handler=cmd_chat)

    run = commands.add_parser("run", help="answer one prompt, streaming to stdout")
    _add_model_options(run)
    _add_sampler_options(run)
    run.add_argument("-n", type=int, help=f"most tokens to generate (default: a preset's num_predict, else {ONE_REPLY_TOKENS}; a remote server's own limit)")
    run.add_argument("--raw", action="store_true", help="send the prompt as is, without the chat template")
    run.add_argument("--system", type=well_formed, help="a system prompt")
    run.add_argument("--stop", action="append", type=well_formed, help="stop at this text (repeatable)")
    run.add_argument("--stats", action="store_true", help="print one JSON line of statistics on stderr at the end")
    run.add_argument("--json-schema", type=Path, metavar="FILE", help="the reply is JSON following this JSON schema file")
    _add_lookup_option(run)
    _add_draft_model_option(run)
    _add_lora_option(run)
    _add_remote_options(run)
    run.add_argument("prompt", type=well_formed, help="the prompt, or - to read it from stdin")
    run.set_defaults(handler=cmd_run)

    bench = commands.add_parser("bench", help="measure speed, KV reuse and prefix caching")
    _add_model_options(bench)
    bench.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    bench.set_defaults(handler=cmd_bench)

    serve = commands.add_parser("serve", help="serve OpenAI's and Ollama's APIs on this machine")
    _add_model_options(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s, this machine only)")
    serve.add_argument("--port", type=int, default=8080, help="(default: %(default)s)")
    serve.add_argument("--parallel", type=int, default=4, help="replies decoded together (default: %(default)s)")
    serve.add_argument("--queue", type=int, default=16, help="requests that may wait for a slot; more get 503 (default: %(default)s)")
    serve.add_argument("--api-key", help="require `Authorization: Bearer KEY` (default: $LOCALCHAT_API_KEY, else none)")
    serve.add_argument("--max-reply-tokens", type=int, metavar="N",
                       help="the most tokens a reply may have: OpenAI's max_tokens over it is refused, Ollama's num_predict "
                            "cut to it, and a request naming none gets it (default: none, a reply ends where the context does)")
    serve.add_argument("--cors-origin", action="append", help="let web pages from this origin call the API, beyond this machine's own and local apps' (repeatable)")
    _add_lookup_option(serve)
    _add_draft_model_option(serve)
    _add_lora_option(serve)
    serve.add_argument("--no-think", action="store_true",
                       help="pass enable_thinking=false to the chat template unless a request says otherwise (Qwen 3, SmolLM3...)")
    serve.add_argument("--max-models", type=int, metavar="N",
                       help="keep at most N models loaded, the least recently used idle one unloaded first "
                            "(default: as many as fit in memory, at least 1)")
    serve.add_argument("--allow-pull", action="store_true",
                       help="let a request naming a Hugging Face model not in the cache pull it, and Ollama's /api/pull "
                            "(default: only cached models)")
    serve.add_argument("--allow-model-changes", action="store_true",
                       help="let requests delete models and copy them to new names (Ollama's /api/delete, /api/copy)")
    serve.set_defaults(handler=cmd_serve)

    info = commands.add_parser("info", help="show the hardware, the llama.cpp build and the plan for a model")
    _add_model_options(info)
    info.set_defaults(handler=cmd_info)

    pull = commands.add_parser("pull", help="download a GGUF model from the Hugging Face hub (resumes, checks sha256)")
    pull.add_argument("name", metavar="NAME", help="user/repo or user/repo:QUANT, e.g. ggml-org/gemma-3-270m-it-GGUF:Q8_0 (default quant: Q4_K_M or the nearest)")
    pull.set_defaults(handler=cmd_pull)

    list_ = commands.add_parser("list", help="the models on this machine: local files and the Hugging Face cache")
    list_.add_argument("--json", action="store_true", help="print a JSON array instead of a table")
    list_.set_defaults(handler=cmd_list)

    rm = commands.add_parser("rm", help="delete a model (a name from `localchat list`) and say what it freed")
    rm.add_argument("name", metavar="NAME", help="a name from `localchat list`; user/repo without :QUANT removes all of its models")
    rm.set_defaults(handler=cmd_rm)

    from localchat.converters.cli import add_parser as add_convert_parser

    add_convert_parser(commands)
    return parser


def command() -> int:
    """The `localchat` command: `main` on the process's arguments, in a process that ends with it."""
    code = main(process_ends=True)
    # Python's exit collects every object of the imports, twice: 30 ms of a 0.45 s `localchat run`. Frozen,
    # they are freed with the process instead. What holds files or threads was closed by the command.
    gc.freeze()
    return code


def main(argv: Sequence[str] | None = None, *, process_ends: bool = False) -> int:
    """`process_ends`: the process exits after this command, which may then leave memory to its end."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv = ["chat", *argv]  # `localchat [-m MODEL ...]` opens the chat app
    args = parser.parse_args(argv)
    args.process_ends = process_ends
    try:
        interruptible()  # from here Ctrl-C cleans up what the command made (localchat.interrupts)
        if "model" in args:
            if not (args.model or "").startswith(("http://", "https://")):
                _pull_on_first_use(args.model)
            elif "remote_model" not in args:
                raise InvalidSettingError(f"`localchat {args.command}` runs local models only; a remote server "
                                          f"({args.model}) works with `localchat chat` and `localchat run`")
        return args.handler(args)
    except LocalchatError as error:
        print(f"localchat: error: {error}", file=sys.stderr)
        return 1
    except Terminated as terminated:
        return terminated.exit_status
    except KeyboardInterrupt:
        print(file=sys.stderr)  # the line Ctrl-C's ^C began
        return INTERRUPTED_EXIT
    except BrokenPipeError:
        # The reader left early (`| head`): the rest of the output goes nowhere, and the exit is SIGPIPE's.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE
    except OSError as error:  # a folder that is a file, a disk that is full or read-only: the system's own words
        print(f"localchat: error: {error} (check the paths given and LOCALCHAT_HOME)", file=sys.stderr)
        return 1
