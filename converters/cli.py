"""`localchat convert`: parse, call the converter, print. Wired into localchat/cli.py."""

from __future__ import annotations

import argparse
import sys

from converters.gguf import DEFAULT_QUANT, QUANT_TYPES, convert_checkpoint, default_output_path
from converters.checkpoint import locate_checkpoint

TARGETS = ("gguf", "onnx")
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
    parser = subparsers.add_parser("convert", help="convert a Hugging Face checkpoint to GGUF")
    parser.add_argument("source", metavar="SRC", help="a checkpoint folder or a Hugging Face repo id")
    parser.add_argument("--to", choices=TARGETS, required=True, help="the output format")
    parser.add_argument("--quant", choices=(*QUANT_TYPES, *ONNX_QUANTS),
                        help=f"gguf: {', '.join(QUANT_TYPES)} (default {DEFAULT_QUANT}); onnx: {', '.join(ONNX_QUANTS)} (default int4)")
    parser.add_argument("-o", "--output", help="the output file (default: SRC-QUANT.gguf beside a folder, or in the current folder for a repo id)")
    parser.add_argument("--verify", action="store_true", help="load the result in llama.cpp and compare it with the checkpoint")
    parser.add_argument("--force", action="store_true", help="overwrite the output file if it exists")
    parser.add_argument("--threads", type=int, help="threads for reading and quantizing (default: all cores)")
    parser.set_defaults(handler=run)
    return parser


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    source = locate_checkpoint(args.source)
    args.quant = args.quant or DEFAULT_QUANTS[args.to]
    if args.to == "onnx":
        return _run_onnx(args, source)
    output = Path(args.output).expanduser() if args.output else default_output_path(source.name, args.quant, source.directory)
    bar = ProgressBar()
    try:
        result = convert_checkpoint(source.folder, output, args.quant, force=args.force, threads=args.threads, progress=bar)
    finally:
        bar.close()
    print(f"wrote {result.output} ({result.n_bytes / 2**20:.1f} MiB, {result.n_tensors} tensors, {result.seconds:.1f} s)")
    if not args.verify:
        return 0
    from converters.verify import verify_gguf

    report = verify_gguf(result.output, source.folder, args.quant)
    print(report.table())
    return 0 if report.passed else 1


def _run_onnx(args: argparse.Namespace, source) -> int:
    from pathlib import Path

    from converters.onnx import convert_to_onnx
    from localchat.errors import InvalidSettingError

    if args.quant not in ONNX_QUANTS:
        raise InvalidSettingError(f"--quant {args.quant} is a GGUF type; for --to onnx choose one of: {', '.join(ONNX_QUANTS)}")
    output = Path(args.output).expanduser() if args.output else source.directory / f"{source.name}-{args.quant}-onnx"
    bar = ProgressBar()
    try:
        result = convert_to_onnx(source.folder, output, args.quant, progress=bar, overwrite=args.force)
    finally:
        bar.close()
    fused = ", ".join(f"{name} {count}" for name, count in result.operators.items())
    print(f"wrote {result.output} ({result.n_bytes / 2**20:.1f} MiB of weights, {result.seconds:.1f} s; operators: {fused})")
    if not args.verify:
        return 0
    from converters.onnx import verify_onnx

    report = verify_onnx(result.output, source.folder, args.quant)
    print(report.table())
    return 0 if report.passed else 1
