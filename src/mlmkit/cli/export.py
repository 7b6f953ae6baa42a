"""``mlmkit export <checkpoint | run dir> <out dir>``: a checkpoint as a plain model dir.

Writes what a run's ``final/`` holds (config.json, model.safetensors, the tokenizer, the model
card and the sentence-transformers files) for any ``checkpoints/step_*`` folder, or for a run
dir's latest checkpoint when the run has not finished; the dir loads with transformers'
``AutoModelForMaskedLM``, ``pipeline("fill-mask")`` and ``SentenceTransformer``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mlmkit.cli.errors import ArgumentParser
from mlmkit.errors import ConfigError


def checkpoint_record(resolved: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """Return (the settings the checkpoint was trained under, its step and tokens seen); empty for
    a model dir or a checkpoint written before settings were recorded."""
    try:
        state = json.loads((resolved / "loop_state.json").read_text())
    except (OSError, ValueError):
        return {}, {}
    if not isinstance(state, dict):
        return {}, {}
    settings = state.get("settings") if isinstance(state.get("settings"), dict) else {}
    summary = {"step": state.get("step"), "tokens_seen": state.get("tokens_seen")}
    return settings, {**summary, **logged_evaluation(resolved.parent.parent, state.get("step"))}


def logged_evaluation(run_dir: Path, step) -> dict[str, Any]:
    """Return the figures the run logged for ``step`` in its metrics.jsonl: the evaluation at that
    step and the most-frequent-token baseline, as a finished run's model card has them (empty where
    the run evaluated nothing at that step, or logged nothing readable)."""
    from mlmkit.errors import DataError
    from mlmkit.training.metrics_log import read_metrics

    try:
        events = read_metrics(run_dir)
    except (OSError, DataError):
        return {}
    found: dict[str, Any] = {}
    for kind in ("eval", "baseline"):
        logged = [
            e
            for e in events
            if e["event"] == kind and (kind == "baseline" or e.get("step") == step)
        ]
        if logged:
            found.update(
                {k: v for k, v in logged[-1].items() if k not in ("event", "step", "phase")}
            )
    return found


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="mlmkit export", description=__doc__.split("\n")[0])
    parser.add_argument("checkpoint", help="a checkpoints/step_* folder, a run dir or a model dir")
    parser.add_argument("out", help="the model dir to write (must not exist yet)")
    args = parser.parse_args(argv)
    out = Path(args.out).expanduser()
    if out.exists():
        raise ConfigError(
            f"The export folder {str(out)!r} already exists; choose a new one, so "
            "that nothing already there is overwritten."
        )
    from mlmkit.export.final import export_final
    from mlmkit.training.trained_model import load_model_and_tokenizer

    model, tokenizer, resolved = load_model_and_tokenizer(args.checkpoint)
    settings, summary = checkpoint_record(resolved)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        export_final(model, tokenizer, out, config=settings, summary=summary)
    except OSError as exc:
        raise ConfigError(
            f"Cannot write the export folder {str(out)!r} ({exc.strerror or exc}); "
            "choose a writable place with free space."
        ) from None
    print(f"Exported {resolved} to {out}")
    return 0
