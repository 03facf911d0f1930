"""`localchat convert`: parse, call the converter, print. Wired into localchat/cli.py."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from localchat.converters.gguf_choices import DEFAULT_QUANT, QUANT_TYPES, default_output_path
from localchat.errors import InvalidSettingError
from localchat.interrupts import sigterm_interrupts

if TYPE_CHECKING:  # every `localchat` command builds this parser: the converters are imported to convert
    from localchat.converters.checkpoint import CheckpointSource
    from localchat.converters.verify import VerifyReport

ONNX_QUANTS = ("fp32", "fp16", "int8", "int4")
DEFAULT_QUANTS = {"gguf": DEFAULT_QUANT, "onnx": "int4"}


class ProgressBar:
    """One tqdm bar per phase (writing tensors, quantizing), in bytes."""

    def __init__(self) -> None:
        self._bar = None
        self._phase = ""

    def __call__(self, done: int, total: int, what: str) -> None:
        from tqdm import tqdm

        phase = "quantizing" if what.startswith("quantizing") else "writing"
        if self._bar is None or phase != self._phase:
            self.close()
            self._bar = tqdm(total=total, unit="B", unit_scale=True, desc=phase, file=sys.stderr, leave=True)
            self._phase = phase
        self._bar.total = total
        self._bar.set_postfix_str(what, refresh=False)
        self._bar.update(done - self._bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("convert", help="convert a Hugging Face checkpoint, or a PEFT LoRA adapter, to GGUF")
    parser.add_argument("source", metavar="SRC", help="a checkpoint folder, a PEFT LoRA adapter folder or a Hugging Face repo id")
    parser.add_argument("--to", choices=tuple(TARGET_STEPS), required=True, help="the output format")
    parser.add_argument("--quant", choices=(*QUANT_TYPES, *ONNX_QUANTS),
                        help=f"gguf: {', '.join(QUANT_TYPES)} (default {DEFAULT_QUANT}); onnx: {', '.join(ONNX_QUANTS)} (default int4)")
    parser.add_argument("-o", "--output", help="the output file (default: SRC-QUANT.gguf beside a folder, or in the current folder for a repo id)")
    parser.add_argument("--verify", action="store_true", help="load the result in llama.cpp and compare it with the checkpoint")
    parser.add_argument("--base", metavar="BASE", help="a LoRA adapter's base model, a checkpoint folder or repo id "
                                                      "(default: the adapter's base_model_name_or_path; only its config.json is read)")
    parser.add_argument("--force", action="store_true", help="overwrite the output file if it exists")
    parser.add_argument("--threads", type=int, help="threads for reading and quantizing (default: all cores)")
    parser.set_defaults(handler=run)
    return parser


def _note(notice: str | None, bar: ProgressBar) -> None:
    """What a conversion left out (an image-reading model's vision part), as one line after the bar's."""
    if notice:
        bar.close()
        print(f"localchat: note: {notice}", file=sys.stderr)


def _to_gguf(args: argparse.Namespace, source: CheckpointSource, bar: ProgressBar) -> tuple[Path, str]:
    from localchat.converters.gguf import convert_checkpoint

    output = Path(args.output).expanduser() if args.output else default_output_path(source.name, args.quant, source.directory)
    result = convert_checkpoint(source.folder, output, args.quant, force=args.force, threads=args.threads, progress=bar)
    _note(result.notice, bar)
    return result.output, f"wrote {result.output} ({result.n_bytes / 2**20:.1f} MiB, {result.n_tensors} tensors, {result.seconds:.1f} s)"


def _to_onnx(args: argparse.Namespace, source: CheckpointSource, bar: ProgressBar) -> tuple[Path, str]:
    from localchat.converters.onnx import convert_to_onnx

    if args.quant not in ONNX_QUANTS:
        raise InvalidSettingError(f"--quant {args.quant} is a GGUF type; for --to onnx choose one of: {', '.join(ONNX_QUANTS)}")
    output = Path(args.output).expanduser() if args.output else source.directory / f"{source.name}-{args.quant}-onnx"
    result = convert_to_onnx(source.folder, output, args.quant, progress=bar, overwrite=args.force)
    _note(result.notice, bar)
    fused = ", ".join(f"{name} {count}" for name, count in result.operators.items())
    return result.output, f"wrote {result.output} ({result.n_bytes / 2**20:.1f} MiB of weights, {result.seconds:.1f} s; operators: {fused})"


def _verify_gguf(output: Path, checkpoint: Path, quant: str) -> VerifyReport:
    from localchat.converters.verify import verify_gguf

    return verify_gguf(output, checkpoint, quant)


def _verify_onnx(output: Path, checkpoint: Path, quant: str) -> VerifyReport:
    from localchat.converters.onnx import verify_onnx

    return verify_onnx(output, checkpoint, quant)


# Per target: convert (returning the output and a summary line), then verify.
TARGET_STEPS = {"gguf": (_to_gguf, _verify_gguf), "onnx": (_to_onnx, _verify_onnx)}


def _adapter_to_gguf(args: argparse.Namespace, source: CheckpointSource) -> int:
    from localchat.converters.lora import DEFAULT_LORA_QUANT, convert_adapter

    if args.to != "gguf" or args.verify:
        raise InvalidSettingError(f"{args.source} is a LoRA adapter: it converts --to gguf, without --verify "
                                  "(check it by running its base model with --lora)")
    quant = args.quant or DEFAULT_LORA_QUANT
    output = Path(args.output).expanduser() if args.output else default_output_path(source.name, quant, source.directory)
    result = convert_adapter(source.folder, output, quant, base=args.base, force=args.force)
    print(f"wrote {result.output} (LoRA adapter, {result.n_bytes / 2**20:.1f} MiB, {result.n_tensors} tensors, {result.seconds:.1f} s)")
    return 0


def run(args: argparse.Namespace) -> int:
    # Ended by SIGTERM (a service stopped, `kill`), a conversion removes its .incomplete files as after Ctrl-C.
    with sigterm_interrupts():
        return _convert(args)


def _convert(args: argparse.Namespace) -> int:
    from localchat.converters.checkpoint import locate_checkpoint
    from localchat.converters.lora import is_adapter

    if args.output is not None and not args.output.strip():
        raise InvalidSettingError("-o is empty; give the output path, or leave -o out for the default one")
    source = locate_checkpoint(args.source)
    if is_adapter(source.folder):
        return _adapter_to_gguf(args, source)
    if args.base is not None:
        raise InvalidSettingError(f"--base is for LoRA adapters; {args.source} has no adapter_config.json")
    args.quant = args.quant or DEFAULT_QUANTS[args.to]
    convert, verify = TARGET_STEPS[args.to]
    bar = ProgressBar()
    try:
        output, summary = convert(args, source, bar)
    finally:
        bar.close()
    print(summary)
    if not args.verify:
        return 0
    report = verify(output, source.folder, args.quant)
    print(report.table())
    print(report.summary())
    # A skipped check is reported as such, not failed: the output was written and may be fine.
    return 1 if report.failed else 0
