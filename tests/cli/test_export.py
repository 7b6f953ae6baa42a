"""``mlmkit export`` of a checkpoint taken mid-run: its model card carries that step's own
evaluation from the run's metrics.jsonl, as a finished run's final/ card does."""

from __future__ import annotations

import json

from mlmkit.cli import main


def test_a_mid_run_checkpoints_card_has_the_evaluation_logged_at_its_step(
    trained_run, tmp_path, capsys
):
    events = [json.loads(line) for line in (trained_run / "metrics.jsonl").read_text().splitlines()]
    evals = {e["step"]: e for e in events if e["event"] == "eval"}
    baseline = next(e for e in events if e["event"] == "baseline")
    assert {15, 30} <= set(evals) and evals[15]["eval_loss"] != evals[30]["eval_loss"]
    out = tmp_path / "step15"
    assert main(["export", str(trained_run / "checkpoints" / "step_0000015"), str(out)]) == 0
    card = (out / "README.md").read_text()
    table = card[card.index("| metric | value |") : card.index("## Use")]
    for key in ("eval_loss", "eval_accuracy", "eval_perplexity", "eval_tokens"):
        value = evals[15][key]
        assert (
            f"| {key} | {value:.4f} |" if isinstance(value, float) else f"| {key} | {value} |"
        ) in table, key
    assert f"| baseline_accuracy | {baseline['baseline_accuracy']:.4f} |" in table
    assert f"| eval_loss | {evals[30]['eval_loss']:.4f} |" not in table  # the later step's
    assert "| step | 15 |" in table and "15 optimizer steps" in card
    assert (
        f"Exported {trained_run / 'checkpoints' / 'step_0000015'} to {out}"
        in capsys.readouterr().out
    )
