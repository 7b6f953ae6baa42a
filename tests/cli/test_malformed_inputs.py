"""Every command, fed malformed input files, damaged artifacts and out-of-range settings:
exit status 2, one line on stderr that starts with "Error:" and names the file or setting,
and never a traceback.

The fixtures (a tiny trained run, damaged copies of it, broken files) are built once, the
run by ``mlmkit train``. It and each case run in this process (``mlmkit.cli.main``); a few
cases run as ``python -m mlmkit`` in a process of their own too, with the same result.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
from runs import SMALLEST, run_cli

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
# a run of a few seconds: the model, tokenizer and data as small as the settings allow
TINY = [
    *SMALLEST,
    "train.eval_every=0",
    "optim.warmup_steps=4",
]  # warmup = the step budget: warned about


def mlmkit(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "mlmkit", *args],
        cwd=ROOT,
        env=ENV,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def train_args(fx, run: Path | str, *overrides: str) -> list[str]:
    """``train`` with the fixture run's settings (its corpus and cache), into ``run``."""
    return [
        "train",
        *TINY,
        "data=files",
        f"data.train_files=[{fx.corpus}]",
        f"paths.cache_dir={fx.cache}",
        f"hydra.run.dir={run}",
        *overrides,
    ]


def _corpus_text() -> str:
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key].strip() for key in sorted(topics)[:40])


def _copy_run(fx, name: str) -> Path:
    """A copy of the fixture run without its final/ (so a resume or a run dir points at the
    checkpoints)."""
    target = fx.tmp / name
    shutil.copytree(fx.run, target, ignore=shutil.ignore_patterns(".lock"))
    shutil.rmtree(target / "final")
    return target


def _cut_in_half(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _make_files(fx) -> None:
    import pandas as pd

    tmp = fx.tmp
    text = _corpus_text()
    fx.corpus.write_text(text)
    fx.bin.write_bytes(bytes(range(256)) * 40)
    fx.utf16.write_bytes(text[:20_000].encode("utf-16"))
    fx.empty.write_text("")
    fx.adir.mkdir()
    fx.afile.write_text("a file where a folder is expected\n")
    fx.unknown.write_text("\n\n".join("\u4f60\u597d\u4e16\u754c " * 30 for _ in range(200)))
    pd.DataFrame({"text": list(range(100))}).to_parquet(fx.ints)
    pd.DataFrame({"text": [{"a": "x y", "b": i} for i in range(100)]}).to_parquet(fx.structs)
    fx.objs.write_text("\n".join(json.dumps({"text": {"a": "x y"}}) for _ in range(100)) + "\n")
    fx.garbage.write_text("\n".join(f"not json {i}" for i in range(100)) + "\n")
    fx.trunc_parquet.write_bytes(fx.ints.read_bytes()[:200])
    glue = {
        "empty": b"",
        "binary": bytes(range(256)) * 40,
        "utf16": "sentence\tlabel\ngood\t1\nbad\t0\n".encode("utf-16"),
        "header": b"sentence\tlabel\n",
    }
    for name, content in glue.items():
        (tmp / "glue" / name).mkdir(parents=True)
        for split in ("train.tsv", "dev.tsv"):
            (tmp / "glue" / name / split).write_bytes(content)
    (tmp / "metrics_binary").mkdir()
    (tmp / "metrics_binary" / "metrics.jsonl").write_bytes(bytes(range(256)) * 8)
    fx.own = tmp / "own"  # labelled files of one's own (task=files)
    fx.own.mkdir()
    (fx.own / "train.csv").write_text('text,label\ngood film,pos\n"slow, long",maybe\nbad,neg\n')


def _make_damaged_artifacts(fx) -> None:
    """Damaged copies of the fixture run and of its final/ model dir."""
    from safetensors.torch import load_file
    from torch import save

    tmp, final = fx.tmp, fx.run / "final"
    # runs whose checkpoints are damaged
    fx.run_trunc = _copy_run(fx, "run_trunc")  # latest checkpoint's weights cut in half
    _cut_in_half(fx.run_trunc / "checkpoints" / "step_0000004" / "model.safetensors")
    fx.run_empty_state = _copy_run(fx, "run_empty_state")  # latest loop_state.json is {}
    (fx.run_empty_state / "checkpoints" / "step_0000004" / "loop_state.json").write_text("{}")
    fx.run_only_empty_state = _copy_run(fx, "run_only_empty_state")  # ... and no earlier one
    (fx.run_only_empty_state / "checkpoints" / "step_0000004" / "loop_state.json").write_text("{}")
    shutil.rmtree(fx.run_only_empty_state / "checkpoints" / "step_0000002")
    fx.run_no_rng = _copy_run(fx, "run_no_rng")  # RNG state missing
    (fx.run_no_rng / "checkpoints" / "step_0000004" / "random_states_0.pkl").unlink()
    fx.run_pickle = _copy_run(fx, "run_pickle")  # RNG state whose unpickling would run code

    class Exploit:
        def __reduce__(self):
            return (os.system, (f"touch {fx.marker}",))

    (fx.run_pickle / "checkpoints" / "step_0000004" / "random_states_0.pkl").write_bytes(
        pickle.dumps(Exploit())
    )
    # model dirs
    fx.final_trunc = shutil.copytree(final, tmp / "final_trunc")
    _cut_in_half(fx.final_trunc / "model.safetensors")
    fx.pickled = shutil.copytree(final, tmp / "pickled")  # pytorch_model.bin only
    save(load_file(fx.pickled / "model.safetensors"), fx.pickled / "pytorch_model.bin")
    (fx.pickled / "model.safetensors").unlink()
    fx.custom = shutil.copytree(final, tmp / "custom")  # config.json names custom code
    config = json.loads((fx.custom / "config.json").read_text())
    config["auto_map"] = {"AutoConfig": "custom.C", "AutoModelForMaskedLM": "custom.M"}
    (fx.custom / "config.json").write_text(json.dumps(config))
    (fx.custom / "custom.py").write_text(f"open({str(fx.marker)!r}, 'w').write('ran')\n")
    fx.garbled = shutil.copytree(final, tmp / "garbled")  # config.json that is not JSON
    (fx.garbled / "config.json").write_text('{"model_type": "bert", ')
    fx.custom_tokenizer = shutil.copytree(fx.run / "model", tmp / "custom_tokenizer")
    tok_config = json.loads((fx.custom_tokenizer / "tokenizer_config.json").read_text())
    tok_config["auto_map"] = {"AutoTokenizer": ["custom.T", None]}
    (fx.custom_tokenizer / "tokenizer_config.json").write_text(json.dumps(tok_config))
    (fx.custom_tokenizer / "custom.py").write_text(f"open({str(fx.marker)!r}, 'w').write('ran')\n")
    fx.overrides_bad = shutil.copytree(
        fx.run,
        tmp / "overrides_bad",
        ignore=shutil.ignore_patterns("checkpoints", "final", ".lock"),
    )
    (fx.overrides_bad / ".hydra").mkdir(exist_ok=True)
    (fx.overrides_bad / ".hydra" / "overrides.yaml").write_text("key: [unclosed\n")
    _make_classifiers(fx)


def _make_classifiers(fx) -> None:
    """A classifier dir as mlmkit finetune writes it (untrained), and a copy naming custom code."""
    from transformers import AutoConfig, AutoTokenizer, BertForSequenceClassification

    config = AutoConfig.from_pretrained(fx.run / "final")
    config.id2label, config.label2id = {0: "neg", 1: "pos"}, {"neg": 0, "pos": 1}
    fx.classifier = fx.tmp / "classifier"
    BertForSequenceClassification(config).save_pretrained(fx.classifier)
    AutoTokenizer.from_pretrained(fx.run / "final").save_pretrained(fx.classifier)
    fx.custom_classifier = shutil.copytree(fx.classifier, fx.tmp / "custom_classifier")
    config = json.loads((fx.custom_classifier / "config.json").read_text())
    config["auto_map"] = {"AutoModelForSequenceClassification": "custom.C"}
    (fx.custom_classifier / "config.json").write_text(json.dumps(config))
    (fx.custom_classifier / "custom.py").write_text(f"open({str(fx.marker)!r}, 'w').write('ran')\n")


@pytest.fixture(scope="module")
def fx(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("malformed")
    fx = SimpleNamespace(
        tmp=tmp,
        cache=tmp / "cache",
        corpus=tmp / "corpus.txt",
        bin=tmp / "blob.txt",
        utf16=tmp / "wide.txt",
        empty=tmp / "empty.txt",
        adir=tmp / "folder.txt",
        afile=tmp / "afile",
        unknown=tmp / "unknown.txt",
        ints=tmp / "ints.parquet",
        structs=tmp / "structs.parquet",
        objs=tmp / "objs.jsonl",
        garbage=tmp / "garbage.jsonl",
        trunc_parquet=tmp / "cut.parquet",
        marker=tmp / "custom-code-ran",
        run=tmp / "run",
        missing=tmp / "missing.txt",
    )
    _make_files(fx)
    fx.tasks = _make_task_files(tmp / "tasks")
    fx.train = run_cli(*train_args(fx, fx.run), env=ENV)
    assert fx.train.returncode == 0, fx.train.stderr[-3000:]
    _make_damaged_artifacts(fx)
    return fx


@dataclass(frozen=True)
class Case:
    id: str
    argv: Callable[[SimpleNamespace], list[str]]
    needles: tuple[str, ...]  # each is in the Error line
    forbid: tuple[str, ...] = ()  # none is in the Error line


def _t(fx, *overrides: str, run: Path | None = None) -> list[str]:
    return train_args(fx, run or fx.tmp / "runs" / str(abs(hash(overrides))), *overrides)


def _files(path) -> str:
    return f"data.train_files=[{path}]"


def _eval(fx, *args: str) -> list[str]:
    return ["eval", f"paths.cache_dir={fx.cache}", *args]


def _finetune(fx, *args: str) -> list[str]:
    return [
        "finetune",
        f"hydra.run.dir={fx.tmp / 'finetune' / str(abs(hash(args)))}",
        "epochs=1",
        *args,
    ]


def _glue(fx, name: str) -> str:
    return f"task.data_dir={fx.tmp / 'glue' / name}"


def _own(fx, *args: str) -> list[str]:
    """finetune task=files on the fixture's own CSV file."""
    return _finetune(
        fx,
        f"checkpoint={fx.run}",
        "task=files",
        f"task.train_file={fx.own / 'train.csv'}",
        f"task.eval_file={fx.own / 'train.csv'}",
        *args,
    )


def _make_task_files(folder: Path) -> Path:
    """Token and SQuAD files, good and bad, for finetune task=tokens and task=qa."""
    folder.mkdir()
    good = "Anna\tB-person\nlives\tO\n\t\nOslo\tB-place\nis\tO\ncold\tO\n"
    (folder / "good.conll").write_text(good)
    (folder / "notag.conll").write_text("Anna\tB-person\nlives\n")
    (folder / "unknown.conll").write_text(good + "\nAspirin\tB-drug\n")
    context = "Rollo led the Normans."
    qa = {"id": "q1", "question": "Who led?", "answers": [{"text": "Rollo", "answer_start": 2}]}
    squad = {"version": "v2.0", "data": [{"paragraphs": [{"context": context, "qas": [qa]}]}]}
    (folder / "offset.json").write_text(json.dumps(squad))
    (folder / "notsquad.json").write_text(json.dumps([{"context": context}]))
    return folder


def _tokens(fx, train: str, dev: str | None = "good.conll", *args: str) -> list[str]:
    """finetune task=tokens on the fixture's CoNLL files."""
    dev_setting = f"task.eval_file={fx.tasks / dev}" if dev else "task.eval_file=null"
    return _finetune(
        fx, f"checkpoint={fx.run}", "task=tokens", f"task.train_file={fx.tasks / train}",
        dev_setting, *args,
    )  # fmt: skip


def _tokenizer(fx, *args: str) -> list[str]:
    return ["tokenizer", "data=files", "tokenizer.vocab_size=200", *args]


CASES = [
    # train: corpus files
    Case(
        "train-missing-file",
        lambda fx: _t(fx, _files(fx.missing)),
        ("data.train_files", "missing.txt"),
    ),
    Case(
        "train-folder-for-a-file",
        lambda fx: _t(fx, _files(fx.adir)),
        ("data.train_files", "folder.txt"),
    ),
    Case("train-binary-file", lambda fx: _t(fx, _files(fx.bin)), ("blob.txt", "binary")),
    Case(
        "train-utf16-file",
        lambda fx: _t(fx, _files(fx.utf16)),
        ("wide.txt", "UTF-16", "convert it to UTF-8"),
        ("binary",),
    ),
    Case(
        "train-empty-file", lambda fx: _t(fx, _files(fx.empty)), ("data.train_files", "empty.txt")
    ),
    Case(
        "train-parquet-integers",
        lambda fx: _t(fx, _files(fx.ints)),
        ("ints.parquet", "'text'", "not text"),
    ),
    Case(
        "train-parquet-structs",
        lambda fx: _t(fx, _files(fx.structs)),
        ("structs.parquet", "'text'", "not text"),
    ),
    Case(
        "train-parquet-structs-streamed",
        lambda fx: _t(fx, _files(fx.structs), "data.streaming=true"),
        ("structs.parquet", "'text'", "not text"),
    ),
    Case(
        "train-jsonl-objects",
        lambda fx: _t(fx, _files(fx.objs)),
        ("objs.jsonl", "'text'", "not text"),
    ),
    Case(
        "train-jsonl-no-json",
        lambda fx: _t(fx, _files(fx.garbage)),
        ("data.train_files", "garbage.jsonl"),
    ),
    Case(
        "train-parquet-cut-short",
        lambda fx: _t(fx, _files(fx.trunc_parquet)),
        ("cut.parquet", "parquet"),
    ),
    Case(
        "train-nothing-to-predict",
        lambda fx: _t(fx, _files(fx.unknown), f"tokenizer.name_or_path={fx.run / 'model'}"),
        ("data.train_files", "special tokens only"),
    ),
    # train: tokenizer and model dirs
    Case(
        "train-tokenizer-is-a-file",
        lambda fx: _t(fx, f"tokenizer.name_or_path={fx.afile}"),
        ("tokenizer.name_or_path",),
    ),
    Case(
        "train-tokenizer-custom-code",
        lambda fx: _t(fx, f"tokenizer.name_or_path={fx.custom_tokenizer}"),
        ("tokenizer.name_or_path", "auto_map", "tokenizer_config.json"),
    ),
    Case(
        "train-init-from-pickle",
        lambda fx: _t(fx, f"model.init_from={fx.pickled}"),
        ("model.init_from", "pytorch_model.bin", "convert it to model.safetensors"),
    ),
    Case(
        "train-init-from-custom-code",
        lambda fx: _t(fx, f"model.init_from={fx.custom}"),
        ("model.init_from", "auto_map"),
    ),
    # train: damaged checkpoints
    Case(
        "train-resume-empty-loop-state-only",
        lambda fx: _t(fx, "train.resume=auto", run=fx.run_only_empty_state),
        ("loop_state.json", "train.resume"),
    ),
    Case(
        "train-resume-pickle-that-runs-code",
        lambda fx: _t(
            fx, f"train.resume={fx.run_pickle / 'checkpoints' / 'step_0000004'}", run=fx.run_pickle
        ),
        ("step_0000004", "could run code"),
        ("weights_only",),
    ),
    Case(
        "train-resume-not-a-checkpoint",
        lambda fx: _t(fx, f"train.resume={fx.adir}"),
        ("train.resume",),
    ),
    Case("train-run-dir-is-a-file", lambda fx: _t(fx, run=fx.afile / "run"), ("hydra.run.dir",)),
    # train: settings
    Case("train-batch-size-zero", lambda fx: _t(fx, "train.batch_size=0"), ("train.batch_size",)),
    Case("train-max-steps-negative", lambda fx: _t(fx, "train.max_steps=-3"), ("train.max_steps",)),
    Case("train-lr-zero", lambda fx: _t(fx, "optim.lr=0"), ("optim.lr",)),
    Case(
        "train-seq-length-too-long",
        lambda fx: _t(fx, "data.max_seq_length=4096"),
        ("data.max_seq_length",),
    ),
    Case(
        "train-unknown-precision",
        lambda fx: _t(fx, "train.precision=fp8"),
        ("train.precision", "fp8"),
    ),
    Case("train-unknown-packing", lambda fx: _t(fx, "data.packing=zip"), ("data.packing",)),
    Case(
        "train-unknown-preset",
        lambda fx: _t(fx, "model=bert-huge"),
        ("model=bert-huge", "bert-base"),
    ),
    Case("train-misspelt-key", lambda fx: _t(fx, "train.bach_size=3"), ("train.bach_size",)),
    Case(
        "train-not-a-number",
        lambda fx: _t(fx, "train.batch_size=lots"),
        ("train.batch_size", "lots"),
    ),
    Case(
        "train-unparsable-override",
        lambda fx: _t(fx, "data.train_files=[a"),
        ("data.train_files=[a",),
    ),
    # eval
    Case(
        "eval-missing-checkpoint",
        lambda fx: _eval(fx, f"checkpoint={fx.missing}"),
        ("checkpoint=",),
    ),
    Case(
        "eval-checkpoint-is-a-file",
        lambda fx: _eval(fx, f"checkpoint={fx.afile}"),
        ("checkpoint=",),
    ),
    Case(
        "eval-truncated-checkpoint",
        lambda fx: _eval(fx, f"checkpoint={fx.run_trunc}"),
        ("checkpoint", "step_0000004", "damaged"),
        ("model.init_from",),
    ),
    Case(
        "eval-truncated-export",
        lambda fx: _eval(fx, f"checkpoint={fx.final_trunc}"),
        ("checkpoint=", "final_trunc"),
        ("model.init_from",),
    ),
    Case(
        "eval-pickled-weights",
        lambda fx: _eval(fx, f"checkpoint={fx.pickled}"),
        ("checkpoint", "pytorch_model.bin", "convert it to model.safetensors"),
    ),
    Case(
        "eval-custom-code",
        lambda fx: _eval(fx, f"checkpoint={fx.custom}"),
        ("checkpoint", "auto_map"),
    ),
    Case(
        "eval-config-not-json",
        lambda fx: _eval(fx, f"checkpoint={fx.garbled}"),
        ("checkpoint", "config.json"),
    ),
    Case(
        "eval-utf16-file",
        lambda fx: _eval(fx, f"checkpoint={fx.run}", f"files=[{fx.utf16}]"),
        ("files", "wide.txt", "UTF-16"),
    ),
    Case(
        "eval-parquet-integers",
        lambda fx: _eval(fx, f"checkpoint={fx.run}", f"files=[{fx.ints}]"),
        ("files", "ints.parquet", "not text"),
    ),
    Case(
        "eval-batch-size-zero",
        lambda fx: _eval(fx, f"checkpoint={fx.run}", "batch_size=0"),
        ("batch_size",),
    ),
    Case(
        "eval-unknown-precision",
        lambda fx: _eval(fx, f"checkpoint={fx.run}", "precision=fp4"),
        ("precision",),
    ),
    # finetune
    Case(
        "finetune-empty-tsv",
        lambda fx: _finetune(fx, f"checkpoint={fx.run}", _glue(fx, "empty")),
        ("task.data_dir", "train.tsv", "empty"),
    ),
    Case(
        "finetune-binary-tsv",
        lambda fx: _finetune(fx, f"checkpoint={fx.run}", _glue(fx, "binary")),
        ("task.data_dir", "train.tsv", "binary"),
    ),
    Case(
        "finetune-utf16-tsv",
        lambda fx: _finetune(fx, f"checkpoint={fx.run}", _glue(fx, "utf16")),
        ("task.data_dir", "train.tsv", "UTF-16"),
    ),
    Case(
        "finetune-header-only-tsv",
        lambda fx: _finetune(fx, f"checkpoint={fx.run}", _glue(fx, "header")),
        ("train.tsv", "no usable example"),
    ),
    Case(
        "finetune-missing-data-dir",
        lambda fx: _finetune(fx, f"checkpoint={fx.run}", f"task.data_dir={fx.missing}"),
        ("task.data_dir",),
    ),
    Case(
        "finetune-truncated-checkpoint",
        lambda fx: _finetune(fx, f"checkpoint={fx.run_trunc}", _glue(fx, "header")),
        ("checkpoint", "step_0000004"),
    ),
    Case(
        "finetune-unknown-task",
        lambda fx: _finetune(fx, f"checkpoint={fx.run}", "task=squad"),
        ("task=squad", "sst2"),
    ),
    Case(
        "finetune-epochs-zero",
        lambda fx: _finetune(fx, f"checkpoint={fx.run}", "epochs=0"),
        ("epochs",),
    ),
    Case(
        "finetune-negative-length",
        lambda fx: _finetune(fx, f"checkpoint={fx.run}", "max_seq_length=-5"),
        ("max_seq_length",),
    ),
    Case(
        "finetune-dropout-out-of-range",
        lambda fx: _finetune(fx, f"checkpoint={fx.run}", "classifier_dropout=1.5"),
        ("classifier_dropout",),
    ),
    # finetune task=files: one's own labelled files
    Case(
        "finetune-files-label-outside",
        lambda fx: _own(fx, "task.labels=[neg,pos]"),
        ("train.csv", "line 3", "'maybe'", "task.labels (neg, pos)"),
    ),
    Case(
        "finetune-files-missing-column",
        lambda fx: _own(fx, "task.label_column=gold"),
        ("train.csv", "'gold'", "task.label_column"),
    ),
    Case(
        "finetune-files-missing-file",
        lambda fx: _own(fx, f"task.train_file={fx.missing}"),
        ("task.train_file", "missing.txt"),
    ),
    Case(
        "finetune-files-no-files",
        lambda fx: _finetune(fx, f"checkpoint={fx.run}", "task=files"),
        ("task.train_file", "task.eval_file"),
    ),
    # finetune task=tokens and task=qa
    Case(
        "finetune-conll-no-tag-column",
        lambda fx: _tokens(fx, "notag.conll"),
        ("notag.conll' line 2", "no tag column", "token<TAB>tag"),
    ),
    Case(
        "finetune-conll-unknown-eval-tag",
        lambda fx: _tokens(fx, "good.conll", "unknown.conll"),
        ("unknown.conll' line 8", "'B-drug'", "task.labels"),
    ),
    Case(
        "finetune-conll-empty-split",
        lambda fx: _tokens(fx, "good.conll", None, "task.eval_share=0.1"),
        ("task.eval_share=0.1", "empty split", "task.eval_file"),
    ),
    Case(
        "finetune-squad-answer-offset",
        lambda fx: _finetune(
            fx,
            f"checkpoint={fx.run}",
            "task=qa",
            f"task.train_file={fx.tasks / 'offset.json'}",
            f"task.eval_file={fx.tasks / 'offset.json'}",
        ),  # fmt: skip
        ("offset.json', question 'q1'", "'Rollo'", "answer_start"),
    ),
    Case(
        "finetune-squad-not-squad",
        lambda fx: _finetune(
            fx,
            f"checkpoint={fx.run}",
            "task=qa",
            f"task.train_file={fx.tasks / 'notsquad.json'}",
            "task.eval_file=null",
            "task.eval_share=0.5",
        ),  # fmt: skip
        ("task.train_file", "notsquad.json' is not SQuAD JSON", "SQuAD v1.1 or v2.0"),
    ),
    # predict
    Case(
        "predict-missing-dir",
        lambda fx: ["predict", str(fx.missing), "a text"],
        ("model_dir", "missing.txt"),
    ),
    Case(
        "predict-not-a-classifier",
        lambda fx: ["predict", str(fx.run / "final"), "a text"],
        ("model_dir", "BertForMaskedLM", "not a fine-tuned classifier, tagger"),
    ),
    Case(
        "predict-custom-code",
        lambda fx: ["predict", str(fx.custom_classifier), "a text"],
        ("model_dir", "auto_map"),
    ),
    Case("predict-no-input", lambda fx: ["predict", str(fx.classifier)], ("texts", "--file")),
    Case(
        "predict-empty-text",
        lambda fx: ["predict", str(fx.classifier), "a text", " "],
        ("Text 2", "empty"),
    ),
    Case(
        "predict-empty-file",
        lambda fx: ["predict", str(fx.classifier), "--file", str(fx.empty)],
        ("--file", "empty.txt"),
    ),
    Case(
        "predict-jsonl-no-json",
        lambda fx: ["predict", str(fx.classifier), "--file", str(fx.garbage)],
        ("--file", "garbage.jsonl", "no JSON object"),
    ),
    Case(
        "predict-batch-size-zero",
        lambda fx: ["predict", str(fx.classifier), "a", "--batch-size", "0"],
        ("--batch-size",),
    ),
    # tokenizer (out= is checked before the corpus is read, so before any training)
    Case(
        "tokenizer-out-is-a-file",
        lambda fx: _tokenizer(fx, _files(fx.missing), f"out={fx.afile}"),
        ("out=", "afile"),
        ("data.train_files",),
    ),
    Case("tokenizer-out-missing", lambda fx: _tokenizer(fx, _files(fx.corpus)), ("out=",)),
    Case(
        "tokenizer-utf16-corpus",
        lambda fx: _tokenizer(fx, _files(fx.utf16), f"out={fx.tmp / 'tok1'}"),
        ("data.train_files", "wide.txt", "UTF-16"),
    ),
    Case(
        "tokenizer-binary-corpus",
        lambda fx: _tokenizer(fx, _files(fx.bin), f"out={fx.tmp / 'tok2'}"),
        ("data.train_files", "blob.txt", "binary"),
    ),
    Case(
        "tokenizer-parquet-integers",
        lambda fx: _tokenizer(fx, _files(fx.ints), f"out={fx.tmp / 'tok3'}"),
        ("data.train_files", "ints.parquet", "not text"),
    ),
    Case(
        "tokenizer-vocab-zero",
        lambda fx: _tokenizer(
            fx, _files(fx.corpus), "tokenizer.vocab_size=0", f"out={fx.tmp / 'tok4'}"
        ),
        ("tokenizer.vocab_size",),
    ),
    Case(
        "tokenizer-max-chars-zero",
        lambda fx: _tokenizer(
            fx, _files(fx.corpus), "tokenizer.max_train_chars=0", f"out={fx.tmp / 'tok5'}"
        ),
        ("tokenizer.max_train_chars",),
    ),
    Case(
        "tokenizer-unknown-algorithm",
        lambda fx: _tokenizer(
            fx, _files(fx.corpus), "tokenizer.algorithm=bytes", f"out={fx.tmp / 'tok6'}"
        ),
        ("tokenizer.algorithm",),
    ),
    Case(
        "tokenizer-unknown-data-preset",
        lambda fx: ["tokenizer", "data=nope", f"out={fx.tmp / 'tok7'}"],
        ("data=nope",),
    ),
    # fill-mask
    # export: a checkpoint as a model dir
    Case(
        "export-missing-checkpoint",
        lambda fx: ["export", str(fx.missing), str(fx.tmp / "export-a")],
        ("checkpoint", "missing.txt"),
    ),
    Case(
        "export-out-exists",
        lambda fx: ["export", str(fx.run), str(fx.afile)],
        ("afile", "already exists"),
    ),
    Case(
        "export-truncated-checkpoint",
        lambda fx: ["export", str(fx.run_trunc), str(fx.tmp / "export-b")],
        ("run_trunc",),
    ),
    Case("export-no-arguments", lambda fx: ["export"], ("checkpoint",)),
    Case(
        "fill-mask-missing-dir",
        lambda fx: ["fill-mask", str(fx.missing), "a [MASK] b"],
        ("missing.txt",),
    ),
    Case(
        "fill-mask-truncated-weights",
        lambda fx: ["fill-mask", str(fx.final_trunc), "a [MASK] b"],
        ("model_dir", "final_trunc"),
    ),
    Case(
        "fill-mask-pickled-weights",
        lambda fx: ["fill-mask", str(fx.pickled), "a [MASK] b"],
        ("model_dir", "pytorch_model.bin", "convert it to model.safetensors"),
    ),
    Case(
        "fill-mask-custom-code",
        lambda fx: ["fill-mask", str(fx.custom), "a [MASK] b"],
        ("model_dir", "auto_map"),
    ),
    Case(
        "fill-mask-config-not-json",
        lambda fx: ["fill-mask", str(fx.garbled), "a [MASK] b"],
        ("model_dir", "config.json"),
    ),
    Case(
        "fill-mask-no-mask",
        lambda fx: ["fill-mask", str(fx.run / "final"), "no mask here"],
        ("[MASK]",),
    ),
    Case(
        "fill-mask-top-k-zero",
        lambda fx: ["fill-mask", str(fx.run / "final"), "a [MASK] b", "--top-k", "0"],
        ("--top-k",),
    ),
    Case(
        "fill-mask-top-k-not-a-number",
        lambda fx: ["fill-mask", str(fx.run / "final"), "a [MASK] b", "--top-k", "many"],
        ("--top-k", "many"),
    ),
    # plot and sweep
    Case(
        "plot-missing-run", lambda fx: ["plot", str(fx.missing)], ("missing.txt", "metrics.jsonl")
    ),
    Case(
        "plot-binary-metrics",
        lambda fx: ["plot", str(fx.tmp / "metrics_binary")],
        ("metrics.jsonl",),
    ),
    Case(
        "plot-out-under-a-file",
        lambda fx: ["plot", str(fx.run), "--out", str(fx.afile / "curves.png")],
        ("--out",),
    ),
    Case(
        "plot-out-not-an-image",
        lambda fx: ["plot", str(fx.run), "--out", str(fx.tmp / "curves.docx")],
        ("--out", "curves.docx"),
    ),
    Case("plot-no-run", lambda fx: ["plot"], ("runs",)),
    Case("sweep-missing-dir", lambda fx: ["sweep", str(fx.missing)], ("missing.txt",)),
    Case(
        "sweep-binary-metrics",
        lambda fx: ["sweep", str(fx.tmp / "metrics_binary")],
        ("metrics.jsonl",),
    ),
    Case(
        "sweep-overrides-not-yaml", lambda fx: ["sweep", str(fx.overrides_bad)], ("overrides.yaml",)
    ),
    # accelerate-config
    Case(
        "accelerate-config-unknown-name",
        lambda fx: ["accelerate-config", "ddp-bf16"],
        ("'ddp-bf16'", "ddp_bf16", "single_gpu"),
    ),
    Case(
        "accelerate-config-out-under-a-file",
        lambda fx: ["accelerate-config", "fsdp", "--out", str(fx.afile / "fsdp.yaml")],
        ("--out", "fsdp.yaml"),
    ),
]

# commands that must succeed, with a warning
RESUMES = {
    "empty-loop-state-falls-back": lambda fx: _t(fx, "train.resume=auto", run=fx.run_empty_state),
    "missing-rng-state-warns": lambda fx: _t(fx, "train.resume=auto", run=fx.run_no_rng),
}


# cases also run as ``python -m mlmkit`` (one per way a command reads its settings)
ENTRY_POINT = (
    "train-utf16-file",
    "eval-truncated-export",
    "tokenizer-out-is-a-file",
    "fill-mask-pickled-weights",
)


def _run_each(jobs: dict[str, list[str]]) -> dict[str, SimpleNamespace]:
    """``mlmkit <args>`` of each job, in this process, one after another."""
    done = {}
    for name, args in jobs.items():
        started = time.perf_counter()
        proc = run_cli(*args, env=ENV)
        done[name] = SimpleNamespace(
            returncode=proc.returncode,
            stdout=proc.stdout,
            stderr=proc.stderr,
            seconds=round(time.perf_counter() - started, 2),
        )
    return done


def _own_run_dir(argv: list[str]) -> list[str]:
    """``argv`` with a run dir of its own: the process beside the in-process run of the same
    case would otherwise find that run's lock on the dir."""
    return [f"{arg}-direct" if arg.startswith("hydra.run.dir=") else arg for arg in argv]


@pytest.fixture(scope="module")
def outcomes(fx) -> dict[str, SimpleNamespace]:
    """Every command of the module; a few in a process of their own as well, meanwhile."""
    jobs = {case.id: case.argv(fx) for case in CASES} | {
        name: argv(fx) for name, argv in RESUMES.items()
    }
    by_case = {case.id: case for case in CASES}
    with ThreadPoolExecutor(max_workers=1) as pool:
        direct = {
            name: pool.submit(mlmkit, *_own_run_dir(by_case[name].argv(fx))) for name in ENTRY_POINT
        }
        results = _run_each(jobs)
        fx.direct = {name: future.result() for name, future in direct.items()}
    return results


def test_the_table_covers_the_commands():
    from mlmkit.cli import COMMANDS

    covered = {case.argv(SimpleNamespace(**{k: Path("/x") for k in FIELDS}))[0] for case in CASES}
    assert covered == {
        "train",
        "eval",
        "finetune",
        "tokenizer",
        "fill-mask",
        "predict",
        "plot",
        "sweep",
        "export",
        "accelerate-config",
    }
    assert covered <= set(COMMANDS)


FIELDS = (
    "tmp",
    "cache",
    "corpus",
    "bin",
    "utf16",
    "empty",
    "adir",
    "afile",
    "unknown",
    "ints",
    "structs",
    "objs",
    "garbage",
    "trunc_parquet",
    "marker",
    "run",
    "missing",
    "run_trunc",
    "run_empty_state",
    "run_only_empty_state",
    "run_no_rng",
    "run_pickle",
    "final_trunc",
    "pickled",
    "custom",
    "garbled",
    "custom_tokenizer",
    "overrides_bad",
    "own",
    "classifier",
    "custom_classifier",
    "tasks",
)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.id)
def test_malformed_input_is_one_sentence_naming_what_to_change(case, outcomes):
    proc = outcomes[case.id]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert proc.returncode == 2 and len(errors) == 1, (proc.returncode, proc.stderr[-3000:])
    line = errors[0]
    assert line.endswith("."), line
    for needle in case.needles:
        assert needle in line, (needle, line)
    for word in case.forbid:
        assert word not in line, (word, line)


@pytest.mark.parametrize("name", ENTRY_POINT)
def test_python_m_mlmkit_gives_the_same_status_and_sentence(name, fx, outcomes):
    direct, in_process = fx.direct[name], outcomes[name]
    assert direct.returncode == in_process.returncode == 2
    sentence = [line for line in direct.stderr.splitlines() if line.startswith("Error:")]
    assert sentence == [
        line for line in in_process.stderr.splitlines() if line.startswith("Error:")
    ]


def test_no_custom_code_ran(fx, outcomes):
    assert not fx.marker.exists()


def test_a_warmup_as_long_as_the_budget_is_warned_about(fx):
    assert fx.train.returncode == 0
    assert "optim.warmup_steps (4) is not shorter than train.max_steps (4)" in fx.train.stderr


def test_an_empty_loop_state_falls_back_to_the_previous_checkpoint(fx, outcomes):
    proc = outcomes["empty-loop-state-falls-back"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (
        "loop_state.json lacks a valid step" in proc.stderr
        and "Trying the previous checkpoint" in proc.stderr
    )
    assert "Resumed from" in proc.stderr and "step_0000002 at step 2" in proc.stderr
    assert (fx.run_empty_state / "final" / "model.safetensors").is_file()


def test_a_checkpoint_without_its_rng_state_resumes_with_a_warning(fx, outcomes):
    proc = outcomes["missing-rng-state-warns"]
    assert proc.returncode == 0, proc.stderr[-3000:]
    warned = [line for line in proc.stderr.splitlines() if "random_states_0.pkl" in line]
    assert len(warned) == 1 and "exact resume is lost" in warned[0], proc.stderr[-3000:]
    assert "Resumed from" in proc.stderr and "step_0000004" in proc.stderr
