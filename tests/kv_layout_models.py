"""Tiny random GGUF models of the architectures whose layers do not all keep a KV cache of one size,
written tensor by tensor as llama.cpp's graphs ask for them (src/models/qwen35.cpp, deepseek2.cpp),
with the default model's vocabulary. Their answers are noise: they are loaded to see what llama.cpp
keeps per token, not to chat.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import gguf
import numpy as np

N_EMBD = 64
N_HEAD = 4
N_FF = 128
N_LAYERS = 4


def _layer_tensors(layer: int, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    return {f"blk.{layer}.{name}": shape for name, shape in shapes.items()}


def _dense_ffn() -> dict[str, tuple[int, ...]]:
    return {"ffn_gate.weight": (N_EMBD, N_FF), "ffn_up.weight": (N_EMBD, N_FF), "ffn_down.weight": (N_FF, N_EMBD)}


def qwen35_hybrid() -> tuple[dict[str, object], dict[str, tuple[int, ...]]]:
    """Qwen 3.5: gated delta-net layers, every 4th layer attending (llama.cpp's default interval)."""
    head, kv_heads, state, groups, v_heads = 16, 2, 16, 2, 4
    keys: dict[str, object] = {
        "block_count": N_LAYERS, "embedding_length": N_EMBD, "feed_forward_length": N_FF, "context_length": 4096,
        "attention.head_count": N_HEAD, "attention.head_count_kv": kv_heads, "attention.key_length": head,
        "attention.value_length": head, "attention.layer_norm_rms_epsilon": 1e-6, "rope.dimension_count": head,
        "rope.dimension_sections": [4, 2, 2, 0], "ssm.conv_kernel": 4, "ssm.inner_size": state * v_heads,
        "ssm.state_size": state, "ssm.time_step_rank": v_heads, "ssm.group_count": groups,
    }
    key_dim, value_dim = state * groups, state * v_heads
    tensors = {"token_embd.weight": (N_EMBD, 0), "output_norm.weight": (N_EMBD,)}
    for layer in range(N_LAYERS):
        shapes: dict[str, tuple[int, ...]] = {"attn_norm.weight": (N_EMBD,), "post_attention_norm.weight": (N_EMBD,)}
        if (layer + 1) % 4 == 0:
            shapes |= {"attn_q.weight": (N_EMBD, head * N_HEAD * 2), "attn_k.weight": (N_EMBD, head * kv_heads),
                       "attn_v.weight": (N_EMBD, head * kv_heads), "attn_output.weight": (head * N_HEAD, N_EMBD),
                       "attn_q_norm.weight": (head,), "attn_k_norm.weight": (head,)}
        else:
            shapes |= {"attn_qkv.weight": (N_EMBD, key_dim * 2 + value_dim), "attn_gate.weight": (N_EMBD, value_dim),
                       "ssm_conv1d.weight": (4, key_dim * 2 + value_dim), "ssm_dt.bias": (v_heads,), "ssm_a": (v_heads,),
                       "ssm_beta.weight": (N_EMBD, v_heads), "ssm_alpha.weight": (N_EMBD, v_heads),
                       "ssm_norm.weight": (state,), "ssm_out.weight": (value_dim, N_EMBD)}
        tensors |= _layer_tensors(layer, shapes | _dense_ffn())
    return keys, tensors


def deepseek2_mla() -> tuple[dict[str, object], dict[str, tuple[int, ...]]]:
    """DeepSeek V3's attention (MLA, as llama.cpp's converter writes it: one KV head of the compressed
    latent and its RoPE part), every layer dense."""
    kv_lora, rope, nope, v_head, q_lora = 32, 16, 32, 32, 32
    keys: dict[str, object] = {
        "block_count": N_LAYERS, "embedding_length": N_EMBD, "feed_forward_length": N_FF, "context_length": 4096,
        "attention.head_count": N_HEAD, "attention.head_count_kv": 1, "attention.key_length": kv_lora + rope,
        "attention.value_length": kv_lora, "attention.key_length_mla": nope + rope, "attention.value_length_mla": v_head,
        "attention.kv_lora_rank": kv_lora, "attention.q_lora_rank": q_lora, "attention.layer_norm_rms_epsilon": 1e-6,
        "rope.dimension_count": rope, "leading_dense_block_count": N_LAYERS, "expert_feed_forward_length": N_FF,
        "expert_shared_count": 1,
    }
    tensors = {"token_embd.weight": (N_EMBD, 0), "output_norm.weight": (N_EMBD,)}
    for layer in range(N_LAYERS):
        tensors |= _layer_tensors(layer, {
            "attn_norm.weight": (N_EMBD,), "attn_q_a_norm.weight": (q_lora,), "attn_kv_a_norm.weight": (kv_lora,),
            "attn_q_a.weight": (N_EMBD, q_lora), "attn_q_b.weight": (q_lora, N_HEAD * (nope + rope)),
            "attn_kv_a_mqa.weight": (N_EMBD, kv_lora + rope), "attn_k_b.weight": (nope, kv_lora, N_HEAD),
            "attn_v_b.weight": (kv_lora, v_head, N_HEAD), "attn_output.weight": (N_HEAD * v_head, N_EMBD),
            "ffn_norm.weight": (N_EMBD,), **_dense_ffn()})
    return keys, tensors


def write_tiny_model(architecture: str, keys: Mapping[str, object], tensors: Mapping[str, tuple[int, ...]],
                     vocabulary_from: Path, target: Path, seed: int = 0) -> Path:
    """A GGUF of `architecture` with `keys` (under the architecture's name), random f32 `tensors`
    (shapes as llama.cpp writes them, innermost first; 0 stands for the vocabulary's size) and the
    tokenizer of the GGUF `vocabulary_from`."""
    reader = gguf.GGUFReader(vocabulary_from)
    writer = gguf.GGUFWriter(target, arch=architecture)
    n_vocab = 0
    for name, field in reader.fields.items():
        if name.startswith("tokenizer."):
            sub_type = field.types[1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
            writer.add_key_value(name, field.contents(), field.types[0], sub_type=sub_type)
            if name == "tokenizer.ggml.tokens":
                n_vocab = len(field.data)
    for key, value in keys.items():
        name = f"{architecture}.{key}"
        if isinstance(value, list):
            writer.add_array(name, value)
        elif isinstance(value, float):
            writer.add_float32(name, value)
        else:
            writer.add_uint32(name, int(value))
    rng = np.random.default_rng(seed)
    for name, shape in tensors.items():
        dims = tuple(n_vocab if size == 0 else size for size in shape)
        # numpy's order is the reverse of GGUF's; norms near 1, weights small.
        values = rng.normal(1.0 if name.endswith("norm.weight") else 0.0, 0.05, size=dims[::-1]).astype(np.float32)
        writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target
