"""Hydra multirun sweeps and their table (mlmkit sweep)."""

from __future__ import annotations

import pytest
from runs import events

from mlmkit.cli.sweep import format_table, sweep_table
from mlmkit.cli.sweep import main as sweep_main


@pytest.mark.slow
def test_sweep_table_lists_every_run_best_first(sweep, capsys):
    rows = sweep_table([sweep])
    assert sorted(r["run"] for r in rows) == ["0", "1"]
    assert {r["overrides"] for r in rows} == {"optim.lr=0.0001", "optim.lr=0.003"}
    for r in rows:  # each row holds that run's last evaluation
        last = events(sweep / r["run"], "eval")[-1]
        assert r["step"] == 20 and r["eval_accuracy"] == last["eval_accuracy"]
    assert rows[0]["eval_accuracy"] >= rows[1]["eval_accuracy"]
    assert rows[0]["overrides"] == "optim.lr=0.003"  # a 30x larger rate learns more in 20 steps
    assert sweep_main([str(sweep)]) == 0
    out = capsys.readouterr().out
    assert out == format_table(rows) + "\n" and "optim.lr=0.0001" in out
    assert sweep_main([str(sweep), "--csv"]) == 0
    assert capsys.readouterr().out.splitlines()[0].startswith("run,overrides,step")


def test_plot_and_sweep_refuse_folders_without_runs(tmp_path, capsys):
    from mlmkit.cli import main

    assert main(["plot", str(tmp_path)]) == 2
    assert main(["sweep", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("Error:") == 2 and "metrics.jsonl" in err
