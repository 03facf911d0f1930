"""Hugging Face checkpoint -> an ONNX model folder for onnxruntime: the checks that the converter can
take the checkpoint, the tokenizer's facts, calibration of the quantization on a shipped text, and
the folder written atomically (`.incomplete`, then renamed): the decoder graph
(converters/onnx_decoder.py) with its weights as quantized by the plan (converters/onnx_quant.py),
the tokenizer files and the marker that tells the runtime what it needs (localchat/onnx_format.py).
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import json
import math
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from onnx import TensorProto

from localchat.converters.checkpoint import Checkpoint, ModelConfig, model_metadata, read_json, wrapper_notice
from localchat.converters.onnx_decoder import (
    ACTIVATIONS,
    ARCHITECTURES,
    DecoderBuild,
    OnnxArchitecture,
    Progress,
    UnsupportedModelError,
    build_graph,
    rope_frequencies,
)
from localchat.converters.onnx_graph import ExternalData, GraphBuilder
from localchat.converters.onnx_quant import QUANT_PLANS, QUANTS, QuantPlan
from localchat.errors import ModelError, UnwritableFolderError
from localchat.onnx_format import DATA_FILE, GRAPH_FILE, ONNX_MARKER, OnnxMetadata, rotary_tables, write_metadata

# MatMulNBits over more stored bytes than this is split by rows (`DecoderBuild.matmul_nbits`):
# Gemma 3 270M's int4 peak RSS, loading and writing 8 tokens, went 646 -> 511 MiB with its 160 MiB head in
# 11 runs of rows rather than one, logits unchanged to the bit. Runs are whole multiples of
# PACK_CHUNK_ROWS rows, so they start on a page of the data file whatever a row's size.
PACK_CHUNK_BYTES = 16 * 2**20
PACK_CHUNK_ROWS = 4096
# The runtime caps its context to this many positions (or the checkpoint's own context, if less).
MAX_POSITIONS = 32768
# Files copied next to the graph when the checkpoint has them.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
    "chat_template.json",
    "generation_config.json",
    "tokenizer.model",
)
CALIBRATION_ASSET = "calibration_text.txt"
# Calibration tokens (the shipped text has about 1.7k in Gemma's vocabulary), run through the
# 8-bit model this many at a time with the KV cache between.
CALIBRATION_TOKENS = 4096
CALIBRATION_CHUNK = 512
# Turn-ending tokens that models emit instead of their EOS token.
KNOWN_EOG_TOKENS = ("<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|end|>", "<|endoftext|>", "<|eom_id|>")


# -- what the converter takes ------------------------------------------------------


def architecture_for(config: ModelConfig) -> OnnxArchitecture:
    """The checkpoint's entry in the architecture table; UnsupportedModelError for a checkpoint
    the decoder graph cannot express."""
    try:
        arch = ARCHITECTURES[config.architecture]
    except KeyError:
        supported = ", ".join(sorted(ARCHITECTURES))
        raise UnsupportedModelError(f"cannot convert architecture {config.architecture} to ONNX; supported: {supported}") from None
    if config.raw.get("use_bidirectional_attention"):
        raise UnsupportedModelError("this checkpoint uses bidirectional attention (an embedding model); convert a causal LM")
    if config.raw.get("mlp_bias"):
        raise UnsupportedModelError("this checkpoint's MLP has biases (mlp_bias), which the ONNX graph lacks; convert it --to gguf")
    activation = config.raw.get("hidden_activation") or config.raw.get("hidden_act") or "silu"
    if activation not in ACTIVATIONS:
        raise UnsupportedModelError(f"activation '{activation}' is not supported; supported: {', '.join(ACTIVATIONS)}")
    return arch


# -- tokenizer facts ----------------------------------------------------------------


def _first_id(value: object) -> int | None:
    if isinstance(value, list):
        return int(value[0]) if value else None
    return int(value) if isinstance(value, int) else None


def _all_ids(value: object) -> list[int]:
    if isinstance(value, list):
        return [int(v) for v in value]
    return [int(value)] if isinstance(value, int) else []


@dataclass(frozen=True)
class TokenizerFacts:
    """What the marker says of the tokenizer (OnnxMetadata's fields of the same names)."""

    bos_id: int | None
    eos_id: int | None
    eog_ids: list[int]
    add_bos: bool
    chat_template: str | None


def tokenizer_facts(checkpoint: Checkpoint) -> TokenizerFacts:
    """BOS/EOS/end-of-generation ids, whether to add BOS, and the chat template."""
    from tokenizers import Tokenizer

    folder = checkpoint.folder
    if not (folder / "tokenizer.json").is_file():
        raise ModelError(f"{folder} has no tokenizer.json; the ONNX runtime needs the fast tokenizer file")
    checkpoint.json_file("tokenizer.json")  # not JSON: a ModelError naming the file
    try:
        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    except Exception as error:  # noqa: BLE001 - the tokenizers library raises plain Exception for a file it cannot use
        raise ModelError(f"{folder / 'tokenizer.json'} is not a tokenizer the tokenizers library can load ({error}); download it again") from None
    config = checkpoint.config.raw
    generation = checkpoint.json_file("generation_config.json") or {}
    tok_config = checkpoint.json_file("tokenizer_config.json") or {}

    def token_id(entry: object) -> int | None:
        text = entry.get("content") if isinstance(entry, dict) else entry
        return tokenizer.token_to_id(text) if isinstance(text, str) else None

    bos = _first_id(config.get("bos_token_id")) if config.get("bos_token_id") is not None else token_id(tok_config.get("bos_token"))
    eos = _first_id(config.get("eos_token_id")) if config.get("eos_token_id") is not None else token_id(tok_config.get("eos_token"))
    eog = set(_all_ids(config.get("eos_token_id"))) | set(_all_ids(generation.get("eos_token_id")))
    if eos is not None:
        eog.add(eos)
    for text in KNOWN_EOG_TOKENS:
        if (token := tokenizer.token_to_id(text)) is not None:
            eog.add(token)
    # Whether the tokenizer's own post-processor puts BOS first is what transformers does.
    probe = tokenizer.encode("a", add_special_tokens=True).ids
    add_bos = bool(tok_config.get("add_bos_token", bos is not None and bool(probe) and probe[0] == bos))
    template = tok_config.get("chat_template")
    if (folder / "chat_template.jinja").is_file():
        template = (folder / "chat_template.jinja").read_text(encoding="utf-8")
    elif chat_json := checkpoint.json_file("chat_template.json"):
        template = chat_json.get("chat_template")
    if isinstance(template, list):  # named templates: take the default one
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    return TokenizerFacts(bos, eos, sorted(eog), add_bos, template)


# -- calibration --------------------------------------------------------------------


def calibration_tokens(checkpoint: Checkpoint, facts: TokenizerFacts) -> list[int]:
    """The shipped calibration text (prose in a dozen languages, chat turns, code, numbers; not
    the verification or benchmark text) in the checkpoint's tokens, BOS first if it uses one."""
    from tokenizers import Tokenizer

    text = importlib.resources.files("localchat.assets").joinpath(CALIBRATION_ASSET).read_text(encoding="utf-8")
    ids = Tokenizer.from_file(str(checkpoint.folder / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    return ([facts.bos_id] if facts.add_bos and facts.bos_id is not None else []) + ids[:CALIBRATION_TOKENS]


def activation_statistics(checkpoint: Checkpoint, arch: OnnxArchitecture, plan: QuantPlan, tokens: list[int],
                          folder: Path, progress: Progress) -> dict[str, np.ndarray]:
    """What `DecoderBuild.activations` holds, measured by running `tokens` through the model at 8 bits
    (the statistics barely differ from fp32's, and the graph is a quarter of the size), built in
    `folder` with the statistics as extra outputs."""
    import onnx
    import onnxruntime as ort

    folder.mkdir()
    data = ExternalData(folder / DATA_FILE)
    build = DecoderBuild(checkpoint, arch, QUANT_PLANS["int8"], GraphBuilder(data), progress, PACK_CHUNK_BYTES, PACK_CHUNK_ROWS,
                         calibrating_for=plan)
    g = build.graph
    try:
        build_graph(build)
        sources = list(build.probes)
        for i, source in enumerate(sources):
            width, full = build.probes[source]
            if full:
                rows = g.op1("Reshape", [source, g.constant("calibration_rows", [-1, width])], f"calibration.{i}/rows")
                columns = g.op1("Transpose", [rows], f"calibration.{i}/transpose", perm=[1, 0])
                total = g.op1("MatMul", [columns, rows], f"calibration.{i}")
            else:
                total = g.op1("ReduceSumSquare", [source, g.constant("calibration_axes", [0, 1])], f"calibration.{i}", keepdims=0)
            g.add_output(total, f"calibration.{i}", TensorProto.FLOAT, [width, width] if full else [width])
    finally:
        data.close()
    onnx.save_model(g.model("calibration"), str(folder / GRAPH_FILE))
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(folder / GRAPH_FILE), options, providers=["CPUExecutionProvider"])
    config = checkpoint.config
    outputs = [f"calibration.{i}" for i in range(len(sources))]
    kv_names = [f"{i}.{kind}" for i in range(config.n_layers) for kind in ("key", "value")]
    kv = [np.zeros((1, config.n_kv_heads, len(tokens), config.head_dim), dtype=np.float32) for _ in kv_names]
    sums = [np.zeros((width, width) if full else width) for width, full in build.probes.values()]
    tables = rotary_tables(rope_frequencies(config), len(tokens), np.float32)
    for start in range(0, len(tokens), CALIBRATION_CHUNK):
        part = np.asarray(tokens[start : start + CALIBRATION_CHUNK], dtype=np.int64)[None, :]
        end = start + part.shape[1]
        feeds = {
            "input_ids": part,
            "seqlens_k": np.array([end - 1], dtype=np.int32),
            "total_sequence_length": np.array(end, dtype=np.int32),
            "logits_count": np.array([1], dtype=np.int64),
            **{f"past_key_values.{name}": value for name, value in zip(kv_names, kv)},
            **tables,
        }
        results = session.run(outputs + [f"present.{name}" for name in kv_names], feeds)
        for total, value in zip(sums, results):
            total += value
        kv = results[len(outputs) :]
    del session
    return {source: (total / len(tokens)).astype(np.float32) for source, total in zip(sources, sums)}


# -- conversion ---------------------------------------------------------------------


@dataclass(frozen=True)
class ConversionResult:
    output: Path
    seconds: float
    n_bytes: int
    operators: dict[str, int]
    notice: str | None = None  # what was not converted (an image-reading model's vision part)


def _quiet(done: int, total: int, what: str) -> None:
    del done, total, what


def _half(progress: Progress, which: int, label: str = "") -> Progress:
    """Progress of one of two passes over the weights, as half of the whole."""

    def report(done: int, total: int, what: str) -> None:
        progress(which * total + done, 2 * total, label + what)

    return report


def _copy_config(checkpoint: Checkpoint, folder: Path) -> None:
    """The checkpoint's config.json into `folder`; an FP8 checkpoint's without its quantization_config, since its
    weights are written dequantized and loaders of the folder (transformers, onnxruntime-genai's tools) would take them for FP8."""
    source = checkpoint.folder / "config.json"
    if checkpoint.config.fp8_scaling is None:
        shutil.copy2(source, folder / "config.json")
        return
    config = read_json(source)
    config.pop("quantization_config", None)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")


def convert_to_onnx(source: Path, output: Path, quant: str = "fp32", *, progress: Progress = _quiet, overwrite: bool = False) -> ConversionResult:
    """Convert the checkpoint folder `source` into the ONNX model folder `output`, atomically:
    everything is written to `output.incomplete` and renamed when complete."""
    if quant not in QUANT_PLANS:
        raise ModelError(f"unknown quantization '{quant}'; choose one of: {', '.join(QUANTS)}")
    if output.exists() and not overwrite:
        raise ModelError(f"{output} already exists; remove it or choose another output folder (-o)")
    if output.exists() and not (output / ONNX_MARKER).is_file():
        # --force replaces an earlier conversion, never an unrelated file or folder.
        raise ModelError(f"{output} exists and is not an ONNX model made by localchat; choose another output folder (-o)")
    started = time.perf_counter()
    checkpoint = Checkpoint(source, accept=architecture_for)
    partial = output.with_name(output.name + ".incomplete")
    try:
        config = checkpoint.config
        arch = architecture_for(config)
        shutil.rmtree(partial, ignore_errors=True)
        try:
            partial.mkdir(parents=True)
        except OSError as error:
            raise UnwritableFolderError(output.parent, error) from None
        facts = tokenizer_facts(checkpoint)
        plan = QUANT_PLANS[quant]
        activations: dict[str, np.ndarray] = {}
        if plan.calibrate:
            tokens = calibration_tokens(checkpoint, facts)
            calibration = partial / "calibration"
            activations = activation_statistics(checkpoint, arch, plan, tokens, calibration, _half(progress, 0, "calibration: "))
            shutil.rmtree(calibration)
        data = ExternalData(partial / DATA_FILE)
        graph = GraphBuilder(data)
        build = DecoderBuild(checkpoint, arch, plan, graph, _half(progress, 1) if plan.calibrate else progress, PACK_CHUNK_BYTES,
                             PACK_CHUNK_ROWS, activations=activations)
        try:
            build_graph(build)
        finally:
            data.close()
        import onnx

        onnx.save_model(graph.model(f"localchat-{arch.name}"), str(partial / GRAPH_FILE))
        for name in TOKENIZER_FILES:
            if (source / name).is_file():
                shutil.copy2(source / name, partial / name)
        _copy_config(checkpoint, partial)
        operators = graph.operator_counts()
        kv_dtype = np.dtype(plan.compute)
        kv_bytes_per_token = config.n_layers * 2 * config.n_kv_heads * config.head_dim * kv_dtype.itemsize
        metadata = model_metadata(checkpoint, sum(math.prod(tensor.shape) for tensor in checkpoint.tensors.values()))
        meta = OnnxMetadata(
            graph=GRAPH_FILE,
            name=metadata.name,
            finetune=metadata.finetune,
            architecture=arch.name,
            source_architecture=config.architecture,
            quant=quant,
            n_layers=config.n_layers,
            n_heads=config.n_heads,
            n_kv_heads=config.n_kv_heads,
            head_dim=config.head_dim,
            hidden_size=config.hidden_size,
            n_vocab=config.vocab_size,
            n_ctx_train=config.context_length,
            max_positions=min(config.context_length or MAX_POSITIONS, MAX_POSITIONS),
            rope_frequencies=rope_frequencies(config),
            kv_dtype=kv_dtype.name,
            kv_bytes_per_token=kv_bytes_per_token,
            layer_bytes=int(np.mean(build.layer_bytes)) if build.layer_bytes else 0,
            other_bytes=int(data.n_bytes - sum(build.layer_bytes)),
            weight_bytes=int(data.n_bytes),
            operators=operators,
            weight_formats={name: str(stored) for name, stored in build.formats.items()},
            **dataclasses.asdict(facts),
        )
        write_metadata(partial, meta)
        if output.exists():
            shutil.rmtree(output)
        os.replace(partial, output)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    finally:
        checkpoint.close()
    return ConversionResult(output, time.perf_counter() - started, data.n_bytes, operators, wrapper_notice(config))


# The GGUF type whose agreement floors `--verify` applies to each ONNX precision.
EQUIVALENT_GGUF_TYPE = {"fp32": "f32", "fp16": "f16", "int8": "q8_0", "int4": "q4_k_m"}


def verify_onnx(folder: Path, checkpoint: Path, quant: str):  # -> converters.verify.VerifyReport
    """`--verify` for an ONNX folder: the GGUF converter's checks, which load any model the engine can."""
    from localchat.converters.verify import verify_gguf

    return verify_gguf(folder, checkpoint, EQUIVALENT_GGUF_TYPE[quant])
