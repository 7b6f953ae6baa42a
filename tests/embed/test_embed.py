"""mlmkit embed: the contrastive stage on sentence-transformers' trainer (mlmkit.embed.stage),
its rows and held-out data (mlmkit.embed.data), the sets built from data at hand
(mlmkit.embed.sets), and the run (mlmkit.embed.run): a tiny BERT made here trains on synthetic
pairs and raw text, is scored before and after on held-out STS and retrieval data, and loads as
a SentenceTransformer in a process that never imports mlmkit."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from runs import TEST_ENV

from mlmkit.errors import ConfigError, DataError

COLORS = ["red", "blue", "green", "yellow", "black", "white", "brown", "grey"]
ANIMALS = ["fox", "dog", "cat", "horse", "bird", "goat", "sheep", "mouse"]
PLACES = ["park", "field", "river", "garden", "street", "forest", "barn", "beach"]


def anchor(c: str, a: str, p: str) -> str:
    return f"the {c} {a} runs in the {p} today."


def positive(c: str, a: str, p: str) -> str:
    return f"a {a}, {c} in colour, is running around a {p}."


def triples(seed: int, n: int) -> list[tuple[str, str, str]]:
    rng = random.Random(seed)
    return [(rng.choice(COLORS), rng.choice(ANIMALS), rng.choice(PLACES)) for _ in range(n)]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny BERT model dir (random weights, no dropout as mlmkit's presets, a WordPiece
    vocabulary of the synthetic sentences), training pairs, an STS-B-format folder and a
    BEIR folder built from it, with no text shared between training and held-out data."""
    from transformers import BertConfig, BertForMaskedLM

    from mlmkit.config import TokenizerConfig
    from mlmkit.data.tokenizer import train_tokenizer
    from mlmkit.embed.sets import sts_retrieval

    root = tmp_path_factory.mktemp("embed")
    train = triples(0, 200)
    held = list(dict.fromkeys(t for t in triples(1, 200) if t not in set(train)))[:40]
    texts = [f(*t) for t in train + held for f in (anchor, positive)]
    tok = train_tokenizer(TokenizerConfig(vocab_size=200, min_frequency=1), texts * 3)
    config = BertConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    model_dir = root / "model"
    BertForMaskedLM(config).save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    pairs = root / "pairs.jsonl"
    pairs.write_text(
        "".join(json.dumps({"anchor": anchor(*t), "positive": positive(*t)}) + "\n" for t in train)
    )
    sts = root / "sts"
    sts.mkdir()
    lines = []
    for i, (t, u) in enumerate(zip(held, held[1:])):  # a paraphrase scores 5, a stranger by overlap
        other = positive(*u) if i % 2 else positive(*t)
        score = 5.0 if i % 2 == 0 else sum(x == y for x, y in zip(t, u)) * 1.5
        lines.append(
            f"{i}\tmain-captions\tx\t2012\t{i:04d}\tnone\tnone\t{anchor(*t)}\t{other}\t{score}"
        )
    (sts / "dev.tsv").write_text("\n".join(lines) + "\n")
    (sts / "train.tsv").write_text("\n".join(lines) + "\n")
    sts_retrieval(sts, root / "beir")
    return type(
        "Tiny",
        (),
        {
            "root": root,
            "model": model_dir,
            "pairs": pairs,
            "sts": sts,
            "beir": root / "beir",
            "train": train,
        },
    )


def compose(*overrides: str):
    """The ``EmbedConfig`` that ``mlmkit embed <overrides>`` runs with."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra

    from mlmkit.config import CONFIG_MODULE, EmbedConfig, register_configs, to_config

    register_configs()
    GlobalHydra.instance().clear()
    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        cfg = hydra_compose(config_name="embed", overrides=list(overrides))
    return to_config(cfg, EmbedConfig)


def base_args(tiny, *more: str) -> list[str]:
    return [
        f"checkpoint={tiny.model}",
        f"pairs.files=[{tiny.pairs}]",
        "batch_size=16",
        "lr=1e-3",
        "logger=none",
        "precision=no",
        "log_every=2",
        *more,
    ]


def events(run: Path, kind: str) -> list[dict]:
    lines = (run / "metrics.jsonl").read_text().splitlines()
    return [e for e in map(json.loads, lines) if e["event"] == kind]


def pair_margin(model, rows) -> float:
    """The mean cosine of each anchor with its own positive, less that with the others'."""
    import torch

    a = torch.nn.functional.normalize(
        model.encode([r[0] for r in rows], convert_to_tensor=True), dim=-1
    )
    p = torch.nn.functional.normalize(
        model.encode([r[1] for r in rows], convert_to_tensor=True), dim=-1
    )
    sims = a @ p.T
    n = len(rows)
    return float(sims.diag().mean() - (sims.sum() - sims.diag().sum()) / (n * n - n))


# ---- the stage ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def pairs_run(tiny):
    """An embed run with pairs, scored on the held-out STS and retrieval sets before, at step
    10 and after (20 steps), with Matryoshka dimensions."""
    from mlmkit.embed.run import embed

    run = tiny.root / "pairs-run"
    cfg = compose(
        *base_args(
            tiny,
            "max_steps=20",
            "eval_every=10",
            f"sts_dir={tiny.sts}",
            f"retrieval_dir={tiny.beir}",
            "matryoshka_dims=[16]",
        )
    )
    return run, embed(cfg, run)


def test_embed_with_pairs_logs_held_out_figures_and_exports_a_sentence_transformer(tiny, pairs_run):
    from sentence_transformers import SentenceTransformer

    run, summary = pairs_run
    evals = events(run, "eval")
    assert [e["step"] for e in evals] == [0, 10, 20]  # before, every eval_every, after
    figures = {
        "sts_spearman",
        "sts_pearson",
        "sts_16d_spearman",
        "retrieval_ndcg@10",
        "retrieval_recall@100",
        "retrieval_mrr@10",
    }
    assert figures <= set(evals[0]) and all(-1 <= evals[-1][k] <= 1 for k in figures)
    assert [e["step"] for e in events(run, "train")] == list(range(2, 21, 2))
    assert summary["before"] == {k: v for k, v in evals[0].items() if k not in ("event", "step")}
    assert summary["steps"] == 20 and summary["data"]["rows"] == len(tiny.train)
    assert summary["matryoshka_dims"] == [32, 16]
    final = run / "final"
    assert {"modules.json", "config.json", "model.safetensors", "README.md"} <= {
        p.name for p in final.iterdir()
    }
    card = (final / "README.md").read_text()
    assert str(tiny.model) in card and str(tiny.pairs) in card and str(tiny.beir) in card
    assert (
        f"{evals[-1]['retrieval_ndcg@10']:.4f}" in card
        and f"{evals[0]['sts_spearman']:.4f}" in card
    )
    # training pulled each training anchor towards its own positive, away from the others'
    before = SentenceTransformer(str(tiny.model), device="cpu")
    after = SentenceTransformer(str(final), device="cpu")
    rows = [(anchor(*t), positive(*t)) for t in tiny.train[:64]]
    assert pair_margin(after, rows) > pair_margin(before, rows) + 0.05
    assert after.encode(["a red fox"], truncate_dim=16).shape == (1, 16)


def test_the_exported_embedder_loads_in_a_process_without_mlmkit(pairs_run):
    """A real interpreter: sentence-transformers alone loads final/ and encodes as the run's
    own model does, and mlmkit is never imported."""
    from sentence_transformers import SentenceTransformer

    final = pairs_run[0] / "final"
    texts = [
        "the red fox runs in the park today.",
        "a fox, red in colour, is running around a park.",
    ]
    code = (
        "import json, sys\nfrom sentence_transformers import SentenceTransformer\n"
        f"m = SentenceTransformer({str(final)!r}, device='cpu')\n"
        f"v = m.encode({texts!r})\n"
        "assert not [n for n in sys.modules if n == 'mlmkit' or n.startswith('mlmkit.')]\n"
        "print(json.dumps(v.tolist()))\n"
    )
    env = {**os.environ, **TEST_ENV}
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd="/", env=env, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    want = SentenceTransformer(str(final), device="cpu").encode(texts)
    assert len(got) == 2 and max(abs(x - y) for g, w in zip(got, want) for x, y in zip(g, w)) < 1e-5


def test_the_command_prints_the_figures_before_and_after(tiny, capsys):
    from mlmkit.cli import main

    run = tiny.root / "cli-run"
    args = [
        a
        for a in base_args(
            tiny, "max_steps=2", f"sts_dir={tiny.sts}", "loss=cached_mnrl", "mini_batch_size=4"
        )
        if a != "logger=none"
    ]
    assert main(["embed", *args, "logger=tensorboard", f"hydra.run.dir={run}"]) == 0
    out = capsys.readouterr().out
    assert "pairs on 200 rows, 2 steps" in out and "sts_spearman" in out and " -> " in out
    assert json.loads((run / "results.json").read_text())["loss"] == "cached_mnrl"
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))  # the tracker's own file


def test_simcse_turns_dropout_on_and_reads_only_the_training_split(tiny):
    """The raw corpus as pretraining reads it (data=files): each sentence its own positive,
    dropout 0.1 although the model's config has none, the held-out documents left out."""
    from mlmkit.data.sources import load_corpus
    from mlmkit.embed.data import corpus_rows, sentences
    from mlmkit.embed.run import embed
    from mlmkit.embed.stage import build_model, dropout_of

    corpus = tiny.root / "corpus.txt"
    corpus.write_text(
        "\n\n".join(
            " ".join(f"Story {i}, line {j}: {anchor(*t)}" for j, t in enumerate(triples(i, 3)))
            for i in range(40)
        )
    )
    overrides = base_args(
        tiny, "objective=simcse", "data=files", f"data.train_files=[{corpus}]", "max_steps=2"
    )
    cfg = compose(*overrides)
    rows, about = corpus_rows(cfg, held_out=set())
    assert all(r["anchor"] == r["positive"] for r in rows) and about["dropped"] == 0
    validation = {s for doc in load_corpus(cfg.data)["validation"]["text"] for s in sentences(doc)}
    assert validation and not validation & {r["anchor"] for r in rows}
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tiny.model)
    assert dropout_of(cfg, config) == 0.1 and config.hidden_dropout_prob == 0.0
    model = build_model(tiny.model, 32, dropout_of(cfg, config), config)
    assert {m.p for m in model.modules() if type(m).__name__ == "Dropout"} == {0.1}
    summary = embed(cfg, tiny.root / "simcse-run")
    assert summary["dropout"] == 0.1 and summary["objective"] == "simcse"
    assert (
        json.loads((tiny.root / "simcse-run" / "final" / "config.json").read_text())[
            "hidden_dropout_prob"
        ]
        == 0.1
    )
    # same_document: neighbouring sentences of one document, the model's own dropout
    doc_cfg = compose(*overrides[:-1], "objective=same_document", "max_steps=2")
    rows, _ = corpus_rows(doc_cfg, held_out=set())
    assert (
        rows
        and all(r["anchor"] != r["positive"] for r in rows)
        and dropout_of(doc_cfg, config) is None
    )


def test_a_run_resumes_from_its_checkpoint_and_a_time_budget_ends_it(tiny):
    from mlmkit.embed.run import embed

    run = tiny.root / "resumed"
    embed(compose(*base_args(tiny, "max_steps=4", "save_every=4")), run)
    assert (run / "checkpoints" / "checkpoint-4").is_dir()
    summary = embed(compose(*base_args(tiny, "max_steps=8", "resume=auto")), run)
    assert summary["steps"] == 8
    assert [e["step"] for e in events(run, "train")] == [2, 4, 6, 8]  # nothing logged twice
    with pytest.raises(ConfigError, match="resume=auto"):  # a run dir holding a run, not resumed
        embed(compose(*base_args(tiny, "max_steps=2")), run)
    timed = embed(compose(*base_args(tiny, "max_steps=100000", "max_time=1")), tiny.root / "timed")
    assert timed["stopped_by"] == "max_time" and 1 <= timed["steps"] < 100000
    assert (tiny.root / "timed" / "final" / "modules.json").is_file()


# ---- held-out data and rows ---------------------------------------------------------------------


def test_training_pairs_sharing_a_text_with_the_evaluation_data_are_left_out_or_refused(
    tiny, caplog
):
    from mlmkit.embed.data import drop_held_out, normalise

    rows = [
        {"anchor": "A cat sits.", "positive": "A  CAT is sitting."},
        {"anchor": "x y z", "positive": "u v"},
    ]
    kept, dropped = drop_held_out(rows, {normalise("a cat is sitting.")}, "drop", "training pairs")
    assert kept == rows[1:] and dropped == 1
    with pytest.raises(DataError, match="1 of the 2 training pairs share a text.*overlap=drop"):
        drop_held_out(rows, {normalise("a cat is sitting.")}, "error", "training pairs")
    # the STS folder's pairs (and so the retrieval set's texts) among the training pairs
    leaky = tiny.root / "leaky.jsonl"
    dev = [line.split("\t") for line in (tiny.sts / "dev.tsv").read_text().splitlines()]
    leaky.write_text(
        tiny.pairs.read_text()
        + "".join(json.dumps({"anchor": f[7], "positive": f[8]}) + "\n" for f in dev[:5])
    )
    from mlmkit.embed.data import load_eval_data, training_rows

    cfg = compose(
        *base_args(
            tiny, f"pairs.files=[{leaky}]", f"sts_dir={tiny.sts}", f"retrieval_dir={tiny.beir}"
        )
    )
    rows, about = training_rows(cfg, load_eval_data(cfg).texts())
    assert about["dropped"] >= 5 and len(rows) == 200 + 5 - about["dropped"]
    assert (
        "Left out 5 of the 205 training pairs that share a text with the evaluation data"
        in caplog.text
    )


def test_pairs_come_from_jsonl_csv_tsv_and_a_local_dataset_dir_with_hard_negatives(tmp_path):
    import datasets

    from mlmkit.config import EmbedPairsConfig
    from mlmkit.embed.data import read_hub_pairs, read_pair_file

    pairs = EmbedPairsConfig(anchor_column="q", positive_column="d", negative_column="n")
    (tmp_path / "p.csv").write_text('q,d,n\n"a, quoted",b,c\nd,,f\n')
    (tmp_path / "p.tsv").write_text("q\td\tn\nx\ty\tz\n")
    (tmp_path / "p.jsonl").write_text('{"q": "1", "d": "2", "n": "3"}\nnot json\n')
    assert read_pair_file(tmp_path / "p.csv", pairs) == [
        {"anchor": "a, quoted", "positive": "b", "negative": "c"}
    ]
    assert read_pair_file(tmp_path / "p.tsv", pairs) == [
        {"anchor": "x", "positive": "y", "negative": "z"}
    ]
    assert read_pair_file(tmp_path / "p.jsonl", pairs) == [
        {"anchor": "1", "positive": "2", "negative": "3"}
    ]
    datasets.Dataset.from_dict({"q": ["a", "b"], "d": ["c", "d"], "n": ["e", "f"]}).save_to_disk(
        tmp_path / "ds"
    )
    pairs.hub_name = str(tmp_path / "ds")
    assert read_hub_pairs(pairs)[1] == {"anchor": "b", "positive": "d", "negative": "f"}


def test_sets_built_from_sts_and_from_held_out_documents(tiny, tmp_path):
    from mlmkit.embed.sets import document_retrieval, main, sts_training_pairs
    from mlmkit.evaluation.retrieval import read_beir

    beir = read_beir(tiny.beir, "test")
    dev = [line.split("\t") for line in (tiny.sts / "dev.tsv").read_text().splitlines()]
    high = {f[7]: f[8] for f in dev if float(f[9]) >= 4}
    assert {beir.queries[q] for q in beir.relevant} == set(high)
    assert all(
        high[beir.queries[q]] == beir.corpus[d] for q, docs in beir.relevant.items() for d in docs
    )
    assert not set(beir.queries.values()) & set(beir.corpus.values())  # no query finds itself
    assert sts_training_pairs(tiny.sts, tmp_path / "p.jsonl") == len(high)
    text = tmp_path / "novel.txt"
    text.write_text(
        "\n\n".join(
            " ".join(f"Sentence {i} of part {d} is here." for i in range(9)) for d in range(60)
        )
    )
    found = document_retrieval([str(text)], tmp_path / "docs")
    docs = read_beir(tmp_path / "docs", "test")
    assert found["queries"] == len(docs.relevant) >= 2
    q = next(iter(docs.relevant))
    part = docs.queries[q].split(" of part ")[1].split()[0]
    assert all(f"of part {part} " in docs.corpus[d] for d in docs.relevant[q])
    assert main(["stsb", str(tmp_path / "nowhere"), str(tmp_path / "out")]) == 2


# ---- bad input: one sentence, exit status 2 -----------------------------------------------------


def _not_an_encoder(tmp_path: Path) -> Path:
    """A GPT-2 model dir (a decoder), its weights in safetensors."""
    from transformers import GPT2Config, GPT2LMHeadModel

    folder = tmp_path / "gpt2"
    GPT2LMHeadModel(
        GPT2Config(n_layer=1, n_embd=8, n_head=2, vocab_size=50, n_positions=16)
    ).save_pretrained(folder)
    return folder


BAD = {
    "no column": (
        lambda t, p: [f"pairs.files=[{p / 'cols.jsonl'}]"],
        "has no column 'anchor'",
        "pairs.anchor_column",
    ),
    "empty file": (
        lambda t, p: [f"pairs.files=[{p / 'empty.jsonl'}]"],
        "holds no pairs",
        "pairs.files",
    ),
    "no file": (
        lambda t, p: [f"pairs.files=[{p / 'missing.jsonl'}]"],
        "no file matches",
        "pairs.files",
    ),
    "not an encoder": (
        lambda t, p: [f"checkpoint={_not_an_encoder(p)}"],
        "'gpt2' model",
        "checkpoint",
    ),
    "batch of 1": (lambda t, p: ["batch_size=1"], "at least 2 rows per batch", "batch_size"),
    "no pairs": (lambda t, p: ["pairs.files=[]"], "needs training pairs", "objective=simcse"),
    "matryoshka": (
        lambda t, p: ["matryoshka_dims=[64]"],
        "more than the model's 32",
        "matryoshka_dims",
    ),
    "resume": (lambda t, p: [f"resume={p}"], "not a checkpoint of mlmkit embed", "resume=auto"),
    "overlap": (
        lambda t, p: [f"pairs.files=[{p / 'leak.jsonl'}]", f"sts_dir={t.sts}", "overlap=error"],
        "share a text with the evaluation data",
        "overlap=drop",
    ),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_sentence_and_exit_status_2(tiny, tmp_path, capfd, case):
    from mlmkit.cli import main

    (tmp_path / "cols.jsonl").write_text('{"query": "a", "positive": "b"}\n')
    (tmp_path / "empty.jsonl").write_text("")
    first = (tiny.sts / "dev.tsv").read_text().splitlines()[0].split("\t")
    (tmp_path / "leak.jsonl").write_text(
        tiny.pairs.read_text() + json.dumps({"anchor": first[7], "positive": "b"}) + "\n"
    )
    make, words, setting = BAD[case]
    args = [
        "embed",
        *base_args(tiny, "max_steps=1"),
        *make(tiny, tmp_path),
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    with pytest.raises(SystemExit) as ended:
        main(args)
    assert ended.value.code == 2
    err = [line for line in capfd.readouterr().err.splitlines() if line.startswith("Error:")]
    assert len(err) == 1 and words in err[0] and setting in err[0], err
    assert not (tmp_path / "run" / "final").exists()
