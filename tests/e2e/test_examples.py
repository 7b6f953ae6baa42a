"""Every script of examples/ runs, shrunk (a tiny model, a few steps: the overrides each script
takes last), as a user starts it: ``bash examples/<script> ...``, with its settings from the
environment. Their ``python`` is tests/fork_client.py, which runs each command in the test
process's fork server instead of a fresh interpreter. The SLURM scripts meet stand-ins for
sbatch, srun, scontrol and sacct (tests/e2e/fake_slurm/) that run the job on this machine.
The README links every script."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest
import runs
from conftest import SHARED_DATA, shared_file
from runs import ROOT, TEST_ENV, TINY, free_port, train_steps

EXAMPLES = ROOT / "examples"
FAKE_SLURM = Path(__file__).resolve().parent / "fake_slurm"
SCRIPTS = sorted(p.relative_to(EXAMPLES).as_posix() for p in EXAMPLES.rglob("*") if p.is_file())

# a few steps of the tiny model, quiet; the scripts' own overrides come first, these last
STEPS = ["train.max_steps=10", "train.eval_every=10", "train.save_every=0", "logger=none",
         "train.progress=false"]
# continued pretraining keeps the base model's shape and tokenizer: the rest of TINY
CONTINUE = ["data.max_seq_length=64", "data.max_eval_samples=64", "train.batch_size=8",
            "train.log_every=5", "optim.warmup_steps=2", *STEPS]


@pytest.fixture(scope="module")
def bin_dir(tmp_path_factory) -> Path:
    """A ``python`` that runs its commands in the fork server (tests/fork_client.py), and the
    SLURM stand-ins, in one folder for the front of PATH."""
    folder = tmp_path_factory.mktemp("bin")
    runs.write_fork_python(folder)
    for tool in FAKE_SLURM.iterdir():
        (folder / tool.name).symlink_to(tool)
    return folder


@pytest.fixture
def env(bin_dir, tmp_path) -> dict:
    state = tmp_path / "slurm"
    state.mkdir()
    return {**os.environ, **TEST_ENV, "PATH": f"{bin_dir}:{os.environ['PATH']}",
            "PYTHON": str(bin_dir / "python"), "FAKE_SLURM": str(state)}


def bash(script: str, *args: str, env: dict, cwd: Path, timeout: float = 240, check: bool = True):
    """``bash examples/<script> args``, to its end (on a timeout its processes are killed)."""
    proc = subprocess.Popen(["bash", str(EXAMPLES / script), *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"{script} ran past {timeout} s:\n{out[-2000:]}\n{err[-4000:]}") from None
    if check:
        assert proc.returncode == 0, f"{script} failed ({proc.returncode}):\n{out[-2000:]}\n{err[-4000:]}"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_every_example_is_tested_here_and_linked_from_the_readme():
    readme = (ROOT / "README.md").read_text()
    linked = set(re.findall(r"\]\((examples/[^)]+)\)", readme))
    assert {f"examples/{s}" for s in SCRIPTS} <= linked, sorted({f"examples/{s}" for s in SCRIPTS} - linked)
    source = Path(__file__).read_text()
    assert all(f'"{s}"' in source for s in SCRIPTS), [s for s in SCRIPTS if f'"{s}"' not in source]


# --- local files and continued pretraining (../shared/data) ---------------------------------

@pytest.fixture(scope="module")
def gutenberg_run(bin_dir, tmp_path_factory, cache_dir) -> Path:
    """examples/pretrain_local_files.sh, shrunk: its run dir (its final/ is a local BERT dir)."""
    shared_file("corpora/gutenberg")
    shared_file("corpora/wikitext-2/valid.txt")
    work = tmp_path_factory.mktemp("gutenberg")
    env = {**os.environ, **TEST_ENV, "PATH": f"{bin_dir}:{os.environ['PATH']}",
           "PYTHON": str(bin_dir / "python"), "DATA": str(SHARED_DATA / "corpora")}
    bash("pretrain_local_files.sh", *TINY, *STEPS, f"paths.cache_dir={cache_dir}", env=env, cwd=work)
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


def test_continued_pretraining_starts_from_a_local_bert_dir(gutenberg_run, env, tmp_path, cache_dir):
    base = gutenberg_run / "final"
    bash("continued_pretraining.sh", str(base), *CONTINUE, f"paths.cache_dir={cache_dir}",
         env={**env, "DATA": str(SHARED_DATA / "corpora")}, cwd=tmp_path)
    run = tmp_path / "outputs" / "continued-final"
    assert train_steps(run)[-1] == 10
    vocab = [json.loads((d / "tokenizer.json").read_text())["model"]["vocab"] for d in (base, run / "final")]
    assert vocab[0] == vocab[1]  # the base model's tokenizer, not a new one
    before, after = _embeddings(base), _embeddings(run / "final")
    assert before.shape == after.shape
    assert (after - before).norm() < 0.5 * before.norm()  # moved a little from the base's weights


def test_domain_adaptation_evaluates_before_and_after(gutenberg_run, env, tmp_path, cache_dir):
    base = gutenberg_run / "final"
    proc = bash("domain_adaptation.sh", str(base), *CONTINUE, f"paths.cache_dir={cache_dir}",
                env={**env, "DATA": str(SHARED_DATA / "corpora")}, cwd=tmp_path)
    out = proc.stdout + proc.stderr
    before, after = out.index("== before:"), out.index("== after:")
    assert before < after
    assert "accuracy" in out[before:after] and "accuracy" in out[after:], out[-3000:]
    assert train_steps(tmp_path / "outputs" / "gutenberg-to-wikitext")[-1] == 10


def test_domain_adaptation_names_a_base_that_is_no_model(env, tmp_path):
    proc = bash("domain_adaptation.sh", str(tmp_path / "nothing"), env=env, cwd=tmp_path, check=False)
    assert proc.returncode == 2
    assert proc.stderr.startswith("Error:") and "nothing" in proc.stderr and "config.json" in proc.stderr


def test_glue_fine_tunes_on_three_tasks(gutenberg_run, env, tmp_path):
    shared_file("glue/SST-2/train.tsv")
    proc = bash("glue.sh", str(gutenberg_run), "epochs=1", "max_train_samples=32", "batch_size=16",
                "max_seq_length=32", "save_model=false",
                env={**env, "GLUE": str(SHARED_DATA / "glue")}, cwd=tmp_path)
    results = sorted((tmp_path / "outputs" / "finetune").glob("*/*/results.json"))
    assert sorted(p.parent.parent.name for p in results) == ["cola", "rte", "sst2"], proc.stderr[-3000:]


def test_new_language_trains_a_hindi_tokenizer_and_encoder_that_keep_the_script(env, tmp_path, cache_dir):
    shared_file("corpora/hindi/sevasadan.txt")
    run = tmp_path / "outputs" / "hindi-bert-mini"
    proc = bash("new_language.sh", *TINY, *STEPS, f"paths.cache_dir={cache_dir}",
                env={**env, "DATA": str(SHARED_DATA / "corpora"), "VOCAB": "2000"}, cwd=tmp_path)
    assert "[UNK] is 0.00% of the tokens of the held-out text" in proc.stdout
    assert train_steps(run)[-1] == 10
    assert "[UNK] is 0.00% of the validation text's tokens" in (run / "final" / "README.md").read_text()
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(run / "final")
    word = "स्वतन्त्रता"  # स्वतन्त्रता
    assert tok.decode(tok(word)["input_ids"], skip_special_tokens=True) == word  # its viramas kept
    answers = [line for line in proc.stdout.splitlines() if line.strip()][-5:]
    assert len(answers) == 5 and all(re.search(r"\d\.\d", line) for line in answers), proc.stdout[-2000:]


def test_embedder_scores_the_stage_with_and_without_pairs_against_mlm_and_a_random_init(env, tmp_path, cache_dir):
    """examples/embedder.sh, shrunk: the tiny model pretrained on AG News's texts, the stage with
    STS-B train pairs and without pairs (SimCSE, same-document pairs), every model scored on STS-B
    dev and its retrieval set, and the Hindi part on the same tiny run as a stand-in."""
    shared_file("glue/STS-B/dev.tsv")
    shared_file("agnews/dev.tsv")
    shared_file("corpora/hindi/sevasadan.txt")
    work = tmp_path / "embedder"
    stage = {"PAIR_STEPS": "2", "TEXT_STEPS": "2", "HINDI_STEPS": "2", "BATCH": "8", "HINDI_RUN": str(work / "mlm"),
             "EMBED_ARGS": "max_texts=64 max_seq_length=32 precision=no"}
    proc = bash("embedder.sh", *TINY, *STEPS, f"paths.cache_dir={cache_dir}",
                env={**env, "DATA": str(SHARED_DATA), "WORK": str(work), **stage}, cwd=tmp_path)
    rows = [line.split(" | ") for line in proc.stdout.splitlines() if line.startswith("| ") and "---" not in line]
    assert [r[0] for r in rows[1:6]] == ["| random init", "| MLM pretraining only", "| MLM + embed, pairs",
                                         "| MLM + embed, no pairs: SimCSE",
                                         "| MLM + embed, no pairs: same-document pairs"], proc.stdout[-3000:]
    assert all(0 < float(r[2]) <= 1 for r in rows[1:6])  # nDCG@10 of each model
    assert [r[0] for r in rows[6:]] == ["| Hindi, simcse: before -> after", "| Hindi, same_document: before -> after"]
    pairs = json.loads((work / "pairs" / "results.json").read_text())
    assert pairs["data"]["dropped"] > 0 and pairs["steps"] == 2  # STS-B dev's texts left out of the pairs
    assert (work / "simcse" / "final" / "modules.json").is_file()


# --- the built-in corpus -------------------------------------------------------------------

def test_sweep_lr_tables_and_plots_the_sweep(env, tmp_path, cache_dir):
    sweep = tmp_path / "sweep"
    proc = bash("sweep_lr.sh", *TINY, *STEPS, f"paths.cache_dir={cache_dir}",
                env={**env, "SWEEP_DIR": str(sweep)}, cwd=tmp_path)
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["0", "1", "2"]
    table = [line for line in proc.stdout.splitlines() if re.match(r"\d+ +optim\.lr=", line)]
    assert len(table) == 3, proc.stdout
    assert (sweep / "curves.png").stat().st_size > 10_000


def test_multi_process_cpu_trains_with_two_processes(env, tmp_path, cache_dir):
    run = tmp_path / "run"
    bash("multi_process_cpu.sh", *TINY, *STEPS, f"paths.cache_dir={cache_dir}", f"hydra.run.dir={run}",
         env={**env, "MAIN_PORT": free_port()}, cwd=tmp_path)
    log = (run / "train.log").read_text()
    assert re.search(r"2 process", log), log[:3000]
    assert train_steps(run)[-1] == 10 and (run / "final" / "config.json").is_file()


# --- SLURM ---------------------------------------------------------------------------------

def test_submitit_script_submits_a_job_that_trains(env, tmp_path, cache_dir):
    proc = bash("slurm/submitit.sh", *TINY, *STEPS,
                f"paths.cache_dir={cache_dir}", f"hydra.sweep.dir={tmp_path / 'sweep'}", env=env, cwd=tmp_path)
    run = tmp_path / "sweep" / "0"
    assert train_steps(run)[-1] == 10, proc.stderr[-3000:]
    submission = (tmp_path / "slurm" / "sbatch.args").read_text().split()
    script = Path(submission[-1]).read_text()  # what submitit asked SLURM to run
    assert "#SBATCH --signal=USR2@120" in script and "#SBATCH --partition=gpu" in script


def _corpus(folder: Path) -> Path:
    """A text file in a folder whose name has a space, from the built-in corpus."""
    from mlmkit.data.sources import builtin_documents

    path = folder / "my corpus" / "text.txt"
    path.parent.mkdir(parents=True)
    text, size = [], 0
    for doc in builtin_documents():
        text.append(doc)
        size += len(doc)
        if size > 300_000:
            break
    path.write_text("\n\n".join(text))
    return path


def _wait(condition, timeout: float = 240, what: str = "") -> None:
    deadline = time.time() + timeout
    while not condition():
        assert time.time() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_train_sbatch_submits_itself_logs_and_requeues_after_the_checkpoint(env, tmp_path, cache_dir):
    """bash train.sbatch: the logs/ folder made, the script submitted with its log there; the
    job trains on one node; SLURM's warning (SIGUSR1 to the step's processes) ends it with a
    checkpoint and status 75, the script requeues it, and the requeued job, in the same run
    dir, continues to the end. An override with a space and a glob reaches mlmkit whole."""
    corpus = _corpus(tmp_path)
    overrides = [*TINY, "train.max_steps=300", "train.log_every=1", "train.eval_every=0",
                 "train.save_every=0", "train.precision=no", "logger=none", "data=files",
                 f"data.train_files=['{corpus.parent}/*.txt']", f"paths.cache_dir={cache_dir}"]
    state = tmp_path / "slurm"
    env = {**env, "GPUS_PER_NODE": "1", "MAIN_PORT": free_port(), "ACCELERATE_USE_CPU": "1"}
    proc = bash("slurm/train.sbatch", *overrides, env=env, cwd=tmp_path)
    assert proc.stdout.strip() == "Submitted batch job 1001"
    args = (state / "sbatch.args").read_text().splitlines()
    assert args == ["--output=logs/%x-%j.out", str(EXAMPLES / "slurm" / "train.sbatch"), *overrides]
    assert (tmp_path / "logs").is_dir()
    run = tmp_path / "outputs" / "slurm-1001"
    _wait(lambda: len(train_steps(run)) >= 3, what="training steps")
    step = int((state / "step-1001.pid").read_text())
    os.killpg(step, signal.SIGUSR1)  # SLURM's warning goes to every process of the job's step
    _wait(lambda: (state / "job-1001.done").exists(), timeout=300, what="the job's end")
    log = (tmp_path / "logs" / "mlmkit-1001.out").read_text()
    assert (state / "job-1001.status").read_text().split() == ["75", "0"], log[-4000:]
    assert "Stopped by SIGUSR1" in log and "requeueing job 1001" in log and "Resumed from" in log
    assert (state / "scontrol.log").read_text() == "requeue 1001\n"
    assert train_steps(run) == list(range(1, 301))  # every step once: resumed, not restarted
    assert (run / "final" / "config.json").is_file()
    # the packaged multi_node config, written where every node reads it
    assert (run / "accelerate.yaml").read_text() == (ROOT / "conf" / "accelerate" / "multi_node.yaml").read_text()


def test_a_plain_sbatch_of_train_sbatch_writes_its_log_where_it_is_submitted():
    """SLURM opens --output before the script runs: the script's own must need no folder."""
    text = (EXAMPLES / "slurm" / "train.sbatch").read_text()
    (output,) = re.findall(r"^#SBATCH --output=(\S+)", text, flags=re.M)
    assert "/" not in output
