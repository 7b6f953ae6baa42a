"""metrics.jsonl: one JSON object per event of a run (train, eval, baseline, ...)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


class MetricsLog:
    """Appends one JSON object per event to ``metrics.jsonl`` (main process only)."""

    def __init__(self, path: Path, enabled: bool = True) -> None:
        self.path = Path(path)
        self.enabled = enabled

    def _split(self, step: int) -> tuple[list[str], list[str]]:
        """Split the lines of events into those up to ``step`` and those after it."""
        kept, later = [], []
        if not self.enabled or not self.path.is_file():
            return kept, later
        for line in self.path.read_text().splitlines():
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a kill
            (kept if event.get("step", 0) <= step else later).append(line)
        return kept, later

    def events_after(self, step: int) -> list[str]:
        return self._split(step)[1]

    def truncate_after(self, step: int) -> None:
        """Drop events after ``step`` (a resumed run rewrites them), keeping the rest."""
        if not self.enabled or not self.path.is_file():
            return
        kept, _ = self._split(step)
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(k + "\n" for k in kept))
        tmp.replace(self.path)

    def write(self, event: dict[str, Any]) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(event) + "\n")


def read_metrics(run_dir: str | Path) -> list[dict[str, Any]]:
    """Read the events of a run's metrics.jsonl (JSON objects with an ``event`` name); a line cut
    by a kill, or anything else, is passed over. One sentence when there is no event."""
    from mlmkit.errors import DataError

    path = Path(run_dir) / "metrics.jsonl"
    events = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and isinstance(event.get("event"), str):
            events.append(event)
    if not events:
        raise DataError(
            f'{str(path)!r} holds no events (JSON lines with an "event" name); pass '
            "the dirs of runs that have logged."
        )
    return events
