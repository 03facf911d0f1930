"""A random-weight Llama-shaped checkpoint with a real BPE tokenizer, for measuring where no model can be downloaded.

    python benchmarks/gpu/make_model.py OUT_DIR TOKENIZER_DIR [--scale 1.5b|proxy|tiny]

1.5b: shaped like Llama 3.2 1B (untied 128k head, GQA 32/8; 1.5B parameters): the GPU check's model.
proxy: 1 layer of hidden size 128 and the same untied 128k head: on 2 CPU cores a step costs about 1 ms,
  as the 1.5B model's does on an H100/H200, so it puts the same pressure on localchat's Python per-token path.
tiny: 2 layers of 256, to check the scripts quickly.
Logits of std ~8 give clear greedy winners; every matrix has a gain of about 1 so the layers, not the
input token, decide the next one.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import torch
import transformers

SCALES = {
    "1.5b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                 num_key_value_heads=8, head_dim=64),
    "proxy": dict(hidden_size=128, intermediate_size=256, num_hidden_layers=1, num_attention_heads=2,
                  num_key_value_heads=1, head_dim=64),
    "tiny": dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=64),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("tokenizer", type=Path, help="a folder made by train_tokenizer.py")
    parser.add_argument("--scale", choices=SCALES, default="1.5b")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    config = transformers.LlamaConfig(
        vocab_size=128256, max_position_embeddings=131072, rms_norm_eps=1e-5, tie_word_embeddings=False,
        bos_token_id=0, eos_token_id=1,
        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 32.0, "low_freq_factor": 1.0,
                         "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
        **SCALES[args.scale])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    with torch.no_grad():
        model.model.embed_tokens.weight.normal_(0.0, 1.0)
        model.lm_head.weight.normal_(0.0, 8.0 / config.hidden_size ** 0.5)  # logits of std ~8: clear winners
        for _, parameter in model.model.layers.named_parameters():
            if parameter.ndim == 2:  # gain ~1 per matrix, so every layer moves the residual stream
                parameter.normal_(0.0, 1.0 / parameter.shape[1] ** 0.5)
            else:
                parameter.normal_(1.0, 0.2)
    model.save_pretrained(args.out)
    for file in args.tokenizer.iterdir():
        shutil.copy(file, args.out / file.name)
    print("checkpoint", args.out, f"{sum(p.numel() for p in model.parameters()) / 1e9:.3f}B parameters")


if __name__ == "__main__":
    main()
