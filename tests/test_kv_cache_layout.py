"""The KV cache the planner counts per token against what llama.cpp keeps: the real models, tiny
random models of a hybrid (Qwen 3.5) and an MLA model (DeepSeek V3), and headers shaped like others."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from checkpoint_fixtures import TINY_SLIDING_WINDOW
from kv_layout_models import deepseek2_mla, qwen35_hybrid, write_tiny_model

from localchat.backends.llamacpp import LlamaCppBackend
from localchat.backends.llamacpp_natives import open_model
from localchat.errors import ModelError
from localchat.gguf_file import GgufHeader
from localchat.kv_cache_layout import layers_with_kv
from localchat.model_loading import plan_model
from localchat.models import gguf_facts
from localchat.planner import ModelFacts, PlanRequest, kv_cache_bytes
from localchat.settings import Settings

# llama.cpp's sequence state holds, besides each token's K and V rows, 12 bytes of each cache's cell
# (its position and sequences): 12 for SmolLM2, 24 for Gemma 3's two caches and Qwen 3.5's hybrid.
CELL_BYTES_MOST = 32

TINY_MODELS: dict[str, Callable[[], tuple[dict[str, object], dict[str, tuple[int, ...]]]]] = {
    "qwen35": qwen35_hybrid, "deepseek2": deepseek2_mla,
}


# What else a sequence's saved state holds: llama.cpp's headers (140 bytes for the tiny Qwen 3.5).
STATE_HEADER_BYTES_MOST = 256


def saved_state(model: Path, first: int = 16, last: int = 64) -> tuple[ModelFacts, float, float]:
    """The planner's facts of `model`, how much llama.cpp's saved state of a sequence grows per token
    from `first` tokens to `last`, on the context the plan makes, and what it holds beside its tokens' rows.
    A sliding-window layer's state holds its window's tokens alone, though the cache keeps room for all."""
    model_plan = plan_model(str(model), Settings(prefix_cache_disk_bytes=0), PlanRequest(n_ctx=256, n_threads=2))
    backend = LlamaCppBackend(open_model(model, model_plan.plan.load_params))
    try:
        tokens = list(range(10, 10 + last))
        backend.evaluate(0, tokens[:first], 0)
        before = len(backend.save_state(0))
        backend.evaluate(0, tokens[first:], first)
        growth = (len(backend.save_state(0)) - before) / (last - first)
    finally:
        backend.close()
    return model_plan.facts, growth, before - first * growth


def state_bytes_per_token(model: Path, first: int = 16, last: int = 64) -> tuple[int, float]:
    """The planner's KV bytes per token for `model`, and what llama.cpp keeps per token (`saved_state`)."""
    facts, growth, _ = saved_state(model, first, last)
    return facts.kv_bytes_per_token, growth


@pytest.fixture(scope="module")
def tiny_model(default_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    folder = tmp_path_factory.mktemp("kv-layout")

    def make(architecture: str) -> Path:
        keys, tensors = TINY_MODELS[architecture]()
        return write_tiny_model(architecture, keys, tensors, default_model, folder / f"{architecture}.gguf")

    return make


def test_the_real_models_keep_what_the_planner_counts(default_model: Path, gemma_model: Path) -> None:
    for model in (default_model, gemma_model):
        counted, kept = state_bytes_per_token(model)
        assert counted <= kept <= counted + CELL_BYTES_MOST, model.name


def test_a_hybrid_keeps_kv_in_its_attention_layers_alone(tiny_model: Callable[[str], Path]) -> None:
    """Qwen 3.5 attends every 4th layer: its other layers keep a recurrent state of a fixed size."""
    counted, kept = state_bytes_per_token(tiny_model("qwen35"))
    assert counted == 1 * 2 * (16 + 16) * 2  # one layer of 4, 2 KV heads, K and V of 16, f16
    assert counted <= kept <= counted + CELL_BYTES_MOST


def test_a_hybrids_recurrent_state_is_counted_once_a_sequence(tiny_model: Callable[[str], Path]) -> None:
    """Its 3 gated delta-net layers keep 3 rows of convolution inputs (64 + 2 x 2 x 16 wide) and a 16 x 64
    state each, in f32, however long the sequence; a server's 4 sequences keep 4."""
    facts, _, beside = saved_state(tiny_model("qwen35"))
    assert facts.state_bytes_per_sequence == 3 * (3 * 128 + 16 * 64) * 4
    assert facts.state_bytes_per_sequence <= beside <= facts.state_bytes_per_sequence + STATE_HEADER_BYTES_MOST
    assert kv_cache_bytes(facts, 1000, "q8_0", n_seq=4) == kv_cache_bytes(facts, 1000, "q8_0") + 3 * facts.state_bytes_per_sequence


def test_mla_keeps_its_compressed_k_alone(tiny_model: Callable[[str], Path]) -> None:
    """DeepSeek V3's MLA caches the latent (32) and its RoPE part (16) as one K head, and no V."""
    counted, kept = state_bytes_per_token(tiny_model("deepseek2"))
    assert counted == 4 * 1 * (32 + 16) * 2
    assert counted <= kept <= counted + CELL_BYTES_MOST


def header(architecture: str, n_layers: int, **keys: Any) -> GgufHeader:
    """A header of `architecture` with `keys` (under its name; `__` for a dot) beside a layer count,
    2 heads and K and V heads of 64."""
    metadata: dict[str, Any] = {"general.architecture": architecture, f"{architecture}.block_count": n_layers,
                                f"{architecture}.embedding_length": 128, f"{architecture}.attention.head_count": 2}
    metadata |= {f"{architecture}.{key.replace('__', '.')}": value for key, value in keys.items()}
    return GgufHeader(Path(f"{architecture}.gguf"), 3, metadata, {}, (), 0)


def test_gemma4_shares_its_last_layers_kv_and_sizes_sliding_heads_apart() -> None:
    """35 layers (E2B's count in llama.cpp's gemma4 graph), each 5th a full one, the last 20 reading earlier
    layers' KV; sliding layers' heads of 256, full ones' of 512, one KV head."""
    sliding = [layer % 5 != 4 for layer in range(35)]
    gemma4 = header("gemma4", 35, attention__head_count_kv=1, attention__key_length=512, attention__value_length=512,
                    attention__key_length_swa=256, attention__value_length_swa=256,
                    attention__sliding_window_pattern=sliding, attention__shared_kv_layers=20)
    assert layers_with_kv(gemma4, 35) == [True] * 15 + [False] * 20
    # Of the first 15 layers, 12 slide and 3 are full.
    assert gguf_facts(gemma4).kv_bytes_per_token == (12 * 256 * 2 + 3 * 512 * 2) * 2
    # Without the sharing and the sliding heads' own size: every layer at 512.
    every_layer = header("gemma4", 35, attention__head_count_kv=1, attention__key_length=512, attention__value_length=512)
    assert gguf_facts(every_layer).kv_bytes_per_token == 35 * 1024 * 2


@pytest.mark.parametrize(("architecture", "keys", "kept"), [
    ("qwen35moe", {"full_attention_interval": 2}, [False, True] * 4),
    ("qwen3next", {"attention__recurrent_layers": [True, True, False, True, True, True, False, True]},
     [False, False, True, False, False, False, True, False]),
    ("minimax-01", {}, [False] * 7 + [True]),
    ("mamba2", {}, [False] * 8),
    ("gemma3n", {}, [True] * 8),
    ("glm4moe", {"nextn_predict_layers": 1}, [True] * 7 + [False]),
    ("lfm2", {"attention__head_count_kv": [0, 0, 2, 0, 0, 2, 0, 2]}, [True] * 8),
])
def test_which_layers_keep_kv(architecture: str, keys: dict[str, Any], kept: list[bool]) -> None:
    """As llama.cpp's graphs decide it (LFM2's layers of 0 KV heads count for nothing in the sum)."""
    assert layers_with_kv(header(architecture, 8, **keys), 8) == kept


def test_lfm2s_convolution_layers_keep_their_inputs_alone() -> None:
    """No KV, and 2 rows of the hidden size (a convolution over 3 positions) each."""
    lfm2 = header("lfm2", 8, attention__head_count_kv=[0, 0, 2, 0, 0, 2, 0, 2], attention__key_length=64,
                  attention__value_length=64, shortconv__l_cache=3)
    facts = gguf_facts(lfm2)
    assert facts.kv_bytes_per_token == 3 * 2 * 128 * 2
    assert facts.state_bytes_per_sequence == 5 * 128 * 2 * 4


@pytest.mark.parametrize(("architecture", "keys", "state_bytes"), [
    # RWKV 7: 2 shifted tokens and a 64-wide WKV state of each of the 128 channels, every layer.
    ("rwkv7", {"wkv__head_size": 64}, 8 * (2 * 128 + 128 * 64) * 4),
    # Mamba 2: a 4-wide convolution over the inner size and the groups' B and C, and a state per inner channel.
    ("mamba2", {"ssm__conv_kernel": 4, "ssm__inner_size": 256, "ssm__state_size": 16, "ssm__group_count": 1},
     8 * (3 * (256 + 2 * 16) + 16 * 256) * 4),
    # Nemotron-H: of its layers of 0 KV heads, those with a feed-forward size are MLPs, with no state.
    ("nemotron_h", {"attention__head_count_kv": [0, 2, 0, 0, 0, 2, 0, 0], "feed_forward_length": [0, 0, 512, 0, 512, 0, 0, 512],
                    "ssm__conv_kernel": 4, "ssm__inner_size": 256, "ssm__state_size": 16, "ssm__group_count": 1},
     3 * (3 * (256 + 2 * 16) + 16 * 256) * 4),
    ("llama", {}, 0),
])
def test_recurrent_states_as_each_family_shapes_them(architecture: str, keys: dict[str, Any], state_bytes: int) -> None:
    assert gguf_facts(header(architecture, 8, **keys)).state_bytes_per_sequence == state_bytes


@pytest.mark.parametrize(("architecture", "keys", "named"), [
    ("qwen35", {"full_attention_interval": 0}, "full_attention_interval"),
    ("gemma4", {"attention__shared_kv_layers": 9}, "shared_kv_layers"),
    ("gemma4", {"attention__sliding_window_pattern": [True, False]}, "sliding_window_pattern"),
    ("gemma4", {"attention__key_length_swa": "wide"}, "key_length_swa"),
])
def test_a_damaged_layout_is_one_line(architecture: str, keys: dict[str, Any], named: str) -> None:
    damaged = header(architecture, 8, **keys)
    with pytest.raises(ModelError, match=f"invalid '{architecture}.[a-z_.]*{named}'"):
        gguf_facts(damaged)


@pytest.mark.parametrize(("name", "counted"), [
    # 5 layers, the last 2 reading the keys and values of those before them: 2 sliding layers of 2 KV heads of
    # 16 and a full one of 32 keep their own.
    ("gemma4", (2 * 2 * (16 + 16) + 2 * (32 + 32)) * 2),
    # 3 sliding layers of 2 KV heads of 16, and a full one of 1 KV head of 32 whose values are its keys (both kept).
    ("gemma4-vision", (3 * 2 * (16 + 16) + 1 * (32 + 32)) * 2),
])
def test_gemma4_keeps_what_the_planner_counts(name: str, counted: int, tiny_checkpoint: Callable[[str], Path],
                                              tmp_path: Path) -> None:
    """Tiny Gemma 4 checkpoints converted by localchat, in real llama.cpp, within their sliding window of 8."""
    from localchat.converters.gguf import convert_checkpoint

    model = convert_checkpoint(tiny_checkpoint(name), tmp_path / f"{name}.gguf", "f32", threads=2).output
    planned, kept = state_bytes_per_token(model, 2, TINY_SLIDING_WINDOW)
    assert planned == counted
    assert counted <= kept <= counted + CELL_BYTES_MOST


def test_exaone4_keeps_what_the_planner_counts(tiny_checkpoint: Callable[[str], Path], tmp_path: Path) -> None:
    """The tiny 64-layer EXAONE 4 (the 32B's kind) converted by localchat, in real llama.cpp within its window of 8: its 48
    sliding-window layers keep rows as its 16 global ones do (2 KV heads of 16), in a cache of their own as long as the context."""
    from localchat.converters.gguf import convert_checkpoint

    model = convert_checkpoint(tiny_checkpoint("exaone4-hybrid"), tmp_path / "exaone4.gguf", "f32", threads=2).output
    planned, kept = state_bytes_per_token(model, 2, TINY_SLIDING_WINDOW)
    assert planned == 64 * 2 * (16 + 16) * 2
    assert planned <= kept <= planned + CELL_BYTES_MOST


def test_lfm2_keeps_what_the_planner_counts(tiny_checkpoint: Callable[[str], Path], tmp_path: Path) -> None:
    """The tiny LFM2 converted by localchat, in real llama.cpp: KV rows in its 2 attention layers alone (2 KV heads
    of 16), and the last 2 inputs of each of its 3 convolution layers (64 wide, f32) once a sequence."""
    from localchat.converters.gguf import convert_checkpoint

    model = convert_checkpoint(tiny_checkpoint("lfm2"), tmp_path / "lfm2.gguf", "f32", threads=2).output
    facts, growth, beside = saved_state(model)
    assert facts.kv_bytes_per_token == 2 * 2 * (16 + 16) * 2
    assert facts.kv_bytes_per_token <= growth <= facts.kv_bytes_per_token + CELL_BYTES_MOST
    assert facts.state_bytes_per_sequence == 3 * 2 * 64 * 4
    assert facts.state_bytes_per_sequence <= beside <= facts.state_bytes_per_sequence + STATE_HEADER_BYTES_MOST


def test_olmo3_keeps_what_the_planner_counts(tiny_checkpoint: Callable[[str], Path], tmp_path: Path) -> None:
    """The tiny OLMo 3 converted by localchat, in real llama.cpp, within its sliding window of 8: its 3 sliding-window
    layers keep rows as its full one does (2 KV heads of 16 each); localchat's contexts size their cache as the full one's (swa_full)."""
    from localchat.converters.gguf import convert_checkpoint

    model = convert_checkpoint(tiny_checkpoint("olmo3"), tmp_path / "olmo3.gguf", "f32", threads=2).output
    planned, kept = state_bytes_per_token(model, 2, TINY_SLIDING_WINDOW)
    assert planned == 4 * 2 * (16 + 16) * 2
    assert planned <= kept <= planned + CELL_BYTES_MOST


def test_granite4_hybrid_keeps_what_the_planner_counts(tiny_checkpoint: Callable[[str], Path], tmp_path: Path) -> None:
    """The tiny Granite 4 hybrid converted by localchat, in real llama.cpp: KV rows in its one attention layer alone (2 KV heads
    of 16), and in each of its 3 Mamba-2 layers the last 3 inputs of its convolution (192 wide) and its state (16 x 128), f32, once a sequence."""
    from localchat.converters.gguf import convert_checkpoint

    model = convert_checkpoint(tiny_checkpoint("granite4-hybrid"), tmp_path / "granite4.gguf", "f32", threads=2).output
    facts, growth, beside = saved_state(model)
    assert facts.kv_bytes_per_token == 1 * 2 * (16 + 16) * 2
    assert facts.kv_bytes_per_token <= growth <= facts.kv_bytes_per_token + CELL_BYTES_MOST
    assert facts.state_bytes_per_sequence == 3 * (3 * 192 + 16 * 128) * 4
    assert facts.state_bytes_per_sequence <= beside <= facts.state_bytes_per_sequence + STATE_HEADER_BYTES_MOST
