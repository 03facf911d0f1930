"""The ONNX converter against transformers: greedy continuations, agreement and perplexity, and
its handling of bad input."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from checkpoint_fixtures import TINY_ARCHITECTURES
from localchat.converters.checkpoint import Checkpoint
from localchat.converters.onnx_quant import QuantPlan
from localchat.converters.onnx import (
    QUANT_PLANS,
    UnsupportedModelError,
    activation_statistics,
    architecture_for,
    calibration_tokens,
    convert_to_onnx,
    tokenizer_facts,
)
from localchat.converters.verify import ReferenceModel, greedy_continuation, reference_tokenize, verify_text
from localchat.bench import bench_text
from localchat.engine import Engine
from localchat.errors import InferenceError, ModelError
from localchat.models import ONNX_MARKER
from localchat.planner import PlanRequest
from localchat.settings import Settings

GREEDY_TOKENS = 24
SCORED_TOKENS = 256
# Perplexity allowed above fp32's on the benchmark text (1124 tokens with BOS). Most of the loss is
# MatMulNBits' accuracy level 4 (int8 activations: on the verification text int8 +0.31% and int4
# +0.60% at level 0), whose rounding differs between CPU kernels (AMX, AVX-512 VNNI, AVX2), and a
# model's perplexity moves with it as with a new draw of noise. Measured on an AMD EPYC, as
# converted and with every scale jittered by a relative 1e-6 (other draws of that noise): int8
# +0.08-0.49% (3 draws), int4 +2.48-2.85% (3 draws; top-1 agreement 0.90). Another CPU's kernel
# is another draw, and an earlier int4 plan measured 0.7 points apart on the two CPUs: hence 4%
# (a conversion bug moved the tiny models' perplexity by 40-1000%). The first 256 tokens of the
# verification text, which this test scored before, moved too much for a bound: with an earlier
# int4 plan, +2.94, +3.50, +4.45, +3.51 and +3.59%.
PERPLEXITY_MARGIN = {"int8": 0.02, "int4": 0.04}
# Least share of positions whose top-1 token agrees with fp32's (measured the same way: int8
# 95-96%, int4 90%; 91-92% with the plan before).
AGREEMENT_FLOOR = {"int8": 0.92, "int4": 0.86}


def prompt_and_text(checkpoint: Path, bos_id: int | None) -> tuple[list[int], list[int]]:
    """A one-line prompt for greedy decoding and the first SCORED_TOKENS of the verification text."""
    bos = [bos_id] if bos_id is not None else []
    text = verify_text()
    prompt = bos + reference_tokenize(checkpoint, text.splitlines()[0])
    return prompt, (bos + reference_tokenize(checkpoint, text))[:SCORED_TOKENS]


def first_logits(folder: Path, settings: Settings) -> np.ndarray:
    """The logits of the verification text's first 64 tokens, by the model in `folder`."""
    with Engine.load(str(folder), settings, PlanRequest(n_ctx=256)) as engine:
        backend = engine.backend
        tokens = backend.tokenize(verify_text(), add_bos=backend.info.add_bos, special=False)[:64]
        return backend.evaluate_all(0, tokens, 0).copy()


# LLaMA with attention biases: o_proj's was left out of the graph.
@pytest.mark.parametrize("name", [*TINY_ARCHITECTURES, "llama-attention-bias"])
def test_tiny_fp32_greedy_equals_transformers(name: str, onnx_model: Callable[[str, str], Path],
                                             tiny_checkpoint: Callable[[str], Path], settings: Settings) -> None:
    assert_fp32_equals_transformers(onnx_model(name, "fp32"), tiny_checkpoint(name), settings)


def assert_fp32_equals_transformers(folder: Path, checkpoint: Path, settings: Settings) -> None:
    """The fp32 ONNX model in `folder` continues greedily as transformers does on `checkpoint`, and scores alike."""
    reference = ReferenceModel(checkpoint)
    with Engine.load(str(folder), settings, PlanRequest(n_ctx=1024)) as engine:
        backend = engine.backend
        prompt, tokens = prompt_and_text(checkpoint, backend.info.bos_id if backend.info.add_bos else None)
        ours = greedy_continuation(backend, prompt, GREEDY_TOKENS)
        scores = backend.score(0, tokens)
    assert ours == reference.greedy(prompt, GREEDY_TOKENS)
    ref_logprobs, ref_top1 = reference.logprobs_and_top1(tokens)
    assert np.mean(scores.top1 == ref_top1) >= 0.99
    np.testing.assert_allclose(scores.logprobs, ref_logprobs, atol=5e-3)


def test_gemma3_that_reads_images_converts_its_text_model(tiny_checkpoint: Callable[[str], Path], tmp_path: Path,
                                                          settings: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    """Gemma3ForConditionalGeneration (Gemma 3 4B and up): its text model alone, as the GGUF converter takes it,
    with one note that the vision part is left out."""
    from localchat.cli import main

    checkpoint = tiny_checkpoint("gemma3-vision")
    output = tmp_path / "text-onnx"
    capsys.readouterr()
    assert main(["convert", str(checkpoint), "--to", "onnx", "--quant", "fp32", "-o", str(output)]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("localchat:")]
    assert len(notes) == 1 and notes[0].startswith("localchat: note: ") and "only its text model is converted" in notes[0], notes
    meta = json.loads((output / ONNX_MARKER).read_text())
    assert (meta["architecture"], meta["source_architecture"], meta["n_layers"]) == ("gemma3", "Gemma3ForConditionalGeneration", 6)
    assert_fp32_equals_transformers(output, checkpoint, settings)


# transformers 4's config.json keys for sliding-window layers, which list no layer_types: Qwen's switch
# (its upper layers were converted as full-attention ones: --verify top-1 57%, perplexity +69%) and
# Gemma 3's pattern, as on the hub (every layer was: perplexity +48%).
LEGACY_SLIDING_KEYS: dict[str, tuple[dict[str, object], list[str]]] = {
    "qwen2": ({"use_sliding_window": True, "sliding_window": 8, "max_window_layers": 1}, ["full_attention", "sliding_attention"]),
    "gemma3": ({"sliding_window_pattern": 6}, ["sliding_attention"] * 5 + ["full_attention"]),
}


@pytest.mark.parametrize("name", LEGACY_SLIDING_KEYS)
def test_sliding_window_layers_of_a_config_that_lists_no_layer_types(name: str, tiny_checkpoint: Callable[[str], Path],
                                                                      tmp_path: Path, settings: Settings) -> None:
    folder = tmp_path / name
    shutil.copytree(tiny_checkpoint(name), folder)
    config = json.loads((folder / "config.json").read_text())
    del config["layer_types"]
    keys, layer_types = LEGACY_SLIDING_KEYS[name]
    (folder / "config.json").write_text(json.dumps({**config, **keys}))
    assert ReferenceModel(folder).model.config.layer_types == layer_types
    assert_fp32_equals_transformers(convert_to_onnx(folder, tmp_path / "out", "fp32").output, folder, settings)


def test_gemma_fp32_greedy_equals_transformers(onnx_model: Callable[[str, str], Path], gemma_checkpoint: Path,
                                               settings: Settings) -> None:
    reference = ReferenceModel(gemma_checkpoint)
    with Engine.load(str(onnx_model("gemma-270m", "fp32")), settings, PlanRequest(n_ctx=1024)) as engine:
        prompt, _ = prompt_and_text(gemma_checkpoint, engine.backend.info.bos_id)
        ours = greedy_continuation(engine.backend, prompt, GREEDY_TOKENS)
    assert ours == reference.greedy(prompt, GREEDY_TOKENS)


@pytest.mark.parametrize("quant", ["int8", "int4"])
def test_gemma_quantized_perplexity_near_fp32(quant: str, onnx_model: Callable[[str, str], Path], settings: Settings,
                                              record_property: Callable[[str, object], None]) -> None:
    results = {}
    for precision in ("fp32", quant):
        with Engine.load(str(onnx_model("gemma-270m", precision)), settings, PlanRequest(n_ctx=2048)) as engine:
            tokens = engine.backend.tokenize(bench_text(), add_bos=True, special=False)
            results[precision] = engine.backend.score(0, tokens)
    base, ours = results["fp32"], results[quant]
    agreement = float(np.mean(base.top1 == ours.top1))
    record_property(f"{quant}_perplexity", ours.perplexity)
    record_property("fp32_perplexity", base.perplexity)
    record_property(f"{quant}_top1_agreement", agreement)
    print(f"{quant}: perplexity {ours.perplexity:.3f} vs fp32 {base.perplexity:.3f}, top-1 agreement {agreement:.1%}")
    assert ours.perplexity <= base.perplexity * (1 + PERPLEXITY_MARGIN[quant])
    assert agreement >= AGREEMENT_FLOOR[quant]


def test_int4_calibration_measures_what_transformers_computes(tiny_checkpoint: Callable[[str], Path], tmp_path: Path) -> None:
    """The calibration model's statistics of the MLP inputs against transformers' own: second
    moments where the MLP is at 4 bits (layers past the 8-bit edges), mean squares elsewhere."""
    import torch

    source = tiny_checkpoint("gemma3")
    checkpoint = Checkpoint(source)
    tokens = calibration_tokens(checkpoint, tokenizer_facts(checkpoint))[:200]
    plan = QUANT_PLANS["int4"]
    arch = architecture_for(checkpoint.config)
    stats = activation_statistics(checkpoint, arch, plan, tokens, tmp_path / "calibration", lambda done, total, what: None)
    checkpoint.close()
    model = ReferenceModel(source).model
    seen: dict[int, np.ndarray] = {}
    for i, layer in enumerate(model.model.layers):
        layer.mlp.register_forward_pre_hook(lambda _, args, i=i: seen.__setitem__(i, args[0][0].double().numpy()))
    with torch.inference_mode():
        model(torch.tensor([tokens]))
    n_layers = len(seen)
    for i, inputs in seen.items():
        measured = stats[f"layers.{i}.mlp_norm/output_0"]
        four_bit = plan.bits("gate_proj", i, n_layers) == 4
        assert measured.ndim == (2 if four_bit else 1)
        expected = inputs.T @ inputs / len(inputs) if four_bit else np.mean(inputs**2, axis=0)
        # The calibration model is the 8-bit one: close to float, not equal.
        np.testing.assert_allclose(measured, expected, rtol=0.05, atol=0.02 * float(np.abs(expected).max()))
    assert any(plan.bits("gate_proj", i, n_layers) == 4 for i in seen)


@pytest.mark.parametrize("name", ["llama", "qwen2", "gemma3"])
def test_smoothing_folds_exactly(name: str, tiny_checkpoint: Callable[[str], Path], tmp_path: Path, settings: Settings,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """Smoothing on float weights changes no logit: every 1/s is folded where the s went (norms,
    v's rows for o_proj, up's rows for down_proj, the lookup for a tied head). Untied llama, tied
    qwen2 with biases, gemma3 with its sandwich norms; all with two query heads a KV head."""
    monkeypatch.setitem(QUANT_PLANS, "fp32-smoothed", dataclasses.replace(QUANT_PLANS["fp32"], calibrate=True, smooth=0.5))
    source = tiny_checkpoint(name)
    logits = {}
    for quant in ("fp32", "fp32-smoothed"):
        logits[quant] = first_logits(convert_to_onnx(source, tmp_path / quant, quant).output, settings)
    formats = json.loads((tmp_path / "fp32-smoothed" / ONNX_MARKER).read_text())["weight_formats"]
    assert all(fmt.startswith("float32 smoothed") for matrix, fmt in formats.items() if matrix != "embed_tokens"), formats
    np.testing.assert_allclose(logits["fp32-smoothed"], logits["fp32"], rtol=1e-4, atol=1e-4 * float(np.abs(logits["fp32"]).max()))


@pytest.mark.parametrize(("name", "chunk_bytes"), [("llama", 1), ("gemma3", 4 * 2**20)])
def test_matrices_split_in_runs_of_rows_give_the_same_logits(name: str, chunk_bytes: int, tiny_checkpoint: Callable[[str], Path],
                                                            tmp_path: Path, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """With a chunk size smaller than its matrices, the int8 model runs each as several
    MatMulNBits over runs of its rows (untied llama: every linear, in runs of 8 rows; tied gemma3:
    its 16 MiB head, 4 runs of the embedding's rows), and its logits equal the unsplit model's
    to the bit."""
    source = tiny_checkpoint(name)
    logits, counts = {}, {}
    for split in (False, True):
        if split:
            monkeypatch.setattr("localchat.converters.onnx.PACK_CHUNK_BYTES", chunk_bytes)
            monkeypatch.setattr("localchat.converters.onnx.PACK_CHUNK_ROWS", 8)
        folder = convert_to_onnx(source, tmp_path / str(split), "int8").output
        counts[split] = json.loads((folder / ONNX_MARKER).read_text())["operators"]
        logits[split] = first_logits(folder, settings)
    assert counts[True]["MatMulNBits"] >= counts[False]["MatMulNBits"] + 3 and counts[True]["Concat"] > counts[False].get("Concat", 0)
    np.testing.assert_array_equal(logits[True], logits[False])


def test_an_embedding_narrower_than_its_plans_block_converts_and_runs(tiny_checkpoint: Callable[[str], Path], tmp_path: Path,
                                                                     settings: Settings) -> None:
    """The int4 plan quantizes the embedding in blocks of 128; a width they do not divide (the tiny
    llama's 64, SmolLM2's 576) takes the largest that does, since the lookup returns whole blocks."""
    folder = convert_to_onnx(tiny_checkpoint("llama"), tmp_path / "int4", "int4").output
    formats = json.loads((folder / ONNX_MARKER).read_text())["weight_formats"]
    assert formats["embed_tokens"].startswith("int8/64"), formats
    assert np.isfinite(first_logits(folder, settings)).all()


def test_a_graph_onnxruntime_cannot_run_is_one_error(tiny_checkpoint: Callable[[str], Path], tmp_path: Path,
                                                     settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """What onnxruntime refuses while it runs is an InferenceError saying what to do, not its own
    exception: here the int4 embedding as it was converted before its block divided its width."""
    monkeypatch.setattr(QuantPlan, "block", lambda plan, role, bits, k: plan.embedding_block if role == "embedding" else 32)
    folder = convert_to_onnx(tiny_checkpoint("llama"), tmp_path / "int4", "int4").output
    with pytest.raises(InferenceError, match="onnxruntime could not run .*Reshape.*; convert the model again"):
        first_logits(folder, settings)


def test_graph_uses_fused_operators(onnx_model: Callable[[str, str], Path]) -> None:
    meta = json.loads((onnx_model("gemma-270m", "int4") / ONNX_MARKER).read_text())
    operators, layers = meta["operators"], meta["n_layers"]
    assert operators["GroupQueryAttention"] == layers
    assert operators["SkipSimplifiedLayerNormalization"] == 2 * layers
    assert operators["MatMulNBits"] >= 3 * layers + 1  # qkv, o, gate/up, down per layer, and the head
    assert "MatMul" not in operators and "Softmax" not in operators
    assert (onnx_model("gemma-270m", "int4") / "tokenizer.json").is_file()
    assert meta["chat_template"] and 106 in meta["eog_ids"]  # <end_of_turn>


def test_tied_head_reads_the_embeddings_stored_bytes(onnx_model: Callable[[str, str], Path]) -> None:
    """The int4 output head's codes, scales and zero points are views of the embedding's bytes in
    the data file (one copy on disk), under their own names (so onnxruntime maps them apart), in
    runs of rows (so it packs them one run at a time); every initializer is used."""
    import onnx

    folder = onnx_model("gemma-270m", "int4")
    model = onnx.load(str(folder / "model.onnx"), load_external_data=False)
    stored = {tensor.name: {entry.key: entry.value for entry in tensor.external_data} for tensor in model.graph.initializer}
    dims = {tensor.name: list(tensor.dims) for tensor in model.graph.initializer}
    heads = [node for node in model.graph.node if node.op_type == "MatMulNBits" and node.name.startswith("lm_head")]
    n_vocab = dims["embed_tokens.scales"][0]
    assert len(heads) > 4
    assert sum(next(a.i for a in node.attribute if a.name == "N") for node in heads) == n_vocab
    for part, index in (("qweight", 1), ("scales", 2), ("zero_points", 3)):
        table = stored[f"embed_tokens.{part}"]
        offset = int(table["offset"])
        for node in heads:  # consecutive runs of rows, from the table's first byte to its last
            run = stored[node.input[index]]
            assert int(run["offset"]) == offset, (part, node.name)
            offset += int(run["length"])
        assert offset == int(table["offset"]) + int(table["length"]), part
    used = {name for node in model.graph.node for name in node.input}
    assert set(stored) <= used


def test_int4_blocks_follow_each_matrix(onnx_model: Callable[[str, str], Path]) -> None:
    """Gemma 3 270M at int4: 8-bit matrices in blocks of 256 where their input width allows
    (o_proj's 1024, down_proj's 2048), else of 128 (qkv's and the head's 640); 4-bit ones of 32."""
    import onnx

    model = onnx.load(str(onnx_model("gemma-270m", "int4") / "model.onnx"), load_external_data=False)
    found: dict[tuple[str, int, int], set[int]] = {}
    for node in model.graph.node:
        if node.op_type == "MatMulNBits":
            attrs = {a.name: a.i for a in node.attribute}
            role = node.name.split("/")[0].rsplit(".", 1)[-1]
            found.setdefault((role, attrs["bits"], attrs["K"]), set()).add(attrs["block_size"])
    assert found == {
        ("qkv_proj", 8, 640): {128}, ("o_proj", 8, 1024): {256}, ("gate_up_proj", 4, 640): {32},
        ("gate_up_proj", 8, 640): {128}, ("down_proj", 8, 2048): {256}, ("lm_head", 8, 640): {128},
    }


def linked_with_config(checkpoint: Path, source: Path, **changes: object) -> Path:
    """`checkpoint`'s files linked into `source`, its config.json with `changes`."""
    source.mkdir()
    for item in checkpoint.iterdir():
        if item.name != "config.json":
            (source / item.name).symlink_to(item)
    config = json.loads((checkpoint / "config.json").read_text())
    (source / "config.json").write_text(json.dumps({**config, **changes}))
    return source


def test_unsupported_architecture_is_one_clear_error(tiny_checkpoint: Callable[[str], Path], tmp_path: Path) -> None:
    source = linked_with_config(tiny_checkpoint("llama"), tmp_path / "odd", architectures=["FalconForCausalLM"])
    with pytest.raises(UnsupportedModelError, match="supported: .*LlamaForCausalLM"):
        convert_to_onnx(source, tmp_path / "out", "fp32")
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.incomplete").exists()


def test_mlp_biases_are_refused_not_left_out(tiny_checkpoint: Callable[[str], Path], tmp_path: Path) -> None:
    source = linked_with_config(tiny_checkpoint("llama"), tmp_path / "mlp-bias", mlp_bias=True)
    with pytest.raises(UnsupportedModelError, match="mlp_bias.*--to gguf"):
        convert_to_onnx(source, tmp_path / "out", "fp32")
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.incomplete").exists()


def test_missing_tokenizer_leaves_no_output(tiny_checkpoint: Callable[[str], Path], tmp_path: Path) -> None:
    source = tmp_path / "no-tokenizer"
    source.mkdir()
    for item in tiny_checkpoint("qwen2").iterdir():
        if item.name != "tokenizer.json":
            (source / item.name).symlink_to(item)
    with pytest.raises(ModelError, match="tokenizer.json"):
        convert_to_onnx(source, tmp_path / "out", "int4")
    assert list(tmp_path.iterdir()) == [source]


def test_existing_output_is_kept_unless_overwritten(onnx_model: Callable[[str, str], Path],
                                                    tiny_checkpoint: Callable[[str], Path], tmp_path: Path) -> None:
    output = tmp_path / "out"
    output.mkdir()
    (output / "keep.txt").write_text("mine")
    with pytest.raises(ModelError, match="already exists"):
        convert_to_onnx(tiny_checkpoint("llama"), output, "int8")
    assert (output / "keep.txt").read_text() == "mine"
    # --force replaces only an earlier conversion, never an unrelated folder or file.
    with pytest.raises(ModelError, match="not an ONNX model made by localchat"):
        convert_to_onnx(tiny_checkpoint("llama"), output, "int8", overwrite=True)
    assert (output / "keep.txt").read_text() == "mine"
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    with pytest.raises(ModelError, match="not an ONNX model made by localchat"):
        convert_to_onnx(tiny_checkpoint("llama"), a_file, "int8", overwrite=True)
    earlier = tmp_path / "earlier"
    convert_to_onnx(tiny_checkpoint("llama"), earlier, "int8")
    convert_to_onnx(tiny_checkpoint("llama"), earlier, "int4", overwrite=True)
    assert json.loads((earlier / ONNX_MARKER).read_text())["quant"] == "int4"
    assert not earlier.with_name("earlier.incomplete").exists()


def test_bad_quant_names_the_choices(tiny_checkpoint: Callable[[str], Path], tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="fp32, fp16, int8, int4"):
        convert_to_onnx(tiny_checkpoint("llama"), tmp_path / "out", "q4_k_m")


def test_cli_converts_to_onnx(tiny_checkpoint: Callable[[str], Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from localchat.cli import main

    output = tmp_path / "cli-out"
    assert main(["convert", str(tiny_checkpoint("qwen2")), "--to", "onnx", "--quant", "int8", "-o", str(output)]) == 0
    assert "GroupQueryAttention" in capsys.readouterr().out
    assert json.loads((output / ONNX_MARKER).read_text())["quant"] == "int8"
    assert main(["convert", str(tiny_checkpoint("qwen2")), "--to", "onnx", "--quant", "q4_k_m", "-o", str(output)]) == 1
    assert "is a GGUF type" in capsys.readouterr().err
