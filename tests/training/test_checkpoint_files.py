"""Checkpoint folders: written whole or not at all (a full disk keeps the previous one)."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from runs import (
    limited_file_size,
)

from mlmkit.errors import CheckpointError
from mlmkit.training.checkpoint_files import save_checkpoint


class _FullDisk:
    """An accelerator whose save_state fails as a full disk does, halfway through."""

    is_main_process = True

    def wait_for_everyone(self):
        pass

    def save_state(self, path, safe_serialization=True):
        Path(path).mkdir(parents=True, exist_ok=True)
        (Path(path) / "model.safetensors").write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")


def test_full_disk_during_save_keeps_the_previous_checkpoint(tmp_path):
    ckpt_dir = tmp_path / "checkpoints"
    good = ckpt_dir / "step_0000010"
    good.mkdir(parents=True)
    (good / "loop_state.json").write_text("{}")
    with pytest.raises(CheckpointError) as info:
        save_checkpoint(_FullDisk(), ckpt_dir, 20, {"step": 20}, keep_last=1)
    message = str(info.value)
    assert "No space left on device" in message and "step_0000010" in message
    assert "train.keep_last" in message
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["step_0000010"]  # no partial folder


class _WritesState:
    """An accelerator whose save_state writes weights with safetensors and optimizer state
    with torch.save, as accelerate does."""

    is_main_process = True

    def wait_for_everyone(self):
        pass

    def save_state(self, path, safe_serialization=True):
        import torch
        from safetensors.torch import save_file

        Path(path).mkdir(parents=True, exist_ok=True)
        save_file({"w": torch.zeros(10_000)}, Path(path) / "model.safetensors")  # 40 kB
        torch.save({"m": torch.zeros(30_000)}, Path(path) / "optimizer.bin")  # 120 kB


@pytest.mark.parametrize(
    "limit", [20_000, 80_000]
)  # the weights, or the optimizer state, too large
def test_full_disk_in_safetensors_or_torch_keeps_the_previous_checkpoint(tmp_path, limit):
    ckpt_dir = tmp_path / "checkpoints"
    save_checkpoint(_WritesState(), ckpt_dir, 10, {"step": 10}, keep_last=2)
    before = {p.name: p.read_bytes() for p in (ckpt_dir / "step_0000010").iterdir()}
    with limited_file_size(limit), pytest.raises(CheckpointError) as info:
        save_checkpoint(_WritesState(), ckpt_dir, 20, {"step": 20}, keep_last=2)
    message = str(info.value)
    assert message.startswith("Could not write the step-20 checkpoint")
    if limit < 40_000:  # torch's own text varies with where the write stopped
        assert "File too large" in message
    assert "(from step_0000010, which is intact)." in message and "\n" not in message
    assert sorted(p.name for p in ckpt_dir.iterdir()) == ["step_0000010"]  # no partial folder
    assert {p.name: p.read_bytes() for p in (ckpt_dir / "step_0000010").iterdir()} == before
