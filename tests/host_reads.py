"""A guard for code that must not wait for the device."""

from __future__ import annotations

import torch


class NoHostReads:
    """Fails a test that reads a tensor's value on the host (``bool``, ``float``, ``int``,
    ``item``, ``tolist``): on a GPU each is a wait for the device."""

    NAMES = ("__bool__", "__float__", "__int__", "item", "tolist")

    def __init__(self, monkeypatch) -> None:
        self.monkeypatch = monkeypatch

    def __enter__(self):
        def refuse(name):
            def read(self, *args, **kwargs):
                raise AssertionError(f"a host read of a tensor: Tensor.{name}")
            return read
        for name in self.NAMES:
            self.monkeypatch.setattr(torch.Tensor, name, refuse(name))
        return self

    def __exit__(self, *exc):
        self.monkeypatch.undo()
