"""Gemma 4's dense text models: tiny random checkpoints of E2B's kind (Gemma4ForCausalLM: per-layer inputs,
shared keys and values, double-wide MLPs) and 31B's (Gemma4ForConditionalGeneration: values from keys, one
global key/value head, a vision tower left out), converted, run by the real llama.cpp and compared with transformers."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, TokenType

from checkpoint_fixtures import GEMMA4_MARKERS
from greedy_reference import assert_conversion_refused, converted_runs_like_transformers, load, logprob_distance
from localchat.converters.gguf import convert_checkpoint

GEMMA4 = ("gemma4", "gemma4-vision")


def _field(reader: GGUFReader, key: str) -> object:
    return reader.fields[key].contents()


@pytest.mark.parametrize("quant", ["f32", "f16"])
@pytest.mark.parametrize("name", GEMMA4)
def test_gemma4_greedy_and_logprobs_equal_transformers(name: str, quant: str, tiny_checkpoint: Callable[[str], Path], tmp_path: Path) -> None:
    """Its quantized kinds answer as the other families' (test_more_families.py)."""
    reference, scores = converted_runs_like_transformers(tiny_checkpoint(name), tmp_path / f"{name}.gguf", quant)
    # Per token, not only on average: every layer kind (shared, global, sliding past its window) is in the text.
    assert logprob_distance(np.asarray(scores.logprobs), reference.logprobs) < 0.01


# The keys llama.cpp's converter writes for these checkpoints (conversion/gemma.py, Gemma4Model), and the
# gemma4 graph reads (src/models/gemma4.cpp): head sizes and RoPE per attention type, per-layer lists.
GEMMA4_KEYS: dict[str, dict[str, object]] = {
    "gemma4": {
        "gemma4.block_count": 5, "gemma4.attention.sliding_window_pattern": [True, True, False, True, False],
        "gemma4.attention.key_length": 32, "gemma4.attention.value_length": 32, "gemma4.attention.key_length_swa": 16,
        "gemma4.attention.value_length_swa": 16, "gemma4.rope.dimension_count": 32, "gemma4.rope.dimension_count_swa": 16,
        "gemma4.rope.freq_base": 1_000_000.0, "gemma4.rope.freq_base_swa": 10_000.0, "gemma4.attention.sliding_window": 8,
        "gemma4.feed_forward_length": [128, 128, 128, 256, 256], "gemma4.attention.head_count_kv": 2,
        "gemma4.attention.shared_kv_layers": 2, "gemma4.embedding_length_per_layer_input": 8, "gemma4.final_logit_softcapping": 30.0,
    },
    "gemma4-vision": {
        "gemma4.block_count": 4, "gemma4.attention.sliding_window_pattern": [True, True, True, False],
        "gemma4.attention.head_count_kv": [2, 2, 2, 1], "gemma4.feed_forward_length": 128, "gemma4.attention.shared_kv_layers": 0,
        "gemma4.embedding_length_per_layer_input": 0, "gemma4.final_logit_softcapping": 0.0,
    },
}
# Tensors a layer must not have: the shared layers' keys and values, the values of a global layer that takes its keys.
ABSENT = {"gemma4": ("blk.3.attn_k.weight", "blk.3.attn_v.weight", "blk.3.attn_k_norm.weight", "blk.4.attn_k.weight", "output.weight"),
          "gemma4-vision": ("blk.3.attn_v.weight", "output.weight")}


@pytest.mark.parametrize("name", GEMMA4)
def test_gemma4_gguf_has_llama_cpp_keys_and_tensors(name: str, tiny_checkpoint: Callable[[str], Path], tmp_path: Path) -> None:
    output = convert_checkpoint(tiny_checkpoint(name), tmp_path / f"{name}.gguf", "f16", threads=2).output
    reader = GGUFReader(output)
    assert _field(reader, "general.architecture") == "gemma4"
    for key, value in GEMMA4_KEYS[name].items():
        assert _field(reader, key) == pytest.approx(value), key
    tensors = {tensor.name: tensor for tensor in reader.tensors}
    assert not set(ABSENT[name]) & set(tensors)
    assert all(name.startswith(("blk.", "token_embd.", "output_norm.", "rope_freqs.", "per_layer_")) for name in tensors), sorted(tensors)
    # Proportional RoPE: a quarter of the global heads' 16 pairs turn, the others stand still.
    assert tensors["rope_freqs.weight"].data.tolist() == np.array([1.0] * 4 + [1e30] * 12, dtype=np.float32).tolist()
    assert {f"blk.{i}.layer_output_scale.weight" for i in range(_field(reader, "gemma4.block_count"))} <= set(tensors)
    if name == "gemma4":
        assert {"per_layer_token_embd.weight", "per_layer_model_proj.weight", "per_layer_proj_norm.weight",
                "blk.4.inp_gate.weight", "blk.4.proj.weight", "blk.4.post_norm.weight"} <= set(tensors)
        assert tuple(tensors["per_layer_token_embd.weight"].shape) == (5 * 8, 262144)
        assert tuple(tensors["blk.4.ffn_up.weight"].shape) == (64, 256)  # double-wide
    # The tokenizer as llama.cpp's gemma4 BPE: merges, the chat markers always rendered.
    assert _field(reader, "tokenizer.ggml.model") == "gemma4" and len(_field(reader, "tokenizer.ggml.merges")) > 500_000
    tokens, types = _field(reader, "tokenizer.ggml.tokens"), _field(reader, "tokenizer.ggml.token_type")
    kinds = {token: types[i] for i, token in enumerate(tokens) if token in (*GEMMA4_MARKERS.values(), "<bos>", "<eos>")}
    assert kinds == {**dict.fromkeys(GEMMA4_MARKERS.values(), TokenType.USER_DEFINED), "<bos>": TokenType.CONTROL, "<eos>": TokenType.CONTROL}


def test_gemma4_chat_markers_are_one_token_and_rendered(tiny_checkpoint: Callable[[str], Path], tmp_path: Path) -> None:
    """llama.cpp finds the USER_DEFINED markers in plain text and prints them, so that a reply's reasoning and tool calls can be read."""
    output = convert_checkpoint(tiny_checkpoint("gemma4"), tmp_path / "gemma4.gguf", "q8_0", threads=2).output
    with load(output) as engine:
        backend = engine.backend
        for marker in GEMMA4_MARKERS.values():
            [token] = backend.tokenize(marker, add_bos=False, special=False)
            assert backend.token_text(token) == marker
        # Spaces are SentencePiece's: the text comes back as it went in.
        words = backend.tokenize("  two spaces\nand a line", add_bos=False, special=False)
        assert "".join(backend.token_text(token) for token in words) == "  two spaces\nand a line"


def test_gemma4_hub_config_layout_converts_alike(tiny_checkpoint: Callable[[str], Path], tmp_path: Path) -> None:
    """Google's config.json gives global_head_dim (and 31B num_global_key_value_heads) where transformers 5.23 saves
    per_layer_config: both give the same GGUF keys."""
    saved = tiny_checkpoint("gemma4-vision")
    hub = tmp_path / "hub"
    shutil.copytree(saved, hub)
    config = json.loads((hub / "config.json").read_text())
    text = config["text_config"]
    assert text.pop("per_layer_config") == {"3": {"head_dim": 32, "num_key_value_heads": 1}}
    text.update(global_head_dim=32, num_global_key_value_heads=1)
    (hub / "config.json").write_text(json.dumps(config))
    keys = []
    for source in (saved, hub):
        reader = GGUFReader(convert_checkpoint(source, tmp_path / f"{source.name}.gguf", "f16", threads=2).output)
        keys.append({key: field.contents() for key, field in reader.fields.items() if key.startswith("gemma4.")})
    assert keys[0] == keys[1] and keys[0]["gemma4.attention.head_count_kv"] == [2, 2, 2, 1]


def test_gemma4_info_and_run_on_the_converted_file(tiny_checkpoint: Callable[[str], Path], tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from localchat.cli import main

    output = tmp_path / "gemma4.gguf"
    assert main(["convert", str(tiny_checkpoint("gemma4-vision")), "--to", "gguf", "--quant", "q8_0", "--threads", "2", "-o", str(output)]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("localchat: note: ")]
    assert len(notes) == 1 and "only its text model is converted" in notes[0] and "audio towers" in notes[0], notes
    assert main(["info", "-m", str(output)]) == 0
    info = capsys.readouterr().out
    assert "gemma4" in info
    assert main(["run", "-m", str(output), "-n", "5", "--raw", "hello"]) == 0
    assert capsys.readouterr().out.strip()


# Checkpoints llama.cpp's gemma4 graph would run differently from transformers: refused in one line naming why.
REFUSED: dict[str, tuple[Callable[[dict], None], str]] = {
    "a mixture of experts": (lambda c: c.update(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=64),
                             "enable_moe_block=True; llama.cpp's gemma4 graph implements only enable_moe_block=False"),
    "attention both ways (an embedding model)": (lambda c: c.update(use_bidirectional_attention="all"), "attends both ways"),
    "shared keys and values from other layers than llama.cpp's": (lambda c: c.update(num_kv_shared_layers=3), "share keys and values"),
    # transformers would turn the last layer into a global one: the config.json says other than what runs.
    "a sliding-window last layer": (lambda c: c.update(layer_types=["sliding_attention", "sliding_attention", "full_attention", "full_attention",
                                                                    "sliding_attention"], per_layer_config={"2": {"head_dim": 32}, "3": {"head_dim": 32}}),
                                    "ending with a full one"),
    "another activation": (lambda c: c.update(hidden_activation="gelu"), "hidden_activation='gelu'"),
    "fewer per-layer embeddings than tokens": (lambda c: c.update(vocab_size_per_layer_input=1024), "per-layer embeddings have 1024 rows"),
    "a per-layer override of the MLP": (lambda c: c["per_layer_config"].update({"0": {"intermediate_size": 64}}), "overrides intermediate_size"),
    "scaled sliding-window RoPE": (lambda c: c["rope_parameters"].update(sliding_attention={"rope_type": "linear", "factor": 2.0, "rope_theta": 10_000.0}),
                                   "scales its sliding-window RoPE"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_gemma4_checkpoint_llama_cpp_would_run_differently_is_refused(case: str, tiny_checkpoint: Callable[[str], Path], tmp_path: Path) -> None:
    assert_conversion_refused(tiny_checkpoint("gemma4"), *REFUSED[case], tmp_path)


# A config.json in the shape Google ships Gemma 4 E2B: global_head_dim instead of per_layer_config, the text
# model's settings nested, the rest left to transformers' defaults (its RoPE among them).
E2B_CONFIG = {
    "architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4", "eos_token_id": [1, 106],
    "text_config": {"model_type": "gemma4_text", "hidden_size": 1536, "intermediate_size": 6144, "num_hidden_layers": 35,
                    "num_attention_heads": 8, "num_key_value_heads": 1, "head_dim": 256, "global_head_dim": 512,
                    "hidden_size_per_layer_input": 256, "num_kv_shared_layers": 20, "use_double_wide_mlp": True,
                    "sliding_window": 512, "final_logit_softcapping": 30.0,
                    "layer_types": (["sliding_attention"] * 4 + ["full_attention"]) * 7},
}


def test_gemma4_e2b_config_reads_per_layer_sizes() -> None:
    from localchat.converters.architectures import architecture_for
    from localchat.converters.checkpoint import ModelConfig

    config = ModelConfig.from_dict(json.loads(json.dumps(E2B_CONFIG)), Path("config.json"))
    assert architecture_for(config).gguf_name == "gemma4"
    assert [config.head_dim_of(i) for i in (0, 3, 4, 34)] == [256, 256, 512, 512] and config.global_head_dim == 512
    assert [config.intermediate_size_of(i) for i in (0, 14, 15, 34)] == [6144, 6144, 12288, 12288]
    assert (config.kv_shared_layers, config.per_layer_input_size, config.has_kv(14), config.has_kv(15)) == (20, 256, True, False)
    assert (config.rope.scaling_type, config.rope.theta, config.rope_dimensions) == ("proportional", 1_000_000.0, 512)
    assert config.rope_local is not None and config.rope_local.theta == 10_000.0
