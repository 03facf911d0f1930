"""The status bar's line at a given width: the live figures stay whole, the rest gives way."""

from __future__ import annotations

from localchat.tui.widgets.status import StatusBar

MODEL = "gemma-3-270m-q4_k_m"
FIGURES = "123.4 tok/s  TTFT 0.25s  ctx 1536/2048  RAM 1.2G"


def bar(**figures: object) -> StatusBar:
    status = StatusBar()
    values = {"state": "writing", "tokens_per_s": 123.4, "ttft_s": 0.25, "context_used": 1536, "context_size": 2048,
              "rss_bytes": int(1.2 * 1024**3), "backend": "llama.cpp", "model": MODEL} | figures
    for name, value in values.items():
        setattr(status, name, value)
    return status


def test_wide_shows_everything() -> None:
    line = bar().line(120).plain
    assert line.startswith(f"writing  {FIGURES}  ") and line.endswith(f"llama.cpp · {MODEL}") and len(line) == 120


def test_at_80_columns_the_backend_gives_way_first() -> None:
    line = bar().line(78).plain  # 80 columns less the bar's padding
    assert line == f"writing  {FIGURES}  {MODEL}"
    assert bar(state="ready", tokens_per_s=None, ttft_s=None).line(78).plain.endswith(f"llama.cpp · {MODEL}")


def test_then_the_time_to_first_token_then_the_model_name_is_cut() -> None:
    with_gpu = bar(gpu_bytes=3 * 1024**3).line(78).plain
    assert with_gpu.startswith("writing  123.4 tok/s  ctx 1536/2048  RAM 1.2G  GPU 3.0G  ") and with_gpu.endswith(f"  {MODEL}")
    narrow = bar().line(60).plain
    assert narrow == "writing  123.4 tok/s  ctx 1536/2048  RAM 1.2G  gemma-3-270m…" and len(narrow) == 60
    assert bar().line(47).plain.rstrip() == "writing  123.4 tok/s  ctx 1536/2048  RAM 1.2G"


def test_in_a_small_terminal_the_figures_stay_whole_in_a_compact_form() -> None:
    assert bar().line(40).plain == "writing 123.4t/s ctx 1536/2048 RAM 1.2G "  # 40 columns: the bar has no padding there
    assert bar(left_out=3).line(44).plain.rstrip() == "writing 123.4t/s ctx 1536/2048 (3 out) RAM 1.2G"
    assert bar(state="loading", context_size=0, tokens_per_s=None, backend="").line(20).plain.rstrip() == "loading RAM 1.2G"


def test_before_a_model_is_loaded_only_the_figures_show() -> None:
    assert bar(state="loading", tokens_per_s=None, ttft_s=None, context_size=0, backend="", model="").line(78).plain.rstrip() == "loading  RAM 1.2G"
