"""Real Hugging Face checkpoints for the converter and ONNX tests: tiny random ones per architecture,
PEFT LoRA adapters on some, and Gemma 3 270M (a pytest plugin loaded by tests/conftest.py)."""

from __future__ import annotations

import importlib.resources
import io
import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from localchat.converters.architectures import EXAONE4_HYBRID_LAYERS
from localchat.converters.reference_checkpoints import build_gemma3_270m_checkpoint
from localchat.converters.tokenizer import DEEPSEEK3_REGEXES, GPT4O_REGEX, LLAMA3_REGEX, QWEN2_REGEX, QWEN35_REGEX, SEED_CODER_REGEX, TEKKEN_REGEX
from localchat.converters.verify import text_model_class, verify_text

try:
    import torch
    import transformers
except ImportError:  # the tests that need them skip through the `reference_stack` fixture
    torch = transformers = None

TRAINING_TEXT = [
    "The quick brown fox jumps over the lazy dog while the cat sleeps in the sun.",
    "Conversion keeps every weight; quantization trades a little accuracy for size.",
    "    indented code, tabs\tand  double  spaces\nand new lines\n\n",
]
# Far shorter than the verification text, so tiny Gemma's sliding-window layers really slide.
TINY_SLIDING_WINDOW = 8


def bpe_tokenizer(split_regex: str | tuple[str, ...] | None, vocab_size: int = 600, individual_digits: bool = False):
    """A byte-level BPE trained here on a few lines, wrapped as a transformers tokenizer: split by `split_regex` (or by each of
    several one after another, as DeepSeek V3's), else by GPT-2's byte-level regex, after splitting digits one by one if
    `individual_digits` (Command R's)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tokenizer = Tokenizer(models.BPE())
    steps = [pre_tokenizers.Digits(individual_digits=True)] if individual_digits else []
    if split_regex is None:
        steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False))
    else:
        regexes = (split_regex,) if isinstance(split_regex, str) else split_regex
        steps += [*(pre_tokenizers.Split(Regex(regex), behavior="isolated") for regex in regexes),
                  pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    tokenizer.pre_tokenizer = steps[0] if len(steps) == 1 else pre_tokenizers.Sequence(steps)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<s>", "</s>", "<|end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator([*TRAINING_TEXT, verify_text()], trainer)
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>")


def sentencepiece_model(vocab_size: int) -> bytes:
    """A SentencePiece BPE with byte fallback (ERNIE 4.5 ships such a tokenizer.model), trained here on a few lines and the verify
    text, which then fits the tests' context; spaces and characters kept as they are, as llama.cpp's SentencePiece tokenizer keeps them."""
    from sentencepiece import SentencePieceTrainer

    model = io.BytesIO()
    SentencePieceTrainer.train(sentence_iterator=iter(TRAINING_TEXT + verify_text().splitlines()), model_writer=model, vocab_size=vocab_size,
                               model_type="bpe", byte_fallback=True, character_coverage=1.0, normalization_rule_name="identity",
                               remove_extra_whitespaces=False, minloglevel=2)
    return model.getvalue()


def _randomize(model, seed: int) -> None:
    """Random weights with clear preferences, rounded to f16 so an F16 GGUF holds them exactly."""
    generator = torch.Generator().manual_seed(seed)
    # Any width behaves as 64 does: the head's logits spread as much, each layer amplifies as much
    # (wider, a few logits would dwarf the rest and rounding noise would grow layer by layer).
    width = 8 / model.config.get_text_config().hidden_size ** 0.5
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator)
            if parameter.ndim == 1:  # norms and biases: off their 1 / 0 defaults
                parameter.copy_(parameter + 0.2 * noise)
            else:  # a wide output head: clear winners, so greedy decoding has no near-ties
                parameter.copy_(width * (1.0 if "lm_head" in name or "embed_tokens" in name else 0.15) * noise)
            parameter.copy_(parameter.half().float())


def _randomize_buffers(model, seed: int) -> None:
    """Buffers saved with the weights off their defaults, as trained ones are: Gemma 4's per-layer output scales (1) and
    LFM2-MoE's and GLM-4.5's biases of their routers' choices (0; these change some choices)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, buffer in model.named_buffers():
            if name.endswith("layer_scalar"):
                buffer.copy_((0.5 + torch.rand(buffer.shape, generator=generator)).half().float())
            elif name.endswith(("expert_bias", "e_score_correction_bias")):
                buffer.copy_((0.1 * torch.randn(buffer.shape, generator=generator)).half().float())


# ERNIE 4.5's special token ids, as its SentencePiece tokenizer (and the tests', sentencepiece_model) numbers them.
ERNIE_TOKEN_IDS = dict(pad_token_id=0, bos_token_id=1, eos_token_id=2)
# Families whose tokenizer is a SentencePiece tokenizer.model alone (sentencepiece_model's, this many pieces).
TINY_SENTENCEPIECE = ("ernie4_5", "ernie4_5-moe")
TINY_SENTENCEPIECE_PIECES = 1000
TINY_SIZES = dict(hidden_size=64, intermediate_size=128, num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048)
# Mixtures of experts 256 wide, so that llama.cpp's K-quants (blocks of 256) apply to the experts' rows.
TINY_MOE_SIZES = dict(TINY_SIZES, hidden_size=256, intermediate_size=256, num_experts_per_tok=2)
TINY_EXPERTS = 4
# Phi-4 mini's kind of RoPE: 3/4 of each head rotated, LongRoPE factors; its original context is
# beyond the tests' contexts, so llama.cpp and transformers both take the short factors.
TINY_LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.75,
                 "long_factor": [1.0 + i / 4 for i in range(6)], "short_factor": [1.0 + i / 8 for i in range(6)]}


# Gemma 4's two attention types, with different RoPE, and its global layers' proportional RoPE (a quarter of each head turns).
GEMMA4_ROPE = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
               "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}}
# Gemma's special token ids (its tokenizer's <pad>, <eos>, <bos>).
GEMMA_TOKEN_IDS = dict(pad_token_id=0, eos_token_id=1, bos_token_id=2)
# Ministral 3's YaRN (its mscale and mscale_all_dim, 1, leave YaRN's attention factor at 1) and attention temperature,
# its original context short enough that both act within the greedy comparison (its positions past 32 are scaled).
MINISTRAL3_ROPE = {"rope_type": "yarn", "rope_theta": 1_000_000.0, "factor": 64.0, "original_max_position_embeddings": 32,
                   "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0, "llama_4_scaling_beta": 0.1}
# DeepSeek's YaRN as its releases have it (V3's mscale and mscale_all_dim 1, which scale attention by (1 + 0.1 ln 32)^2; V2's
# 0.707), its original context short enough that YaRN's ramp turns pairs the verify text's positions reach.
DEEPSEEK_YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 32.0, "original_max_position_embeddings": 64,
                 "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0}
# Multi-head latent attention's sizes: four heads (as many key/value heads, as DeepSeek's), keys and values through a latent of 64.
DEEPSEEK_LATENT = dict(num_key_value_heads=4, kv_lora_rank=64, qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32)
# Granite 4's dense kind: no experts, its MLP (shared_mlp) intermediate_size wide; Granite's multipliers off their defaults.
GRANITE4_SETTINGS = {"num_local_experts": 0, "num_experts_per_tok": 0, "shared_intermediate_size": TINY_SIZES["intermediate_size"],
                     "attention_multiplier": 0.2, "embedding_multiplier": 3.0, "residual_multiplier": 0.5, "logits_scaling": 2.0}
# Granite 4's mixtures of experts: two of four experts per token beside the shared expert (its MLP), twice as wide as each expert.
GRANITE4_MOE_SETTINGS = dict(GRANITE4_SETTINGS, num_local_experts=TINY_EXPERTS, num_experts_per_tok=2,
                             shared_intermediate_size=2 * TINY_MOE_SIZES["intermediate_size"])
# OLMo 3's long-context RoPE: YaRN in its full layers alone, its sliding-window layers unscaled at the same base; its original
# context scaled down as its window is, and its attention factor off YaRN's default (the releases' is the default) so that
# the one the GGUF gives acts.
OLMO3_ROPE = {"full_attention": {"rope_type": "yarn", "rope_theta": 500_000.0, "factor": 8.0, "original_max_position_embeddings": 256,
                                 "attention_factor": 1.5, "beta_fast": 32.0, "beta_slow": 1.0},
              "sliding_attention": {"rope_type": "default", "rope_theta": 500_000.0}}
# gpt-oss's YaRN, as its releases and transformers' class give it: 32 times an original context of 4096, the correction range unrounded.
GPT_OSS_ROPE = {"rope_type": "yarn", "rope_theta": 150_000.0, "factor": 32.0, "original_max_position_embeddings": 4096, "beta_fast": 32.0,
                "beta_slow": 1.0, "truncate": False}


def _tiny_configs(vocab_size: int) -> dict[str, Callable[[], object]]:
    common = dict(TINY_SIZES, vocab_size=vocab_size, bos_token_id=0, eos_token_id=1, num_hidden_layers=2)
    moe = dict(common, **TINY_MOE_SIZES)
    return {
        "llama": lambda: transformers.LlamaConfig(**common, head_dim=16),
        "llama3-rope": lambda: transformers.LlamaConfig(
            **common,
            rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        ),
        # LLaMA with biases on q, k, v and o (a "llamafied" Qwen, InternLM).
        "llama-attention-bias": lambda: transformers.LlamaConfig(**common, attention_bias=True),
        "mistral": lambda: transformers.MistralConfig(**common, sliding_window=4096),
        # Ministral 3 8B's kind: an output matrix of its own.
        "ministral3": lambda: transformers.Ministral3Config(**common, rope_parameters=dict(MINISTRAL3_ROPE), pad_token_id=None),
        # Ministral 3 3B's kind, as Mistral ships it: beside a (tiny) Pixtral vision tower and projector, its head tied to
        # the embeddings (Mistral 3's default), its heads wider than hidden_size / heads.
        "ministral3-vision": lambda: transformers.Mistral3Config(
            text_config=dict(common, model_type="ministral3", head_dim=32, rope_parameters=dict(MINISTRAL3_ROPE), pad_token_id=None),
            vision_config={"model_type": "pixtral", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
                           "num_attention_heads": 2, "head_dim": 8, "image_size": 28, "patch_size": 14},
        ),
        "qwen2": lambda: transformers.Qwen2Config(**common, tie_word_embeddings=True),
        "qwen3": lambda: transformers.Qwen3Config(**common, head_dim=32),
        "gemma3": lambda: transformers.Gemma3TextConfig(
            **dict(common, num_hidden_layers=6), head_dim=16, query_pre_attn_scalar=16, sliding_window=TINY_SLIDING_WINDOW,
            rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
        ),
        # Gemma 3 4B and up's kind: the text model beside a (tiny) SigLIP vision tower and projector, with
        # their 64 embedding rows beyond the tokenizer's (262208, transformers' default; the image token's among them)
        # and their linear RoPE scaling of the global layers alone.
        "gemma3-vision": lambda: transformers.Gemma3Config(
            text_config=dict(
                common, vocab_size=vocab_size + 64, num_hidden_layers=6, head_dim=16, query_pre_attn_scalar=16,
                sliding_window=TINY_SLIDING_WINDOW,
                rope_parameters={"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1_000_000.0},
                                 "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
            ),
            vision_config=transformers.SiglipVisionConfig(
                hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28, patch_size=14
            ).to_dict(),
            mm_tokens_per_image=4,
        ),
        # Gemma 4 E2B's kind: sliding-window heads half the global layers' (16, 32), the last two layers
        # reusing the keys and values of the two before them with double-wide MLPs, per-layer inputs, soft-capped logits.
        "gemma4": lambda: transformers.Gemma4TextConfig(
            **dict(common, num_hidden_layers=5, **GEMMA_TOKEN_IDS), head_dim=16, global_head_dim=32, sliding_window=TINY_SLIDING_WINDOW,
            layer_types=["sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            num_kv_shared_layers=2, use_double_wide_mlp=True, hidden_size_per_layer_input=8, vocab_size_per_layer_input=vocab_size,
            final_logit_softcapping=30.0, rope_parameters=GEMMA4_ROPE,
        ),
        # Gemma 4 31B's kind, with a (tiny) vision tower: global layers with one key/value head whose values are
        # its keys (attention_k_eq_v), no per-layer inputs, images attended both ways (text is causal).
        "gemma4-vision": lambda: transformers.Gemma4Config(
            text_config=dict(
                common, num_hidden_layers=4, **GEMMA_TOKEN_IDS, head_dim=16, global_head_dim=32, num_global_key_value_heads=1,
                attention_k_eq_v=True, sliding_window=TINY_SLIDING_WINDOW, hidden_size_per_layer_input=0,
                layer_types=["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
                use_bidirectional_attention="vision", rope_parameters=GEMMA4_ROPE,
            ),
            vision_config=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                               head_dim=8, patch_size=4, position_embedding_size=64, pooling_kernel_size=2),
            audio_config=None,
        ),
        "phi3": lambda: transformers.Phi3Config(**common, pad_token_id=None),
        "phi4-mini": lambda: transformers.Phi3Config(
            **dict(common, max_position_embeddings=4096), pad_token_id=None, rope_parameters=TINY_LONGROPE,
            original_max_position_embeddings=1024,
        ),
        "gemma2": lambda: transformers.Gemma2Config(
            **dict(common, num_hidden_layers=4), head_dim=16, query_pre_attn_scalar=16, sliding_window=TINY_SLIDING_WINDOW
        ),
        "granite": lambda: transformers.GraniteConfig(
            **common, attention_multiplier=0.2, embedding_multiplier=3.0, residual_multiplier=0.5, logits_scaling=2.0
        ),
        # Granite 4's hybrid (h-micro's kind): Mamba-2 layers (8 heads of 16, in 2 groups) around an attention layer without
        # RoPE, the MLP dense (no experts); its layer types as its hub configs name them.
        "granite4-hybrid": lambda: transformers.GraniteMoeHybridConfig(
            **dict(common, num_hidden_layers=4), **GRANITE4_SETTINGS, layer_types=["mamba", "mamba", "attention", "mamba"],
            position_embedding_type="nope", mamba_n_heads=8, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4,
        ),
        # Granite 4's models that attend in every layer (micro's kind), turned by RoPE.
        "granite4": lambda: transformers.GraniteMoeHybridConfig(
            **common, **GRANITE4_SETTINGS, layer_types=["attention"] * 2, position_embedding_type="rope",
        ),
        # Granite 4's hybrid mixture of experts (h-tiny's kind): the hybrid's layers (Mamba-2's heads 64 wide here), every one routed.
        "granite4-hybrid-moe": lambda: transformers.GraniteMoeHybridConfig(
            **dict(moe, num_hidden_layers=4, **GRANITE4_MOE_SETTINGS), layer_types=["mamba", "attention", "mamba", "mamba"],
            position_embedding_type="nope", mamba_n_heads=8, mamba_n_groups=2, mamba_d_state=16, mamba_d_conv=4,
        ),
        # A Granite 4 mixture of experts that attends in every layer, turned by RoPE: llama.cpp's granitemoe.
        "granite4-moe": lambda: transformers.GraniteMoeHybridConfig(
            **dict(moe, **GRANITE4_MOE_SETTINGS), layer_types=["attention"] * 2, position_embedding_type="rope",
        ),
        # The same without a shared expert: transformers builds its MLP 0 wide and saves empty tensors for it.
        "granite4-moe-unshared": lambda: transformers.GraniteMoeHybridConfig(
            **dict(moe, **dict(GRANITE4_MOE_SETTINGS, shared_intermediate_size=0)), layer_types=["attention"] * 2,
            position_embedding_type="rope",
        ),
        # Four layers: the fourth has no RoPE.
        "smollm3": lambda: transformers.SmolLM3Config(**dict(common, num_hidden_layers=4), pad_token_id=None),
        "olmo2": lambda: transformers.Olmo2Config(**common, pad_token_id=None),
        # OLMo 3's kind: three sliding-window layers (their window slides within the verify text), then a full one turned by YaRN.
        "olmo3": lambda: transformers.Olmo3Config(
            **dict(common, num_hidden_layers=4), pad_token_id=None, sliding_window=TINY_SLIDING_WINDOW,
            rope_parameters={kind: dict(rope) for kind, rope in OLMO3_ROPE.items()},
        ),
        "mixtral": lambda: transformers.MixtralConfig(**moe, num_local_experts=TINY_EXPERTS),
        "qwen2moe": lambda: transformers.Qwen2MoeConfig(
            **moe, num_experts=TINY_EXPERTS, moe_intermediate_size=256, shared_expert_intermediate_size=256
        ),
        "qwen3moe": lambda: transformers.Qwen3MoeConfig(
            **moe, num_experts=TINY_EXPERTS, moe_intermediate_size=256, norm_topk_prob=True, head_dim=64
        ),
        # llama.cpp's OLMoE has as many key/value heads as query heads, as OLMoE-1B-7B.
        "olmoe": lambda: transformers.OlmoeConfig(**dict(moe, num_key_value_heads=4), num_experts=TINY_EXPERTS, pad_token_id=None),
        # LFM2's hybrid: short convolutions over 3 positions between attention layers, its MLP two thirds of
        # intermediate_size rounded up to a multiple of 32 (96), as LFM2 sizes it (to a multiple of 256).
        "lfm2": lambda: transformers.Lfm2Config(
            **dict(common, num_hidden_layers=5), layer_types=["conv", "conv", "full_attention", "conv", "full_attention"],
            block_multiple_of=32, pad_token_id=None,
        ),
        # Qwen 3.5's hybrid: three Gated DeltaNet layers, then a gated full-attention one; each linear-attention key
        # head shared by two value heads (as in Qwen 3.5 9B), a quarter of each attention head turned by RoPE.
        "qwen35": lambda: transformers.Qwen3_5TextConfig(
            **dict(common, num_hidden_layers=4), head_dim=32, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=16, linear_value_head_dim=16,
        ),
        # Qwen 3.5's mixture of experts (35B-A3B's kind): the hybrid's layers, each with two of four experts per token beside a
        # shared expert; no dense MLP's width (intermediate_size), as Qwen's configs give none.
        "qwen35moe": lambda: transformers.Qwen3_5MoeTextConfig(
            **{key: value for key, value in dict(moe, num_hidden_layers=4).items() if key != "intermediate_size"}, head_dim=64,
            linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=16, linear_value_head_dim=16, num_experts=TINY_EXPERTS,
            moe_intermediate_size=256, shared_expert_intermediate_size=256,
        ),
        # LFM2-MoE (8B-A1B's kind): a dense convolution layer, then routed ones (convolution, attention, convolution), two of
        # four experts per token chosen by sigmoid scores plus a bias per expert.
        "lfm2moe": lambda: transformers.Lfm2MoeConfig(
            **dict(moe, num_hidden_layers=4), layer_types=["conv", "conv", "full_attention", "conv"], num_dense_layers=1,
            num_experts=TINY_EXPERTS, moe_intermediate_size=256, pad_token_id=None,
        ),
        # GLM-4-9B-0414's kind: query, key and value biases, half of each head turned by RoPE (transformers' default).
        "glm4": lambda: transformers.Glm4Config(**common, head_dim=16, pad_token_id=None),
        # GLM-4.5's kind: a dense layer, then two with two of four experts per token chosen by sigmoid scores plus a bias per
        # expert, renormalised and scaled, beside a shared expert; query and key norms (the 355B's); half of each head turned.
        "glm4moe": lambda: transformers.Glm4MoeConfig(
            **dict(moe, num_hidden_layers=3), n_routed_experts=TINY_EXPERTS, moe_intermediate_size=256, n_shared_experts=1,
            first_k_dense_replace=1, routed_scaling_factor=2.5, use_qk_norm=True,
        ),
        # EXAONE 4.0 1.2B's kind: global attention with RoPE in every layer (no sliding_window), Llama 3's RoPE scaling
        # acting within the verify text, the head tied to the embeddings.
        "exaone4": lambda: transformers.Exaone4Config(
            **common, sliding_window=None, layer_types=["full_attention"] * 2, tie_word_embeddings=True,
            rope_parameters={"rope_type": "llama3", "rope_theta": 1_000_000.0, "factor": 16.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 64},
        ),
        # EXAONE 4.0 32B's kind: 64 layers (llama.cpp's exaone4 graph slides windows in no others), three sliding-window
        # layers with RoPE then a global one without.
        "exaone4-hybrid": lambda: transformers.Exaone4Config(
            **dict(common, num_hidden_layers=EXAONE4_HYBRID_LAYERS), sliding_window=TINY_SLIDING_WINDOW,
            layer_types=["full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(EXAONE4_HYBRID_LAYERS)],
        ),
        # Command R7B's kind: three sliding-window layers turned by RoPE (their window slides within the verify text), then a
        # global one without (transformers' default pattern), the logits scaled, the head tied.
        "cohere2": lambda: transformers.Cohere2Config(
            **dict(common, num_hidden_layers=4), sliding_window=TINY_SLIDING_WINDOW, logit_scale=0.5, pad_token_id=None,
        ),
        # DeepSeek-V3's kind: a dense layer, then two with two of four experts per token chosen by sigmoid scores plus a bias per
        # expert within the better of two groups, renormalised and scaled, beside a shared expert; queries through a latent of
        # their own; YaRN.
        "deepseek-v3": lambda: transformers.DeepseekV3Config(
            **dict(moe, num_hidden_layers=3, **DEEPSEEK_LATENT), q_lora_rank=48, n_routed_experts=TINY_EXPERTS, moe_intermediate_size=256,
            n_shared_experts=1, first_k_dense_replace=1, n_group=2, topk_group=1, routed_scaling_factor=2.5, norm_topk_prob=True,
            rope_parameters=dict(DEEPSEEK_YARN), pad_token_id=None,
        ),
        # DeepSeek-V2-Lite's kind: queries projected directly, a dense layer, then two with two of four experts per token chosen by
        # softmax, not renormalised, beside two shared experts; YaRN with its mscale and mscale_all_dim (0.707).
        "deepseek-v2-lite": lambda: transformers.DeepseekV2Config(
            **dict(moe, num_hidden_layers=3, **DEEPSEEK_LATENT), q_lora_rank=None, n_routed_experts=TINY_EXPERTS, moe_intermediate_size=256,
            n_shared_experts=2, first_k_dense_replace=1, topk_method="greedy", routed_scaling_factor=1.0,
            rope_parameters=dict(DEEPSEEK_YARN, mscale=0.707, mscale_all_dim=0.707), pad_token_id=None,
        ),
        # Seed-OSS-36B's kind: query, key and value biases, heads wider than hidden_size / heads.
        "seed-oss": lambda: transformers.SeedOssConfig(**common, head_dim=32, pad_token_id=None),
        # ERNIE 4.5 0.3B's kind: heads twice as wide as hidden_size / heads, RoPE on adjacent pairs, the head tied.
        "ernie4_5": lambda: transformers.Ernie4_5Config(**dict(common, **ERNIE_TOKEN_IDS), head_dim=32, tie_word_embeddings=True),
        # ERNIE 4.5 21B-A3B's kind: a dense layer, then two with two of four experts per token chosen by softmax scores plus a
        # bias per expert (moe_statics), renormalised, beside two shared experts; an output matrix of its own.
        "ernie4_5-moe": lambda: transformers.Ernie4_5_MoeConfig(
            **dict(moe, num_hidden_layers=3, **ERNIE_TOKEN_IDS), moe_num_experts=TINY_EXPERTS, moe_intermediate_size=256,
            moe_num_shared_experts=2, moe_layer_start_index=1, tie_word_embeddings=False,
        ),
        # gpt-oss's kind: a sliding-window layer (its window slides within the verify text) then a full one, attention biases and
        # sinks, two of four experts per token with biases and a clamped SwiGLU, gpt-oss's YaRN over the context it gives, its
        # correction range rounded as llama.cpp rounds it (test_gpt_oss_release_yarn_runs_as_llama_cpp_runs_it: unrounded).
        "gpt-oss": lambda: transformers.GptOssConfig(
            **dict(moe, max_position_embeddings=131072), num_local_experts=TINY_EXPERTS, sliding_window=TINY_SLIDING_WINDOW,
            rope_parameters=dict(GPT_OSS_ROPE, truncate=True),
        ),
    }


TINY_ARCHITECTURES = ("llama", "llama3-rope", "mistral", "qwen2", "qwen3", "gemma3")
# The families added for issue 31 and after (LFM2, Qwen 3.5, Ministral 3, OLMo 3, EXAONE 4), and of those the mixtures of experts.
TINY_MORE_FAMILIES = ("phi3", "phi4-mini", "gemma2", "granite", "smollm3", "olmo2", "mixtral", "qwen2moe", "qwen3moe", "olmoe", "lfm2",
                      "lfm2moe", "qwen35", "qwen35moe", "ministral3", "ministral3-vision", "olmo3", "exaone4",
                      "exaone4-hybrid", "granite4-hybrid", "granite4", "granite4-hybrid-moe", "granite4-moe", "glm4", "glm4moe",
                      "cohere2", "seed-oss", "gpt-oss", "ernie4_5", "ernie4_5-moe", "deepseek-v3", "deepseek-v2-lite")
TINY_MOE = ("mixtral", "qwen2moe", "qwen3moe", "olmoe", "lfm2moe", "qwen35moe", "granite4-hybrid-moe", "granite4-moe", "glm4moe", "gpt-oss",
            "ernie4_5-moe", "deepseek-v3", "deepseek-v2-lite")
# Their weights' seeds (and the tiny Llama's, which LoRA tests build on), chosen (of the first 40) so that transformers' greedy continuation of the
# verify text's first line has no two top logits within 0.2 for its first 16 tokens, and (experts)
# routes that text over all four with no router choice within 0.002 of flipping: a comparison with
# llama.cpp then covers enough tokens (tests/converters/test_more_families.py); LFM2's, one whose continuation
# does not settle on one token within those 16 (most of its seeds' repeat one from the third or fourth on); tied Ministral 3's
# (ministral3-vision), one whose top two stay 1.9 apart or more there and that changes token twice in them (a tied head's
# continuations mostly repeat one token); Qwen 3.5's, one whose Q8_0 perplexity is also within --verify's 3% (llama.cpp's Q8_0,
# from its own converter alike, moves this random model's by 1.7 to 5.6% as the seed goes: its DeltaNet's fused q, k, v most);
# tied EXAONE 4's (exaone4), the one whose top two stay furthest apart there of those that change token in them (none changes twice);
# EXAONE 4's 64-layer hybrid's, as Qwen 3.5's, one whose Q8_0 perplexity is within 3% (so many random layers make it sure of wrong
# tokens, perplexity ~1e11, and Q8_0 moves that by 0.2 to 3.2% as the seed goes); Qwen 3.5's and LFM2's mixtures of experts', likewise
# (LFM2-MoE's of the first 50 seeds: none that changes token twice or more in its first 16 has its Q8_0 perplexity within 3%).
# GLM-4.5's, one whose F16 perplexity is also within 0.5% (llama.cpp's F16 activations move this random model's by up to 2% as the seed goes).
# ERNIE 4.5's and DeepSeek-V2-Lite's mixtures of experts', one whose F32 perplexity is within 0.2% (ERNIE's seed 8's, 1%: a few router
# choices flip, each moving a token's log-probability by up to 6) and whose Q8_0 and Q4_K_M perplexities are within 1.2% and 12%, a
# room of 2.5 times within --verify's 3% and 30%, as the other families have, so another CPU's rounding stays within them (a router
# choice near a tie that its noise flips moves them most: of seeds 0-64 with 12 tokens before a near tie, Q8_0 moves either's by up
# to 6% and Q4_K_M ERNIE's by up to 68%, DeepSeek's by up to 36%; ERNIE's 64 and DeepSeek's 38 and 46 alone are within).
TINY_SEEDS = {"llama": 0, "llama-attention-bias": 0, "phi3": 1, "phi4-mini": 0, "gemma2": 0, "granite": 17, "smollm3": 3, "olmo2": 0,
              "mixtral": 24, "qwen2moe": 29, "qwen3moe": 17, "olmoe": 21, "lfm2": 16, "lfm2moe": 8, "qwen35moe": 10,
              "qwen35": 8, "ministral3": 14, "ministral3-vision": 22, "olmo3": 19, "exaone4": 35,
              "exaone4-hybrid": 10, "granite4": 32, "granite4-hybrid": 11, "granite4-hybrid-moe": 7, "granite4-moe": 3,
              "glm4": 7, "glm4moe": 39, "cohere2": 12, "seed-oss": 3, "ernie4_5": 0, "ernie4_5-moe": 64, "gpt-oss": 8, "deepseek-v3": 9, "deepseek-v2-lite": 38}
# Seed-OSS's split as its tokenizer.json holds it: Seed-Coder's regex with carriage return and newline as the characters themselves.
SEED_OSS_REGEX = SEED_CODER_REGEX.replace(r"\r", "\r").replace(r"\n", "\n")
TINY_TOKENIZER_REGEX = {"llama": LLAMA3_REGEX, "llama-attention-bias": LLAMA3_REGEX, "llama3-rope": LLAMA3_REGEX, "mistral": None, "qwen2": QWEN2_REGEX, "qwen3": QWEN2_REGEX,
                        "phi3": None, "phi4-mini": LLAMA3_REGEX, "gemma2": None, "granite": None, "smollm3": LLAMA3_REGEX,
                        "olmo2": None, "mixtral": None, "qwen2moe": QWEN2_REGEX, "qwen3moe": QWEN2_REGEX, "olmoe": None,
                        "lfm2": LLAMA3_REGEX, "lfm2moe": LLAMA3_REGEX, "qwen35": QWEN35_REGEX, "qwen35moe": QWEN35_REGEX, "ministral3": TEKKEN_REGEX, "ministral3-vision": TEKKEN_REGEX,
                        "olmo3": LLAMA3_REGEX, "granite4-hybrid": LLAMA3_REGEX, "granite4": LLAMA3_REGEX,
                        "granite4-hybrid-moe": LLAMA3_REGEX, "granite4-moe": LLAMA3_REGEX, "granite4-moe-unshared": LLAMA3_REGEX,
                        "exaone4": None, "exaone4-hybrid": None, "cohere2": None, "seed-oss": SEED_OSS_REGEX, "glm4": LLAMA3_REGEX, "glm4moe": LLAMA3_REGEX,
                        "gpt-oss": GPT4O_REGEX, "deepseek-v3": DEEPSEEK3_REGEXES, "deepseek-v2-lite": LLAMA3_REGEX}
# Families whose tokenizer splits digits one by one before the split above (Command R's, before GPT-2's byte-level split).
TINY_INDIVIDUAL_DIGITS = ("cohere2",)


# Gemma 4's tokenizer is Gemma 3's kind (a SentencePiece-style BPE in tokenizer.json) with chat markers of its
# own: the tests' is Gemma 3's, some of its unused tokens renamed to those markers.
GEMMA4_MARKERS = {"<unused0>": "<|channel>", "<unused1>": "<channel|>", "<unused2>": "<|tool_call>", "<unused3>": "<tool_call|>",
                  "<unused4>": '<|"|>'}


def gemma4_tokenizer_files(gemma3: Path, folder: Path) -> None:
    """Gemma 3's tokenizer.json and tokenizer_config.json with Gemma 4's markers, into `folder` (no tokenizer.model: Gemma 4 has none)."""
    tokenizer = json.loads((gemma3 / "tokenizer.json").read_text(encoding="utf-8"))
    vocab = tokenizer["model"]["vocab"]
    for old, new in GEMMA4_MARKERS.items():
        vocab[new] = vocab.pop(old)
    for entry in tokenizer["added_tokens"]:
        entry["content"] = GEMMA4_MARKERS.get(entry["content"], entry["content"])
    settings = json.loads((gemma3 / "tokenizer_config.json").read_text(encoding="utf-8"))
    for entry in settings.get("added_tokens_decoder", {}).values():
        entry["content"] = GEMMA4_MARKERS.get(entry["content"], entry["content"])
    (folder / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False), encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps(settings, ensure_ascii=False), encoding="utf-8")


@pytest.fixture(scope="session")
def reference_stack() -> None:
    """Skips a test unless torch and transformers (the `convert` extra) are installed."""
    if torch is None:
        pytest.skip("needs torch and transformers: pip install 'localchat[convert]'")


@pytest.fixture(scope="session")
def gemma_checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, reference_stack: None) -> Path:
    """Gemma 3 270M as a bf16 Hugging Face checkpoint, kept in pytest's cache between runs when it is on."""
    template = importlib.resources.files("localchat.assets").joinpath("templates/gemma.jinja").read_text()
    cache = getattr(request.config, "cache", None)
    folder = cache.mkdir("gemma-3-270m-hf") if cache is not None else tmp_path_factory.mktemp("gemma-3-270m-hf")
    return build_gemma3_270m_checkpoint(folder, template)


@pytest.fixture(scope="session")
def tiny_checkpoint(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, reference_stack: None) -> Callable[[str], Path]:
    """`tiny_checkpoint(name)`: a random-weight checkpoint with a real tokenizer, made once per run."""
    made: dict[str, Path] = {}

    def make(name: str) -> Path:
        if name in made:
            return made[name]
        folder = tmp_path_factory.mktemp(f"tiny-{name}")
        gemma4 = name in ("gemma4", "gemma4-vision")
        if gemma4:
            gemma4_tokenizer_files(request.getfixturevalue("gemma_checkpoint"), folder)
            tokenizer = None
            vocab_size = 262144
        elif name in ("gemma3", "gemma3-vision"):
            # Gemma's own SentencePiece tokenizer, with a 262k-row embedding to match it.
            gemma_checkpoint = request.getfixturevalue("gemma_checkpoint")
            tokenizer = transformers.AutoTokenizer.from_pretrained(gemma_checkpoint)
            (folder / "tokenizer.model").write_bytes((gemma_checkpoint / "tokenizer.model").read_bytes())
            vocab_size = 262144
        elif name in TINY_SENTENCEPIECE:
            (folder / "tokenizer.model").write_bytes(sentencepiece_model(TINY_SENTENCEPIECE_PIECES))
            tokenizer = None
            vocab_size = -(-TINY_SENTENCEPIECE_PIECES // 64) * 64
        else:
            tokenizer = bpe_tokenizer(TINY_TOKENIZER_REGEX[name], individual_digits=name in TINY_INDIVIDUAL_DIGITS)
            vocab_size = -(-len(tokenizer) // 64) * 64  # padded rows, as real checkpoints have
        config = _tiny_configs(vocab_size)[name]()
        torch.manual_seed(0)
        model = text_model_class(config.model_type).from_config(config)
        _randomize(model, seed=TINY_SEEDS.get(name, len(made)))
        _randomize_buffers(model, seed=TINY_SEEDS.get(name, len(made)))
        if gemma4 or name in ("gemma3", "gemma3-vision"):
            model = model.to(torch.bfloat16)  # as Google ships it; bf16 -> f16 is exact
        model.save_pretrained(folder)
        if tokenizer is not None:
            tokenizer.save_pretrained(folder)
        made[name] = folder
        return folder

    return make


# LoRA adapters made with peft on the tiny checkpoints.
LORA_ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
# Family -> the adapter's PEFT settings. Between them: LLaMA's reordered Q and K rows, Phi-3's fused
# matrices, Gemma 2, rsLoRA and a per-module alpha (folded into lora_b), a shared expert and
# attention in mixtures of experts.
ADAPTERS: dict[str, dict[str, object]] = {
    "llama": {"target_modules": "all-linear"},
    "phi3": {"target_modules": "all-linear"},
    "gemma2": {"target_modules": "all-linear"},
    "granite": {"target_modules": LORA_ATTENTION + ["down_proj"], "use_rslora": True, "alpha_pattern": {"o_proj": 3.0}},
    "qwen2moe": {"target_modules": LORA_ATTENTION + ["gate_proj", "up_proj", "down_proj"]},  # the shared expert's
    "mixtral": {"target_modules": LORA_ATTENTION},
}
RANK, ALPHA = 4, 8.0
# The random factors' seed and spread per family, chosen (of the first 40 seeds) so that transformers'
# greedy continuation with the adapter merged has no near tie in its first 16 tokens.
FACTORS: dict[str, tuple[int, float]] = {"llama": (0, 0.3), "phi3": (2, 0.3), "gemma2": (0, 0.3), "granite": (5, 0.15),
                                         "qwen2moe": (0, 0.3), "mixtral": (0, 0.3)}


def make_adapter(base: Path, folder: Path, seed: int, spread: float = 0.3, **settings: object) -> tuple[Path, Path]:
    """A PEFT LoRA adapter on `base` with random factors (PEFT starts B at 0, a no-op), and the
    base model with it merged, as a checkpoint for transformers: (adapter, merged)."""
    import peft
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    tuned = peft.get_peft_model(model, peft.LoraConfig(r=RANK, lora_alpha=ALPHA, **settings))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in tuned.named_parameters():
            if "lora_" in name:
                parameter.copy_(spread * torch.randn(parameter.shape, generator=generator))
    adapter, merged = folder / "adapter", folder / "merged"
    tuned.save_pretrained(adapter)
    tuned.merge_and_unload().save_pretrained(merged)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (base / name).is_file():
            shutil.copy(base / name, merged / name)
    return adapter, merged


@pytest.fixture(scope="session")
def tiny_lora(tiny_checkpoint: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], tuple[Path, Path]]:
    """`tiny_lora(name)`: a random PEFT LoRA adapter on `tiny_checkpoint(name)`, and that checkpoint
    with the adapter merged by peft: (adapter folder, merged checkpoint folder), made once per run."""
    made: dict[str, tuple[Path, Path]] = {}

    def make(name: str) -> tuple[Path, Path]:
        if name not in made:
            seed, spread = FACTORS[name]
            made[name] = make_adapter(tiny_checkpoint(name), tmp_path_factory.mktemp(f"lora-{name}"), seed, spread, **ADAPTERS[name])
        return made[name]

    return make
