"""A command refused for any reason writes nothing: every file of the run dirs already there
(a pretraining run, a damaged copy of one, a fine-tuning, a GLUE evaluation, an export, a
tokenizer) keeps its bytes, and no file appears or goes, whatever the command and wherever it
stops (Hydra's composition, the schema, the run dir's lock, a resume that would mix runs, the
data, the model, the checkpoint, a fine-tuning's or a tokenizer's own checks).

Every command runs in this process (``mlmkit.cli.main``); the run dirs are made once, by the
commands themselves.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import pickle
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from runs import SMALLEST, run_cli

# the smallest run that trains, evaluates, checkpoints and exports
TINY = [*SMALLEST, "train.eval_every=2", "optim.warmup_steps=1"]
FINETUNE = ["epochs=1", "batch_size=8", "max_seq_length=32", "precision=no"]


def run_command(argv: list) -> int:
    """``mlmkit <argv>`` in this process (``runs.run_cli``): its exit status."""
    return run_cli(*argv).returncode


def snapshot(*folders: Path) -> dict[str, str]:
    """Every file under ``folders`` (hidden ones too: .hydra/, .lock): its path and a hash of
    its bytes."""
    return {
        str(p): hashlib.sha256(p.read_bytes()).hexdigest()
        for folder in folders
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _corpus(path: Path) -> Path:
    from pydoc_data.topics import topics

    path.write_text("\n\n".join(topics[key].strip() for key in sorted(topics)[:40]))
    return path


def _labelled(folder: Path) -> Path:
    """A labelled CSV file (task=files) and a GLUE-format SST-2 folder, of a few sentences."""
    rows = [
        (f"a good film, number {i}", "pos") if i % 2 else (f"a bad film, number {i}", "neg")
        for i in range(24)
    ]
    (folder / "own.csv").write_text("text,label\n" + "".join(f"{t},{lab}\n" for t, lab in rows))
    sst2 = folder / "glue" / "SST-2"
    sst2.mkdir(parents=True)
    for split in ("train.tsv", "dev.tsv"):
        (sst2 / split).write_text(
            "sentence\tlabel\n" + "".join(f"{t}\t{int(lab == 'pos')}\n" for t, lab in rows)
        )
    return folder / "own.csv"


@pytest.fixture(scope="module")
def fx(tmp_path_factory, cache_dir):
    """The run dirs every case must leave as they are, made by the commands themselves."""
    tmp = tmp_path_factory.mktemp("refusals")
    fx = SimpleNamespace(
        tmp=tmp,
        corpus=_corpus(tmp / "corpus.txt"),
        own=_labelled(tmp),
        run=tmp / "run",
        finetuned=tmp / "finetuned",
        glue=tmp / "glue-run",
        export=tmp / "export",
        tok=tmp / "tok",
        damaged=tmp / "damaged",
        afile=tmp / "afile",
        cache=cache_dir,
    )
    fx.afile.write_text("a file where a folder is expected\n")
    fx.train = [
        "train",
        *TINY,
        "data=files",
        f"data.train_files=[{fx.corpus}]",
        f"paths.cache_dir={cache_dir}",
    ]
    assert run_command([*fx.train, f"hydra.run.dir={fx.run}"]) == 0
    assert (
        run_command(
            [
                "finetune",
                f"checkpoint={fx.run}",
                "task=files",
                f"task.train_file={fx.own}",
                f"task.eval_file={fx.own}",
                f"hydra.run.dir={fx.finetuned}",
                *FINETUNE,
            ]
        )
        == 0
    )
    assert (
        run_command(
            [
                "glue",
                f"checkpoint={fx.run}",
                f"data_dir={tmp / 'glue'}",
                "tasks=[sst2]",
                "epochs=1",
                "lrs=[1e-4]",
                "batch_size=8",
                "max_seq_length=32",
                "precision=no",
                f"hydra.run.dir={fx.glue}",
            ]
        )
        == 0
    )
    assert run_command(["export", fx.run / "checkpoints" / "step_0000002", fx.export]) == 0
    assert (
        run_command(
            [
                "tokenizer",
                "data=files",
                f"data.train_files=[{fx.corpus}]",
                "tokenizer.vocab_size=200",
                f"out={fx.tok}",
            ]
        )
        == 0
    )
    # a copy of the run whose latest checkpoint's RNG state would run code when unpickled
    shutil.copytree(fx.run, fx.damaged, ignore=shutil.ignore_patterns("final"))

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {tmp / 'code-ran'}",))

    (fx.damaged / "checkpoints" / "step_0000004" / "random_states_0.pkl").write_bytes(
        pickle.dumps(Exploit())
    )
    fx.cut = shutil.copytree(
        fx.run / "final", tmp / "cut"
    )  # a model dir whose weights are cut short
    weights = (fx.cut / "model.safetensors").read_bytes()
    (fx.cut / "model.safetensors").write_bytes(weights[: len(weights) // 2])
    fx.dirs = [fx.run, fx.finetuned, fx.glue, fx.export, fx.tok, fx.damaged, fx.cut]
    for folder in fx.dirs:
        assert any(folder.iterdir()), folder
    assert (fx.run / ".hydra" / "config.yaml").is_file() and (
        fx.finetuned / ".hydra" / "overrides.yaml"
    ).is_file()
    return fx


@dataclass(frozen=True)
class Case:
    id: str
    argv: Callable[[SimpleNamespace], list]
    needles: tuple[str, ...]  # each is in the error sentence
    before: Callable[[SimpleNamespace], Callable[[], None]] | None = (
        None  # sets up; returns the undo
    )


def _in_run(fx, *overrides: str, run: Path | None = None) -> list:
    return [*fx.train, f"hydra.run.dir={run or fx.run}", *overrides]


def _resume(fx, *overrides: str) -> list:
    return _in_run(fx, "train.resume=auto", *overrides)


def _finetune(fx, *overrides: str, run: Path | None = None) -> list:
    return [
        "finetune",
        f"checkpoint={fx.run}",
        "task=files",
        f"task.train_file={fx.own}",
        f"task.eval_file={fx.own}",
        f"hydra.run.dir={run or fx.finetuned}",
        *FINETUNE,
        *overrides,
    ]


def _glue(fx, *overrides: str, run: Path | None = None) -> list:
    return [
        "glue",
        f"checkpoint={fx.run}",
        f"data_dir={fx.tmp / 'glue'}",
        "tasks=[sst2]",
        "epochs=1",
        f"hydra.run.dir={run or fx.glue}",
        *overrides,
    ]


def _tokenizer(fx, *overrides: str) -> list:
    return [
        "tokenizer",
        "data=files",
        f"data.train_files=[{fx.corpus}]",
        "tokenizer.vocab_size=200",
        *overrides,
    ]


def _held_by_another_run(fx) -> Callable[[], None]:
    """The run's lock held by another process (this one, as pid 4242 on host elsewhere)."""
    fd = os.open(fx.run / ".lock", os.O_RDWR)
    fcntl.flock(fd, fcntl.LOCK_EX)
    saved = os.pread(fd, 4096, 0)
    os.ftruncate(fd, 0)
    os.pwrite(fd, b"4242 elsewhere\n", 0)

    def undo() -> None:
        os.ftruncate(fd, 0)
        os.pwrite(fd, saved, 0)
        os.close(fd)

    return undo


def _corpus_gone(fx) -> Callable[[], None]:
    """The run's corpus moved away: a resume with the run's own settings finds no file."""
    moved = fx.corpus.with_name("moved.txt")
    fx.corpus.rename(moved)
    return lambda: moved.rename(fx.corpus)


def _corpus_changed(fx) -> Callable[[], None]:
    """Other text in the run's corpus file: a resume would continue on other data."""
    saved = fx.corpus.read_bytes()
    fx.corpus.write_text("Other words altogether, and more of them.\n\n" * 400)
    return lambda: fx.corpus.write_bytes(saved)


CASES = [
    # train into the run dir of a run
    Case("train-composition", lambda fx: _in_run(fx, "train.bach_size=3"), ("train.bach_size",)),
    Case("train-schema", lambda fx: _in_run(fx, "train.batch_size=0"), ("train.batch_size",)),
    Case(
        "train-run-in-use",
        lambda fx: _resume(fx),
        ("in use by another run", "pid 4242"),
        before=_held_by_another_run,
    ),
    Case(
        "train-run-dir-holds-a-run",
        lambda fx: _in_run(fx),
        ("already holds a run", "train.resume=auto"),
    ),
    Case(
        "train-resume-other-sequence-length",
        lambda fx: _resume(fx, "data.max_seq_length=16"),
        ("data.max_seq_length",),
    ),
    Case(
        "train-resume-other-model",
        lambda fx: _resume(fx, "model.hidden_size=64"),
        ("model.hidden_size",),
    ),
    Case(
        "train-resume-with-a-tracker",
        lambda fx: _resume(fx, "logger=tensorboard", "data.max_seq_length=16"),
        ("data.max_seq_length",),
    ),
    Case(
        "train-resume-other-tokenizer",
        lambda fx: _resume(fx, "tokenizer.vocab_size=250"),
        ("tokenizer.vocab_size",),
    ),
    Case(
        "train-resume-other-data",
        lambda fx: _resume(fx),
        ("training text changed",),
        before=_corpus_changed,
    ),
    Case(
        "train-resume-data-gone", lambda fx: _resume(fx), ("data.train_files",), before=_corpus_gone
    ),
    Case(
        "train-resume-phases",
        lambda fx: _resume(
            fx,
            "phases=[{name:a,share:0.5,set:{masking.mlm_probability:0.3}},{name:b,share:0.5}]",
            "train.max_steps=8",
        ),
        ("phase 0", "keeps its name and settings"),
    ),
    Case(
        "train-resume-not-a-checkpoint",
        lambda fx: _resume(fx, f"train.resume={fx.afile}"),
        ("train.resume",),
    ),
    Case(
        "train-resume-pickle-that-runs-code",
        lambda fx: _in_run(
            fx, f"train.resume={fx.damaged / 'checkpoints' / 'step_0000004'}", run=fx.damaged
        ),
        ("step_0000004", "could run code"),
    ),
    Case(
        "train-resume-fp16-on-a-cpu",
        lambda fx: _resume(fx, "train.precision=fp16"),
        ("train.precision=fp16",),
    ),
    Case(
        "train-resume-flash-attention-on-a-cpu",
        lambda fx: _resume(fx, "model.attn_implementation=flash_attention_2"),
        ("flash_attention_2",),
    ),
    Case(
        "train-resume-batch-that-does-not-divide",
        lambda fx: _resume(fx, "train.global_batch_size=6"),
        ("train.global_batch_size",),
    ),
    Case(
        "train-probe-of-a-regression-task",
        lambda fx: _resume(
            fx, "probe.every=2", "task@probe.task=stsb", f"probe.task.data_dir={fx.tmp}"
        ),
        ("probe",),
    ),
    Case(
        "train-into-a-fine-tuning",
        lambda fx: _in_run(fx, run=fx.finetuned),
        ("already holds a run",),
    ),
    Case(
        "train-into-a-glue-run",
        lambda fx: _in_run(fx, "train.max_steps=-1", run=fx.glue),
        ("train.max_steps",),
    ),
    # finetune into an existing folder, or with a fault found later (into a new one)
    Case(
        "finetune-into-its-own-run-dir", lambda fx: _finetune(fx), ("is not empty", "hydra.run.dir")
    ),
    Case(
        "finetune-into-a-pretraining-run", lambda fx: _finetune(fx, run=fx.run), ("is not empty",)
    ),
    Case("finetune-into-a-glue-run", lambda fx: _finetune(fx, run=fx.glue), ("is not empty",)),
    Case("finetune-schema", lambda fx: _finetune(fx, "epochs=0"), ("epochs",)),
    Case("finetune-composition", lambda fx: _finetune(fx, "task=squad"), ("task=squad",)),
    Case(
        "finetune-missing-checkpoint",
        lambda fx: _finetune(fx, f"checkpoint={fx.tmp / 'none'}", run=fx.tmp / "new-1"),
        ("checkpoint",),
    ),
    Case(
        "finetune-damaged-model",
        lambda fx: _finetune(fx, f"checkpoint={fx.cut}", run=fx.tmp / "new-2"),
        ("checkpoint", "cut"),
    ),
    Case(
        "finetune-missing-column",
        lambda fx: _finetune(fx, "task.label_column=gold", run=fx.tmp / "new-3"),
        ("'gold'",),
    ),
    Case(
        "finetune-longer-than-the-model",
        lambda fx: _finetune(fx, "max_seq_length=4096", run=fx.tmp / "new-4"),
        ("max_seq_length",),
    ),
    # glue
    Case("glue-into-its-own-run-dir", lambda fx: _glue(fx), ("is not empty",)),
    Case("glue-into-a-fine-tuning", lambda fx: _glue(fx, run=fx.finetuned), ("is not empty",)),
    Case(
        "glue-unknown-task", lambda fx: _glue(fx, "tasks=[squad]", run=fx.tmp / "new-5"), ("squad",)
    ),
    Case(
        "glue-missing-checkpoint",
        lambda fx: _glue(fx, f"checkpoint={fx.tmp / 'none'}", run=fx.tmp / "new-6"),
        ("checkpoint",),
    ),
    Case(
        "glue-data-dir-not-a-folder",
        lambda fx: _glue(fx, f"data_dir={fx.afile}", run=fx.tmp / "new-7"),
        ("data_dir",),
    ),
    Case("glue-schema", lambda fx: _glue(fx, "tasks=[]"), ("tasks",)),
    # export
    Case("export-into-an-export", lambda fx: ["export", fx.run, fx.export], ("already exists",)),
    Case(
        "export-into-a-run",
        lambda fx: ["export", fx.run / "checkpoints" / "step_0000004", fx.run],
        ("already exists",),
    ),
    Case("export-damaged-model", lambda fx: ["export", fx.cut, fx.tmp / "new-8"], ("cut",)),
    Case(
        "export-missing-checkpoint",
        lambda fx: ["export", fx.tmp / "none", fx.tmp / "new-9"],
        ("checkpoint",),
    ),
    # tokenizer
    Case(
        "tokenizer-into-a-tokenizer",
        lambda fx: _tokenizer(fx, f"out={fx.tok}"),
        ("out=", "holds files"),
    ),
    Case(
        "tokenizer-into-a-run", lambda fx: _tokenizer(fx, f"out={fx.run}"), ("out=", "holds files")
    ),
    Case("tokenizer-out-is-a-file", lambda fx: _tokenizer(fx, f"out={fx.afile}"), ("out=",)),
    Case(
        "tokenizer-bad-corpus",
        lambda fx: [
            "tokenizer",
            "data=files",
            f"data.train_files=[{fx.tmp}/no*.txt]",
            f"out={fx.tmp / 'new-10'}",
        ],
        ("data.train_files",),
    ),
    Case(
        "tokenizer-schema",
        lambda fx: _tokenizer(fx, "tokenizer.vocab_size=0", f"out={fx.tmp / 'new-11'}"),
        ("tokenizer.vocab_size",),
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_a_refused_command_leaves_every_run_dir_as_it_was(fx, case):
    undo = case.before(fx) if case.before else None
    try:
        before = snapshot(*fx.dirs)
        proc = run_cli(*case.argv(fx))
        after = snapshot(*fx.dirs)
    finally:
        if undo is not None:
            undo()
    status, err = proc.returncode, proc.stderr
    errors = [line for line in err.splitlines() if line.startswith("Error:")]
    assert status == 2 and len(errors) == 1, err[-3000:]
    assert all(needle in errors[0] for needle in case.needles), errors[0]
    assert after == before, sorted(set(after.items()) ^ set(before.items()))
    for new in fx.tmp.glob(
        "new-*"
    ):  # a new folder of a refused command is left empty, if made at all
        assert not any(new.iterdir()), list(new.iterdir())
    assert not (fx.tmp / "code-ran").exists()
