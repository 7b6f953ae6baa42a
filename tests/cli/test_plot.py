"""mlmkit plot: the curves of one or several runs, and where each phase of a phased run begins."""

from __future__ import annotations

import pytest

from mlmkit.cli.plot import main as plot_main


@pytest.mark.slow
def test_plot_writes_one_png_for_one_or_several_runs(sweep, tmp_path):
    from PIL import Image

    assert plot_main([str(sweep / "0")]) == 0
    single = sweep / "0" / "curves.png"
    out = tmp_path / "cmp.png"
    assert plot_main([str(sweep / "0"), str(sweep / "1"), "--out", str(out)]) == 0
    c0, c1 = (31, 119, 180), (255, 127, 14)  # matplotlib's first two line colours
    for png, colours in ((single, [c0]), (out, [c0, c1])):
        with Image.open(png) as im:
            assert im.format == "PNG" and im.size == (1200, 800)
            pixels = set(im.convert("RGB").getdata())
        for colour in colours:  # one curve colour per run
            assert colour in pixels
        if png == single:
            assert c1 not in pixels


def test_plot_marks_where_each_phase_of_a_phased_run_begins(tmp_path, monkeypatch):
    import json

    import matplotlib.axes

    from mlmkit.cli.plot import plot_runs

    run = tmp_path / "run"
    run.mkdir()
    lines = [
        {"event": "phase", "step": 0, "phase": "short"},
        {"event": "baseline", "step": 0, "phase": "short"},
    ]
    lines += [
        {
            "event": "train",
            "step": s,
            "loss": 5.0 - s / 10,
            "lr": 1e-3,
            "tokens_per_s": 100.0,
            "phase": "short" if s <= 10 else "long",
        }
        for s in range(1, 21)
    ]
    lines.insert(12, {"event": "phase", "step": 10, "phase": "long"})
    (run / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    drawn, named = [], []
    monkeypatch.setattr(matplotlib.axes.Axes, "axvline", lambda ax, x, **kw: drawn.append(x))
    monkeypatch.setattr(
        matplotlib.axes.Axes, "annotate", lambda ax, text, *a, **kw: named.append(text)
    )
    plot_runs([run], tmp_path / "curves.png")
    assert drawn == [10] * 4 and named == ["long"]  # one line per panel; the later phase named once


def test_a_replaced_token_detection_run_shows_both_its_losses(tmp_path, monkeypatch):
    """objective=rtd: the generator's loss where a masked-LM run's loss is drawn beside it, the
    discriminator's in a panel of its own."""
    import json

    import matplotlib.axes

    from mlmkit.cli.plot import plot_runs

    runs = {"mlm": {"loss": 5.0}, "rtd": {"loss": 40.0, "mlm_loss": 6.0, "rtd_loss": 0.6}}
    for name, losses in runs.items():
        (tmp_path / name).mkdir()
        lines = [
            {"event": "train", "step": s, "lr": 1e-3, "tokens_per_s": 100.0, **losses}
            for s in (1, 2)
        ]
        (tmp_path / name / "metrics.jsonl").write_text("".join(json.dumps(e) + "\n" for e in lines))
    curves, titles = {}, {}
    monkeypatch.setattr(
        matplotlib.axes.Axes,
        "plot",
        lambda ax, x, y, **kw: curves.setdefault(id(ax), []).append(y[0]),
    )
    monkeypatch.setattr(
        matplotlib.axes.Axes, "set_title", lambda ax, title: titles.__setitem__(title, id(ax))
    )
    plot_runs([tmp_path / "mlm", tmp_path / "rtd"], tmp_path / "curves.png")
    assert curves[titles["generator loss (masked tokens)"]] == [5.0, 6.0]
    assert curves[titles["discriminator loss (replaced or not, every token)"]] == [0.6]
