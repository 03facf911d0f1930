"""Model names and the GGUF file(s) a name picks in a repo: pure logic over file lists."""

from __future__ import annotations

import pytest

from localchat.errors import ModelError
from localchat.hub import (
    HubModelName,
    gguf_models,
    missing_model_error,
    quant_label,
    select_model,
)


@pytest.mark.parametrize(
    ("text", "repo_id", "tag"),
    [
        ("bartowski/Llama-3.2-1B-Instruct-GGUF", "bartowski/Llama-3.2-1B-Instruct-GGUF", None),
        ("bartowski/Llama-3.2-1B-Instruct-GGUF:Q8_0", "bartowski/Llama-3.2-1B-Instruct-GGUF", "Q8_0"),
        ("unsloth/gpt-oss-20b-GGUF:q4_k_m", "unsloth/gpt-oss-20b-GGUF", "q4_k_m"),
        ("hf.co/ggml-org/gemma-3-270m-it-GGUF:Q8_0", "ggml-org/gemma-3-270m-it-GGUF", "Q8_0"),
        ("huggingface.co/Qwen/Qwen2.5-0.5B-Instruct-GGUF", "Qwen/Qwen2.5-0.5B-Instruct-GGUF", None),
        ("https://huggingface.co/Qwen/Qwen2.5-0.5B-Instruct-GGUF:UD-Q4_K_XL", "Qwen/Qwen2.5-0.5B-Instruct-GGUF", "UD-Q4_K_XL"),
        ("hf.co/user/repo:latest", "user/repo", None),  # Ollama's default tag
    ],
)
def test_hub_names_in_every_form(text: str, repo_id: str, tag: str | None) -> None:
    assert HubModelName.parse(text) == HubModelName(repo_id, tag)


@pytest.mark.parametrize("text", ["gemma-3-270m", "models/foo.gguf", "./user/repo", "/abs/path", "a/b/c", "~/x/y", "user/re..po", "us--er/repo"])
def test_paths_and_plain_names_are_not_hub_names(text: str) -> None:
    assert HubModelName.parse(text) is None


@pytest.mark.parametrize("text", ["hf.co/user", "hf.co/user/repo/file.gguf", "huggingface.co/"])
def test_a_malformed_hub_address_is_one_clear_line(text: str) -> None:
    with pytest.raises(ModelError, match=r"not a Hugging Face model name: write hf.co/USER/REPO"):
        HubModelName.parse(text)


@pytest.mark.parametrize(
    ("filename", "label"),
    [
        ("gemma-3-270m-it-Q4_K_M.gguf", "Q4_K_M"),
        ("llama-2-7b.Q8_0.gguf", "Q8_0"),
        ("qwen2.5-7b-instruct-q4_k_m-00001-of-00002.gguf", "Q4_K_M"),
        ("Qwen3-30B-A3B-UD-Q4_K_XL.gguf", "UD-Q4_K_XL"),
        ("Meta-Llama-3.1-8B-Instruct-Q6_K_L.gguf", "Q6_K_L"),
        ("Llama-3.2-1B-Instruct-IQ4_XS.gguf", "IQ4_XS"),
        ("gpt-oss-20b-MXFP4.gguf", "MXFP4"),
        ("Qwen2-7B-bf16.gguf", "BF16"),
        ("Q4_K_M/DeepSeek-R1-Q4_K_M-00001-of-00009.gguf", "Q4_K_M"),
        ("model.gguf", None),
    ],
)
def test_quant_label_of_real_file_names(filename: str, label: str | None) -> None:
    assert quant_label(filename) == label


REPO = [
    "README.md",
    "mmproj-model-f16.gguf",
    "model-Q8_0.gguf",
    "model-Q5_K_M.gguf",
    "model-Q3_K_M.gguf",
    "Q6_K/model-Q6_K-00002-of-00002.gguf",
    "Q6_K/model-Q6_K-00001-of-00002.gguf",
    "BF16/model-BF16-00001-of-00003.gguf",  # part 2 and 3 missing: not a model
]


def test_models_are_single_files_and_complete_split_sets_without_projectors() -> None:
    assert [m.files for m in gguf_models(REPO)] == [
        ("Q6_K/model-Q6_K-00001-of-00002.gguf", "Q6_K/model-Q6_K-00002-of-00002.gguf"),
        ("model-Q3_K_M.gguf",),
        ("model-Q5_K_M.gguf",),
        ("model-Q8_0.gguf",),
    ]


@pytest.mark.parametrize(
    ("tag", "first"),
    [
        ("q6_k", "Q6_K/model-Q6_K-00001-of-00002.gguf"),  # any case; a split model by its first part
        ("Q8_0", "model-Q8_0.gguf"),
        ("Q5_K_M", "model-Q5_K_M.gguf"),
        ("Q4_K_M", None),
        ("K_M", None),  # a fragment of a label is not a tag
    ],
)
def test_a_tag_picks_its_file(tag: str, first: str | None) -> None:
    picked = select_model(HubModelName("user/repo", tag), gguf_models(REPO))
    assert (picked.first if picked else None) == first


@pytest.mark.parametrize(
    ("files", "picked"),
    [
        (["m-Q8_0.gguf", "m-Q4_K_M.gguf", "m-Q4_K_S.gguf"], "m-Q4_K_M.gguf"),
        (["m-Q8_0.gguf", "m-Q4_K_S.gguf", "m-Q5_K_M.gguf"], "m-Q4_K_S.gguf"),  # nearest to Q4_K_M in bits
        (["m-Q8_0.gguf", "m-Q6_K.gguf", "m-Q3_K_M.gguf"], "m-Q3_K_M.gguf"),
        (["m-Q8_0.gguf", "m-F16.gguf"], "m-Q8_0.gguf"),
        (["m-UD-Q4_K_XL.gguf", "m-Q5_K_M.gguf"], "m-UD-Q4_K_XL.gguf"),
        (["weights.gguf"], "weights.gguf"),  # the only model there is
        (["a.gguf", "b.gguf"], None),
        ([], None),
    ],
)
def test_without_a_tag_q4_k_m_or_the_nearest(files: list[str], picked: str | None) -> None:
    model = select_model(HubModelName("user/repo"), gguf_models(files))
    assert (model.first if model else None) == picked


def test_a_missing_quant_lists_what_the_repo_has() -> None:
    error = missing_model_error(HubModelName("user/repo", "Q4_K_M"), gguf_models(REPO))
    assert str(error) == (
        "user/repo has no Q4_K_M file; it has: Q6_K, Q3_K_M, Q5_K_M, Q8_0 (for example `localchat pull user/repo:Q6_K`)"
    )


def test_a_repo_without_gguf_files_points_to_convert() -> None:
    error = missing_model_error(HubModelName("user/checkpoint"), gguf_models(["model.safetensors", "config.json"]))
    assert "user/checkpoint has no GGUF model files" in str(error) and "localchat convert user/checkpoint --to gguf" in str(error)
