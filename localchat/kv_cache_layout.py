"""The KV cache a GGUF model keeps per token, layer by layer, and its recurrent state per sequence, as
llama.cpp lays them out.

Not every layer keeps K and V rows of its own size: a hybrid's recurrent layers keep none (Qwen 3.5
attends every 4th layer), Gemma 3n's and Gemma 4's last layers read an earlier layer's, Gemma 4's
sliding-window layers have smaller heads than its full ones, and an MLA model (DeepSeek V3, Kimi K2)
keeps its compressed K alone. Counting every layer as a full one put Qwen 3.5's cache at four times its
size (and a Gemma 4 of 35 layers, 20 of them sharing, at 3.9 times: tests/test_kv_cache_layout.py),
which cost such models GPU layers and context.

Checked against llama.cpp's src/models/*.cpp (which layers are recurrent, which share) and
llama-kv-cache.cpp (the rows each layer keeps), for contexts as localchat makes them: a sliding-window
layer keeps every position (swa_full, see localchat.backends.llamacpp_natives.LlamaContext) and each
layer's V rows are its own size (under flash attention; without it llama.cpp pads them to the largest).
"""

from __future__ import annotations

from collections.abc import Sequence

from localchat.gguf_file import GgufHeader

KV_ENTRY_BYTES = 2  # f16, llama.cpp's default cache type
STATE_ENTRY_BYTES = 4  # a recurrent state is f32

# Architectures that keep a recurrent state and no KV cache (llama.cpp's llm_arch_is_recurrent).
RECURRENT_ARCHITECTURES = frozenset({"mamba", "mamba2", "rwkv6", "rwkv6qwen2", "rwkv7", "arwkv7"})
# Hybrids whose every Nth layer attends, the rest recurrent, unless the file lists its recurrent layers
# (`attention.recurrent_layers`) or gives N (`full_attention_interval`); N is llama.cpp's default.
# The other hybrids (LFM2, Granite 4, Nemotron-H, Jamba...) give their recurrent layers 0 KV heads.
ATTENTION_INTERVALS = {"qwen3next": 4, "qwen35": 4, "qwen35moe": 4, "qwen4exp": 4, "minimax-01": 8}
# Hybrids whose every layer has both attention and a recurrent state.
EVERY_LAYER_BOTH = frozenset({"falcon-h1"})
# Hybrids whose recurrent layers are those of 0 KV heads (llama.cpp's llm_arch_is_hybrid, less the above):
# Nemotron-H's layers of 0 KV heads are recurrent only without a feed-forward size of their own.
RECURRENT_BY_HEADS = frozenset({"jamba", "plamo2", "granitehybrid", "lfm2", "lfm2moe", "nemotron_h", "nemotron_h_moe",
                                "kimi-linear", "bailingmoe3", "kimi-k3", "glm5-next"})
# Layers from this one on read an earlier layer's KV (Gemma 3n's graph fixes it; Gemma 4 writes how
# many layers share in `attention.shared_kv_layers`).
KV_SHARED_FROM = {"gemma3n": 20}
SHARED_KV_ARCHITECTURES = frozenset({"gemma4", "gemma4-assistant"})


def _flags(header: GgufHeader, key: str, n_layers: int) -> list[bool] | None:
    """A per-layer flag given once or for each layer (llama.cpp's get_key_or_arr); None when absent."""
    value = header.arch_value(key)
    if value is None:
        return None
    values = value if isinstance(value, list) else [value] * n_layers
    if len(values) != n_layers or not all(isinstance(v, (bool, int)) for v in values):
        raise header.invalid(key, value)
    return [bool(v) for v in values]


def _trunk(header: GgufHeader, n_layers: int) -> list[bool]:
    """The layers the context that decodes computes: all but those that predict further tokens
    (`nextn_predict_layers`, DeepSeek V3's and GLM 4.5's MTP), for which it keeps nothing."""
    trunk = n_layers - header.arch_int("nextn_predict_layers", 0, 0, n_layers)
    return [layer < trunk for layer in range(n_layers)]


def _recurrent_by_interval(header: GgufHeader, n_layers: int) -> list[bool]:
    """An ATTENTION_INTERVALS hybrid's recurrent layers: listed, or all but each Nth."""
    recurrent = _flags(header, "attention.recurrent_layers", n_layers)
    if recurrent is None:
        every = header.arch_int("full_attention_interval", ATTENTION_INTERVALS[header.architecture], 1)
        recurrent = [(layer + 1) % every != 0 for layer in range(n_layers)]
    return recurrent


def layers_with_kv(header: GgufHeader, n_layers: int) -> list[bool]:
    """Which of the model's `n_layers` layers of the trunk (`_trunk`) keep KV rows of their own. A layer with
    0 KV heads keeps none either way."""
    architecture = header.architecture or ""
    if architecture in RECURRENT_ARCHITECTURES:
        return [False] * n_layers
    keeps = _trunk(header, n_layers)
    if architecture in ATTENTION_INTERVALS:
        keeps = [keep and not flag for keep, flag in zip(keeps, _recurrent_by_interval(header, n_layers))]
    shared_from = KV_SHARED_FROM.get(architecture)
    if architecture in SHARED_KV_ARCHITECTURES:
        shared_from = n_layers - header.arch_int("attention.shared_kv_layers", 0, 0, n_layers)
    if shared_from is not None:
        keeps = [keep and layer < shared_from for layer, keep in enumerate(keeps)]
    return keeps


def _sliding_layers(header: GgufHeader, n_layers: int) -> list[bool]:
    """Which layers attend to a sliding window: listed, or every layer but each Nth given N (llama.cpp's
    set_swa_pattern; an architecture's own default N matters not here, where only Gemma 4's sliding
    layers have heads of their own size, and it lists them)."""
    pattern = header.arch_value("attention.sliding_window_pattern")
    if pattern is None or isinstance(pattern, list):
        return _flags(header, "attention.sliding_window_pattern", n_layers) or [False] * n_layers
    every = header.arch_int("attention.sliding_window_pattern", 0)
    return [every == 0 or layer % every < every - 1 for layer in range(n_layers)]


def kv_bytes_per_token(header: GgufHeader, n_layers: int, head_kv: Sequence[int], key_length: int, value_length: int) -> int:
    """The f16 KV cache of one token: each layer that keeps one, its KV heads times its K and V head
    sizes (a sliding-window layer's own where the file gives them; no V for MLA)."""
    sliding = _sliding_layers(header, n_layers)
    key_swa = header.arch_int("attention.key_length_swa", key_length)
    value_swa = header.arch_int("attention.value_length_swa", value_length)
    # MLA keeps the compressed latent and its RoPE part as K, and V is read from it.
    mla = header.arch_value("attention.key_length_mla") is not None and header.arch_value("attention.value_length_mla") is not None
    total = 0
    for layer, keeps in enumerate(layers_with_kv(header, n_layers)):
        if keeps:
            k, v = (key_swa, value_swa) if sliding[layer] else (key_length, value_length)
            total += head_kv[layer] * (k + (0 if mla else v))
    return total * KV_ENTRY_BYTES


def _recurrent_layers(header: GgufHeader, n_layers: int) -> list[bool]:
    """Which layers of the trunk (`_trunk`) keep a recurrent state (llama.cpp's is_recr)."""
    architecture = header.architecture or ""
    trunk = _trunk(header, n_layers)
    if architecture in RECURRENT_ARCHITECTURES or architecture in EVERY_LAYER_BOTH:
        return trunk
    if architecture in ATTENTION_INTERVALS:
        return [keep and flag for keep, flag in zip(trunk, _recurrent_by_interval(header, n_layers))]
    if architecture in RECURRENT_BY_HEADS:
        head_kv = header.per_layer("attention.head_count_kv", n_layers, 1)
        feed_forward = header.per_layer("feed_forward_length", n_layers, 0) if architecture.startswith("nemotron_h") \
            else [0] * n_layers
        return [keep and head_kv[layer] == 0 and feed_forward[layer] == 0 for layer, keep in enumerate(trunk)]
    return [False] * n_layers


def recurrent_state_bytes(header: GgufHeader, n_layers: int) -> int:
    """The recurrent state of one sequence, whatever its length: each recurrent layer's rolling
    convolution inputs and its state (llama.cpp's n_embd_r and n_embd_s, f32), as the family shapes them."""
    n_recurrent = sum(_recurrent_layers(header, n_layers))
    if not n_recurrent:
        return 0
    n_embd = header.arch_int("embedding_length", 0)
    n_head = header.per_layer("attention.head_count", n_layers, 1)[0]
    d_conv = header.arch_int("ssm.conv_kernel", 0)
    if (wkv_head := header.arch_int("wkv.head_size", 0)) > 0:  # RWKV: shifted tokens and its WKV state
        rows = header.arch_int("token_shift_count", 2) * n_embd + n_embd * wkv_head
    elif (l_cache := header.arch_int("shortconv.l_cache", 0)) > 0:  # LFM2: a short convolution's inputs
        rows = n_embd * (l_cache - 1)
    elif (kda_head := header.arch_int("kda.head_dim", 0)) > 0:  # Kimi's delta attention: Q, K, V convolutions
        rows = 3 * (d_conv - 1 if d_conv else 3) * n_head * kda_head + kda_head * kda_head * n_head
    else:  # Mamba's shape, which gated delta-nets (Qwen 3.5) fill in too
        d_inner, d_state = header.arch_int("ssm.inner_size", 0), header.arch_int("ssm.state_size", 0)
        groups = header.arch_int("ssm.group_count", 0)
        rows = max(d_conv - 1, 0) * (d_inner + 2 * groups * d_state) + d_state * d_inner
    return n_recurrent * rows * STATE_ENTRY_BYTES
