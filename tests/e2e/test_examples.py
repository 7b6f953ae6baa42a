"""Every script of examples/ runs, shrunk (a tiny model, a few steps: the overrides each script
takes last), as a user starts it: ``bash examples/<script> ...``, with its settings from the
environment, each command a process of its own. The SLURM scripts run on a real cluster, in
tests/slurm/test_slurm_jobs.py. The README links every script."""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import SHARED_DATA, shared_file
from runs import ROOT, TEST_ENV, TINY, ended_or_killed, free_port, train_steps
from zygote import write_client

EXAMPLES = ROOT / "examples"
SLURM_TESTS = (
    ROOT / "tests" / "slurm" / "test_slurm_jobs.py"
)  # the SLURM scripts, on a real cluster
SCRIPTS = sorted(
    p.relative_to(EXAMPLES).as_posix()
    for p in EXAMPLES.rglob("*")
    if p.is_file() and "__pycache__" not in p.parts  # bytecode of a helper another test imported
)

# a few steps of the tiny model, quiet; the scripts' own overrides come first, these last
STEPS = [
    "train.max_steps=10",
    "train.eval_every=10",
    "train.save_every=0",
    "logger=none",
    "train.progress=false",
]
# continued pretraining keeps the base model's shape and tokenizer: the rest of TINY
CONTINUE = [
    "data.max_seq_length=64",
    "data.max_eval_samples=64",
    "train.batch_size=8",
    "train.log_every=5",
    "optim.warmup_steps=2",
    *STEPS,
]


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory, zygote) -> Path:
    """``python`` for the front of PATH: this interpreter, through the zygote's client
    (tests/zygote.py) where the zygote runs."""
    folder = tmp_path_factory.mktemp("bin")
    if zygote is not None:
        write_client(folder, zygote)
        return folder
    python = folder / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    return folder


@pytest.fixture
def env(bin_dir) -> dict:
    return {
        **os.environ,
        **TEST_ENV,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PYTHON": str(bin_dir / "python"),
    }


def bash(script: str, *args: str, env: dict, cwd: Path, timeout: float = 240, check: bool = True):
    """``bash examples/<script> args``, to its end (on a timeout its processes are killed)."""
    proc = ended_or_killed(["bash", str(EXAMPLES / script), *args], timeout, script, cwd, env)
    if check:
        assert proc.returncode == 0, (
            f"{script} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
        )
    return proc


def table_rows(stdout: str) -> list[list[str]]:
    """The cells of each row of the Markdown tables an example prints (rules left out)."""
    return [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in stdout.splitlines()
        if line.startswith("| ") and "---" not in line
    ]


def test_every_example_is_tested_here_and_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    linked = set(re.findall(r"\]\((examples/[^)]+)\)", readme))
    assert {f"examples/{s}" for s in SCRIPTS} <= linked, sorted(
        {f"examples/{s}" for s in SCRIPTS} - linked
    )
    source = Path(__file__).read_text() + SLURM_TESTS.read_text()
    assert all(f'"{s}"' in source for s in SCRIPTS), [s for s in SCRIPTS if f'"{s}"' not in source]


def test_a_command_through_the_zygote_ends_as_a_new_interpreters_does(zygote, env, tmp_path):
    """The examples' ``python``: a ``-m mlmkit`` command forked from the zygote writes the same
    output and ends with the same status as the same command in a new interpreter, in the
    caller's working dir and environment; anything else is the interpreter itself."""
    if zygote is None:
        pytest.skip("MLMKIT_ZYGOTE=0: every command is a new interpreter already")
    python = env["PYTHON"]
    argv = [python, "-m", "mlmkit", "eval", "checkpoint=missing-run", "output=out.json"]
    forked = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True)
    new = subprocess.run(
        argv, cwd=tmp_path, env={**env, "MLMKIT_ZYGOTE": "0"}, capture_output=True, text=True
    )
    assert (forked.returncode, forked.stdout, forked.stderr) == (
        new.returncode, new.stdout, new.stderr,
    ) and forked.returncode == 2  # fmt: skip
    assert "missing-run" in forked.stderr and not (tmp_path / "out.json").exists()
    # forked (its sys.executable the client), in the caller's dir and environment, with its stdin
    script = "import os, sys; print(sys.executable, os.getcwd(), os.environ['SEEN'], input())"
    other = subprocess.run(
        [python, "-c", script], cwd=tmp_path, env={**env, "SEEN": "yes"}, input="in\n",
        capture_output=True, text=True,
    )  # fmt: skip
    assert other.stdout.split() == [python, str(tmp_path), "yes", "in"], other.stderr
    # an environment that differs in what is read at start-up: the interpreter itself
    startup = {**env, "PYTHONHASHSEED": "7"}
    real = subprocess.run([python, "-c", script], cwd=tmp_path, env={**startup, "SEEN": "no"},
                          input="x\n", capture_output=True, text=True)  # fmt: skip
    assert real.stdout.split()[0] == sys.executable, real.stderr
    # a rank's environment (a thread count, accelerate's working dir added to PYTHONPATH): forked,
    # with that many threads and the added dir on sys.path; a dir that would shadow a module the
    # zygote has imported (torch): the interpreter
    (tmp_path / "added").mkdir()
    (tmp_path / "added" / "rank_helper.py").write_text("WHERE = 'added'\n")
    (tmp_path / "shadow" / "torch").mkdir(parents=True)
    script = (
        "import sys, torch, rank_helper; print(sys.executable, torch.get_num_threads(), "
        "rank_helper.WHERE)"
    )
    paths = [p for p in (env.get("PYTHONPATH"), str(tmp_path / "added")) if p]
    rank = {**env, "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(paths)}
    ran = subprocess.run([python, "-c", script], env=rank, capture_output=True, text=True)
    assert ran.stdout.split() == [python, "1", "added"], ran.stderr
    shadow = {**rank, "PYTHONPATH": os.pathsep.join([*paths, str(tmp_path / "shadow")])}
    ran = subprocess.run([python, "-c", "import sys; print(sys.executable)"], env=shadow,
                         capture_output=True, text=True)  # fmt: skip
    assert ran.stdout.split() == [sys.executable], ran.stderr


# --- local files and continued pretraining (../shared/data) ---------------------------------


@pytest.fixture(scope="module")
def gutenberg_run(bin_dir, tmp_path_factory, cache_dir) -> Path:
    """examples/pretrain_local_files.sh, shrunk: its run dir (its final/ is a local BERT dir)."""
    shared_file("corpora/gutenberg")
    shared_file("corpora/wikitext-2/valid.txt")
    work = tmp_path_factory.mktemp("gutenberg")
    env = {
        **os.environ,
        **TEST_ENV,
        "PATH": f"{bin_dir}:{os.environ['PATH']}",
        "PYTHON": str(bin_dir / "python"),
        "DATA": str(SHARED_DATA / "corpora"),
    }
    bash(
        "pretrain_local_files.sh", *TINY, *STEPS, f"paths.cache_dir={cache_dir}", env=env, cwd=work
    )
    return work / "outputs" / "gutenberg-bert-mini"


def test_pretrain_local_files_trains_on_the_gutenberg_books(gutenberg_run):
    overrides = (gutenberg_run / ".hydra" / "overrides.yaml").read_text()
    assert "gutenberg/*.txt" in overrides and "wikitext-2/valid.txt" in overrides, overrides
    assert train_steps(gutenberg_run)[-1] == 10
    assert (gutenberg_run / "final" / "model.safetensors").is_file()


def _embeddings(model_dir: Path):
    from safetensors.torch import load_file

    weights = load_file(model_dir / "model.safetensors")
    return next(v.float() for k, v in weights.items() if k.endswith("word_embeddings.weight"))


def test_continued_pretraining_starts_from_a_local_bert_dir(
    gutenberg_run, env, tmp_path, cache_dir
):
    base = gutenberg_run / "final"
    bash(
        "continued_pretraining.sh",
        str(base),
        *CONTINUE,
        f"paths.cache_dir={cache_dir}",
        env={**env, "DATA": str(SHARED_DATA / "corpora")},
        cwd=tmp_path,
    )
    run = tmp_path / "outputs" / "continued-final"
    assert train_steps(run)[-1] == 10
    vocab = [
        json.loads((d / "tokenizer.json").read_text())["model"]["vocab"]
        for d in (base, run / "final")
    ]
    assert vocab[0] == vocab[1]  # the base model's tokenizer, not a new one
    before, after = _embeddings(base), _embeddings(run / "final")
    assert before.shape == after.shape
    assert (after - before).norm() < 0.5 * before.norm()  # moved a little from the base's weights


def test_domain_adaptation_evaluates_before_and_after(gutenberg_run, env, tmp_path, cache_dir):
    base = gutenberg_run / "final"
    proc = bash(
        "domain_adaptation.sh",
        str(base),
        *CONTINUE,
        f"paths.cache_dir={cache_dir}",
        env={**env, "DATA": str(SHARED_DATA / "corpora")},
        cwd=tmp_path,
    )
    out = proc.stdout + proc.stderr
    before, after = out.index("== before:"), out.index("== after:")
    assert before < after
    assert "accuracy" in out[before:after] and "accuracy" in out[after:], out[-3000:]
    assert train_steps(tmp_path / "outputs" / "gutenberg-to-wikitext")[-1] == 10


def test_domain_adaptation_names_a_base_that_is_no_model(env, tmp_path):
    proc = bash(
        "domain_adaptation.sh", str(tmp_path / "nothing"), env=env, cwd=tmp_path, check=False
    )
    assert proc.returncode == 2
    assert (
        proc.stderr.startswith("Error:")
        and "nothing" in proc.stderr
        and "config.json" in proc.stderr
    )


def test_glue_fine_tunes_on_three_tasks(gutenberg_run, env, tmp_path):
    shared_file("glue/SST-2/train.tsv")
    proc = bash(
        "glue.sh",
        str(gutenberg_run),
        "epochs=1",
        "max_train_samples=32",
        "batch_size=16",
        "max_seq_length=32",
        "save_model=false",
        env={**env, "GLUE": str(SHARED_DATA / "glue")},
        cwd=tmp_path,
    )
    results = sorted((tmp_path / "outputs" / "finetune").glob("*/*/results.json"))
    assert sorted(p.parent.parent.name for p in results) == ["cola", "rte", "sst2"], proc.stderr[
        -3000:
    ]


def test_electra_vs_mlm_tables_both_objectives_at_equal_wall_clock(env, tmp_path, cache_dir):
    """examples/electra_vs_mlm.sh, shrunk: the tiny model pretrained a few steps with each
    objective, two of GLUE's local tasks fine-tuned on 32 examples, the probes; one table."""
    shared_file("corpora/gutenberg")
    shared_file("glue/STS-B/dev.tsv")
    settings = {
        "OUT": str(tmp_path / "out"),
        "TASKS": "sst2,rte",
        "SEEDS": "0",
        "SAMPLES": "32",
        "EPOCHS": "1",
        "GLUE_ARGS": "batch_size=16 precision=no",
        "MLM_ARGS": "optim.lr=9e-4",  # each objective at a rate of its own
        "RTD_ARGS": "optim.lr=7e-4",
        "DATA": str(SHARED_DATA / "corpora"),
        "GLUE": str(SHARED_DATA / "glue"),
    }
    proc = bash(
        "electra_vs_mlm.sh",
        *TINY,
        *STEPS,
        "probe.max_train_samples=64",
        f"paths.cache_dir={cache_dir}",
        env={**env, **settings},
        cwd=tmp_path,
        timeout=400,
    )
    rows = [line for line in proc.stdout.splitlines() if line.startswith(("| mlm", "| rtd"))]
    assert len(rows) == 2, proc.stdout[-2000:]
    for row in rows:  # 2 tasks, the average, the seeds, 2 probes, seconds, tokens, steps
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 10 and cells[-1] == "10" and cells[-2] == "5,120", row
    assert "RTD - MLM, GLUE average:" in proc.stdout
    assert train_steps(tmp_path / "out" / "rtd")[-1] == 10
    for run, lr in (("mlm", 9e-4), ("rtd", 7e-4)):
        config = yaml.safe_load((tmp_path / "out" / run / ".hydra" / "config.yaml").read_text())
        assert config["optim"]["lr"] == lr and config["objective"]["name"] == run


def test_token_tasks_tables_ner_pos_and_qa_pretrained_against_random_init(env, tmp_path, cache_dir):
    """examples/token_tasks.sh, shrunk: the tiny model pretrained for a few steps, each task
    fine-tuned for one epoch on 32 examples from it and from a random init; one table."""
    for name in ("tokens/wnut17/train.conll", "tokens/ud-ewt/en_ewt-ud-dev.conllu"):
        shared_file(name)
    shared_file("qa/squad2-dev-subset.json")
    work = tmp_path / "token_tasks"
    settings = {
        "WORK": str(work),
        "EPOCHS": "1",
        "QA_EPOCHS": "1",
        "FT_ARGS": "max_train_samples=32 batch_size=16 precision=no save_model=false",
    }
    proc = bash(
        "token_tasks.sh",
        *TINY,
        *STEPS,
        f"paths.cache_dir={cache_dir}",
        env={**env, **settings},
        cwd=tmp_path,
    )
    rows = table_rows(proc.stdout)
    assert [r[1] for r in rows] == [
        "figure",
        "entity F1",
        "UPOS accuracy",
        "exact match",
        "F1",
        "F1, answerable",
        "F1, unanswerable",
    ], proc.stdout[-3000:]
    figures = [[float(c.split()[0]) for c in r[2:5]] for r in rows[1:]]
    assert all(0 <= x <= 100 for row in figures for x in row)
    assert figures[0][2] == 0.0 and "every word O" in rows[1][4]  # NER's baseline
    assert figures[5][2] == 100.0 and figures[4][2] == 0.0  # "no answer": NoAns 100, HasAns 0
    for task in ("ner", "pos", "qa"):
        for init in ("pretrained", "random"):
            result = json.loads((work / f"{task}-{init}" / "results.json").read_text())
            assert result["init"] == init and result["train_examples"] == 32
    assert all(r[5] for r in rows[1:4]) and "pretraining:" in proc.stdout


def test_new_language_trains_a_hindi_tokenizer_and_encoder_that_keep_the_script(
    env, tmp_path, cache_dir
):
    shared_file("corpora/hindi/sevasadan.txt")
    run = tmp_path / "outputs" / "hindi-bert-mini"
    proc = bash(
        "new_language.sh",
        *TINY,
        *STEPS,
        f"paths.cache_dir={cache_dir}",
        env={**env, "DATA": str(SHARED_DATA / "corpora"), "VOCAB": "2000"},
        cwd=tmp_path,
    )
    assert "[UNK] is 0.00% of the tokens of the held-out text" in proc.stdout
    assert train_steps(run)[-1] == 10
    assert (
        "[UNK] is 0.00% of the validation text's tokens"
        in (run / "final" / "README.md").read_text()
    )
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(run / "final")
    word = "स्वतन्त्रता"  # स्वतन्त्रता
    assert tok.decode(tok(word)["input_ids"], skip_special_tokens=True) == word  # its viramas kept
    answers = [line for line in proc.stdout.splitlines() if line.strip()][-5:]
    assert len(answers) == 5 and all(re.search(r"\d\.\d", line) for line in answers), proc.stdout[
        -2000:
    ]


def test_continue_roberta_xlmr_tables_before_and_after(env, tmp_path, cache_dir):
    """examples/continue_roberta_xlmr.sh, shrunk: its inputs cut to their first lines, the XLM-R
    folder (the real tokenizer, laid out by examples/released_model.py) continued 4 steps on the
    Hindi novel without the general pretraining (GENERAL_TIME=0: the same command as the
    continued one), scored and fine-tuned on 32 Hindi word-order examples before and after; one
    table. RoBERTa's part differs in its texts and task alone (UD tags, run
    by the token-task example's test) and would double the time."""
    tokenizers = shared_file("tokenizers/xlm-roberta").parent
    data = tmp_path / "data"
    novel = data / "hindi" / "sevasadan.txt"
    novel.parent.mkdir(parents=True)
    with open(shared_file("corpora/hindi/sevasadan.txt"), encoding="utf-8") as f:
        novel.write_text("".join(itertools.islice(f, 2000)), encoding="utf-8")
    out = tmp_path / "out"
    settings = {
        "FAMILIES": "xlm-roberta",
        "GENERAL_TIME": "0",
        "OUT": str(out),
        "DATA": str(data),
        "TOKENIZERS": str(tokenizers),
        "SAMPLES": "32",
        "EPOCHS": "1",
        "FT_ARGS": "batch_size=16 precision=no",
        "EVAL_ARGS": f"data.max_eval_samples=8 paths.cache_dir={cache_dir}",
    }
    proc = bash(
        "continue_roberta_xlmr.sh",
        "data.max_seq_length=64",
        "data.max_eval_samples=8",
        "train.batch_size=8",
        "train.max_steps=4",
        "train.log_every=2",
        f"paths.cache_dir={cache_dir}",
        env={**env, **settings},
        cwd=tmp_path,
    )
    rows = table_rows(proc.stdout)
    assert [r[0] for r in rows] == ["family", "XLM-RoBERTa"], proc.stdout[-3000:]
    row = rows[1]
    assert all(0 < float(c) < 1.2 * math.log(250002) for c in row[2:4]), row  # MLM losses
    assert all(0 <= float(c) <= 100 for c in row[5:7]) and re.fullmatch(
        r"none / \d+ s, 4 steps", row[7]
    ), row
    assert train_steps(out / "xlm-roberta" / "continued")[-1] == 4
    assert not (out / "xlm-roberta" / "general").exists()
    config = json.loads((out / "xlm-roberta" / "continued" / "final" / "config.json").read_text())
    assert config["model_type"] == "xlm-roberta" and config["vocab_size"] == 250002
    order = (out / "xlm-roberta" / "hindi-word-order" / "dev.tsv").read_text().splitlines()
    assert order[0] == "sentence\tlabel" and len(order) > 10


def test_released_model_lays_out_a_folder_that_transformers_loads(tmp_path, monkeypatch):
    """The helper behind continue_roberta_xlmr.sh and benchmarks/continue_vs_run_mlm.py, run as
    its command line in this process, for a family the example leaves out: DistilBERT with
    multilingual BERT's released WordPiece."""
    import runpy

    tokenizer = shared_file("tokenizers/bert-base-multilingual-cased")
    folder = tmp_path / "distilbert"
    sizes = ["--hidden", "16", "--layers", "1", "--heads", "2", "--ffn", "32"]
    argv = ["released_model.py", "distilbert", str(tokenizer), str(folder), *sizes]
    monkeypatch.setattr(sys, "argv", argv)
    runpy.run_path(str(EXAMPLES / "released_model.py"), run_name="__main__")
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    model = AutoModelForMaskedLM.from_pretrained(folder)
    assert type(model).__name__ == "DistilBertForMaskedLM" and model.config.dim == 16
    assert model.config.vocab_size == len(AutoTokenizer.from_pretrained(folder)) == 119547


def test_embedder_scores_the_stage_with_and_without_pairs_against_mlm_and_a_random_init(
    env, tmp_path, cache_dir
):
    """examples/embedder.sh, shrunk: the tiny model pretrained on AG News's texts, the stage with
    STS-B train pairs and without pairs (SimCSE, same-document pairs), every model scored on STS-B
    dev and its retrieval set. Its optional Hindi part (HINDI_RUN) runs the same commands on
    another corpus and is left out here (half a minute of the suite)."""
    # the script's inputs, cut to their first lines: its 16 commands score and train on less
    data = tmp_path / "data"
    for name, lines in (
        ("glue/STS-B/train.tsv", 600),
        ("glue/STS-B/dev.tsv", 300),
        ("agnews/dev.tsv", 1500),
        ("agnews/test.tsv", 500),
    ):
        (data / name).parent.mkdir(parents=True, exist_ok=True)
        with open(shared_file(name), encoding="utf-8") as f:
            (data / name).write_text("".join(itertools.islice(f, lines)), encoding="utf-8")
    work = tmp_path / "embedder"
    stage = {
        "PAIR_STEPS": "2",
        "TEXT_STEPS": "2",
        "BATCH": "8",
        "EMBED_ARGS": "max_texts=64 max_seq_length=32 precision=no",
    }
    proc = bash(
        "embedder.sh",
        *TINY,
        *STEPS,
        f"paths.cache_dir={cache_dir}",
        env={**env, "DATA": str(data), "WORK": str(work), **stage},
        cwd=tmp_path,
    )
    rows = [
        line.split(" | ")
        for line in proc.stdout.splitlines()
        if line.startswith("| ") and "---" not in line
    ]
    assert [r[0] for r in rows[1:6]] == [
        "| random init",
        "| MLM pretraining only",
        "| MLM + embed, pairs",
        "| MLM + embed, no pairs: SimCSE",
        "| MLM + embed, no pairs: same-document pairs",
    ], proc.stdout[-3000:]
    assert all(0 < float(r[2]) <= 1 for r in rows[1:6])  # nDCG@10 of each model
    assert len(rows) == 6  # the header and five models: no Hindi rows without HINDI_RUN
    pairs = json.loads((work / "pairs" / "results.json").read_text())
    assert (
        pairs["data"]["dropped"] > 0 and pairs["steps"] == 2
    )  # STS-B dev's texts left out of the pairs
    assert (work / "simcse" / "final" / "modules.json").is_file()


# --- the built-in corpus -------------------------------------------------------------------


def test_sweep_lr_tables_and_plots_the_sweep(env, tmp_path, cache_dir):
    sweep = tmp_path / "sweep"
    proc = bash(
        "sweep_lr.sh",
        *TINY,
        *STEPS,
        f"paths.cache_dir={cache_dir}",
        env={**env, "SWEEP_DIR": str(sweep)},
        cwd=tmp_path,
    )
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0", "1", "2"]
    table = [line for line in proc.stdout.splitlines() if re.match(r"\d+ +optim\.lr=", line)]
    assert len(table) == 3, proc.stdout
    assert (sweep / "curves.png").stat().st_size > 10_000


def test_multi_process_cpu_trains_with_two_processes(env, tmp_path, cache_dir):
    run = tmp_path / "run"
    bash(
        "multi_process_cpu.sh",
        *TINY,
        *STEPS,
        f"paths.cache_dir={cache_dir}",
        f"hydra.run.dir={run}",
        env={**env, "MAIN_PORT": free_port()},
        cwd=tmp_path,
    )
    log = (run / "train.log").read_text()
    assert re.search(r"2 process", log), log[:3000]
    assert train_steps(run)[-1] == 10 and (run / "final" / "config.json").is_file()


# --- SLURM ---------------------------------------------------------------------------------


def test_a_plain_sbatch_of_train_sbatch_writes_its_log_where_it_is_submitted():
    """SLURM opens --output before the script runs: the script's own must need no folder."""
    text = (EXAMPLES / "slurm" / "train.sbatch").read_text()
    (output,) = re.findall(r"^#SBATCH --output=(\S+)", text, flags=re.M)
    assert "/" not in output
