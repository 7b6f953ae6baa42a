"""A guard for code that must not wait for the device."""

from __future__ import annotations

from mlmkit.training.doctor import HostReads


class NoHostReads(HostReads):
    """Fails a test that reads a tensor's value on the host (``bool``, ``float``, ``int``,
    ``item``, ``tolist``) inside it: on a GPU each is a wait for the device (``mlmkit doctor``'s
    count, refusing)."""

    def __init__(self) -> None:
        super().__init__("cpu", refuse=True)

    def __enter__(self) -> NoHostReads:
        super().__enter__()
        self.counting = True
        return self
