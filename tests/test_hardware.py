"""GPU numbering as CUDA sees it (pure logic on described GPUs)."""

from __future__ import annotations

import pytest

from localchat.hardware import cuda_visible

UUIDS = ("GPU-3f0a1c2e", "GPU-8b7d6e5f", "GPU-3f9e8d7c")


@pytest.mark.parametrize(
    ("setting", "visible"),
    [
        (None, [0, 1, 2]),
        ("2,0", [2, 0]),
        (" 1 , 2", [1, 2]),
        ("GPU-8b,0", [1, 0]),
        # CUDA stops at the first entry that names no GPU, or names one twice.
        ("0,7,1", [0]),
        ("1,1,2", [1]),
        ("GPU-3f", []),  # two UUIDs start so
        ("-1", []),
        ("", []),
        ("MIG-1234", []),
    ],
)
def test_cuda_visible_devices_picks_and_renumbers_gpus(setting: str | None, visible: list[int]) -> None:
    assert cuda_visible(setting, UUIDS) == visible
