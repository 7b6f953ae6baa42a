"""Linear probes (mlmkit.evaluation.probe): the regression, the sentence vectors, the task's
data, and the probes a pretraining run logs (probe.every)."""

from __future__ import annotations

import pytest
import torch
from batches import _model
from runs import events, run_train
from runs import write_probe_task as _write_task

from mlmkit.config import ProbeConfig, TaskConfig
from mlmkit.errors import ConfigError, DataError
from mlmkit.evaluation.probe import (
    LinearProbe,
    encode_with,
    fit_and_score,
    probe_for_run,
    sentence_vectors,
)


def _gaussians(n: int, shift: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, 2, (n,), generator=g)
    x = torch.randn(n, 16, generator=g)
    x[:, 3] += shift * (2 * y - 1)  # one informative direction, the rest noise
    return x * 5 + 3, y  # not standardised: fit_and_score standardises


def test_the_regression_finds_a_separable_direction_and_not_one_in_noise():
    x, y = _gaussians(600, 3.0, seed=0)
    dx, dy = _gaussians(400, 3.0, seed=1)
    figures = fit_and_score(x, y, dx, dy, n_classes=2)
    assert figures["probe_accuracy"] > 0.97 and figures["probe_train_accuracy"] > 0.97
    # labels drawn apart from the vectors: nothing to find, chance on the dev set
    noise = fit_and_score(
        x,
        torch.randint(0, 2, (600,), generator=torch.Generator().manual_seed(2)),
        dx,
        dy,
        n_classes=2,
    )
    assert 0.38 < noise["probe_accuracy"] < 0.62
    assert (
        noise["probe_l2"] >= figures["probe_l2"]
    )  # the held-out fifth asks for more penalty on noise


def test_sentence_vectors_do_not_depend_on_batching_or_padding(tokenizer):
    model = _model(tokenizer)
    model.eval()
    encode, device = encode_with(model.base_model)
    texts = [
        ["a short one"],
        ["a much longer sentence that needs more tokens than the others do"],
        ["two"],
        ["the third sentence, of middling length"],
    ]
    together = sentence_vectors(encode, tokenizer, texts, batch_size=3)
    alone = torch.cat([sentence_vectors(encode, tokenizer, [t], batch_size=1) for t in texts])
    assert together.shape == (4, model.config.hidden_size)
    torch.testing.assert_close(together, alone, rtol=1e-4, atol=1e-5)  # rows in the caller's order
    pairs = sentence_vectors(encode, tokenizer, [["a premise", "a hypothesis"], ["b", "c"]])
    assert pairs.shape == (2, model.config.hidden_size) and torch.isfinite(pairs).all()


def test_a_training_objective_gives_its_encoders_states_without_labels(tokenizer):
    """The run's probe goes through the prepared objective's forward (every engine's hooks):
    without labels it returns the encoder's last states, the same as the encoder alone."""
    from mlmkit.model.bert import MaskedLM

    model = _model(tokenizer)
    objective = MaskedLM(model).eval()
    enc = tokenizer(
        ["a sentence to encode", "and a second, longer sentence to encode"],
        padding=True,
        return_tensors="pt",
    )
    states = objective(
        input_ids=enc["input_ids"],
        attention_mask=enc["attention_mask"],
        token_type_ids=enc["token_type_ids"],
    )["last_hidden_state"]
    torch.testing.assert_close(states, model.base_model(**enc).last_hidden_state)


def test_a_probe_scores_an_encoder_in_eval_mode_and_leaves_its_mode(tmp_path, tokenizer):
    folder = _write_task(tmp_path / "task")
    probe = probe_for_run(ProbeConfig(every=1, task=TaskConfig(data_dir=str(folder))))
    model = _model(tokenizer, hidden_dropout_prob=0.5)  # dropout would make the states random
    model.train()
    first, again = (
        probe.score(model.base_model, tokenizer),
        probe.score(model.base_model, tokenizer),
    )
    assert model.training
    assert first["probe_accuracy"] == again["probe_accuracy"]
    assert first["probe_train_accuracy"] == again["probe_train_accuracy"]


def test_a_probe_reads_its_task_and_refuses_what_it_cannot_use(tmp_path):
    folder = _write_task(tmp_path / "task")
    probe = probe_for_run(
        ProbeConfig(every=5, task=TaskConfig(data_dir=str(folder)), max_train_samples=60)
    )
    assert len(probe.train_texts) == 60 and len(probe.eval_texts) == 40 and probe.n_classes == 2
    assert probe_for_run(ProbeConfig(every=0)) is None  # no probe asked for: no data read
    with pytest.raises(DataError, match=r"probe\.task\.data_dir"):  # the setting's name in a run
        probe_for_run(ProbeConfig(every=5, task=TaskConfig(data_dir=str(tmp_path / "absent"))))
    with pytest.raises(ConfigError, match="regression task; a probe classifies sentences"):
        ProbeConfig(every=5, task=TaskConfig(kind="regression", labels=[], metrics=[]))
    tokens = TaskConfig(name="ner", kind="tokens", train_file="a", eval_file="b", metrics=[])
    with pytest.raises(ConfigError, match="probe.task=ner is a tokens task; a probe classifies"):
        ProbeConfig(every=5, task=tokens)
    (folder / "one.tsv").write_text(
        "sentence\tlabel\nonly good\t1\nstill good\t1\n", encoding="utf-8"
    )
    with pytest.raises(ConfigError, match="hold one class"):
        LinearProbe.from_task(TaskConfig(data_dir=str(folder), train_file="one.tsv"))


@pytest.mark.slow
def test_a_run_probes_its_random_init_every_n_steps_and_at_the_end(tmp_path, cache_dir):
    from PIL import Image

    from mlmkit.cli.plot import main as plot_main

    folder = _write_task(tmp_path / "task")
    run = tmp_path / "run"
    run_train(
        run,
        cache_dir,
        "train.max_steps=12",
        "train.eval_every=6",
        "logger=none",
        "probe.every=5",
        f"probe.task.data_dir={folder}",
    )
    probes = events(run, "probe")
    assert [p["step"] for p in probes] == [0, 5, 10, 12]  # the random init, every 5, the last step
    for p in probes:
        assert 0.0 <= p["probe_accuracy"] <= 1.0 and p["probe_task"] == "sst2"
        assert p["probe_train_examples"] == 80 and p["probe_eval_examples"] == 40
    log = (run / "train.log").read_text()
    assert "Probe: sst2, 80 training and 40 dev examples, every 5 steps" in log
    assert "step 12 | probe sst2 accuracy" in log
    # the curves gain the probe's panel
    assert plot_main([str(run)]) == 0
    with Image.open(run / "curves.png") as im:
        assert im.size == (1800, 800)
    # a resume probes on from where it was, not its random init again
    run_train(
        run,
        cache_dir,
        "train.max_steps=16",
        "train.eval_every=6",
        "logger=none",
        "probe.every=5",
        f"probe.task.data_dir={folder}",
        "train.resume=auto",
    )
    assert [p["step"] for p in events(run, "probe")] == [0, 5, 10, 12, 15, 16]


def test_a_missing_probe_task_is_refused_before_the_run_writes_anything(tmp_path, cache_dir):
    run = tmp_path / "run"
    proc = run_train(
        run,
        cache_dir,
        "train.max_steps=2",
        "logger=none",
        "probe.every=1",
        f"probe.task.data_dir={tmp_path / 'nowhere'}",
        check=False,
    )
    assert proc.returncode != 0
    assert "probe.task.data_dir" in proc.stderr and "Traceback" not in proc.stderr
    # nothing but Hydra's record of the command line (.hydra/, written before any run starts)
    assert [p for p in run.rglob("*") if p.is_file() and ".hydra" not in p.parts] == []
