"""mlmkit eval-retrieval: a BEIR-format folder (Thakur et al., 2021) built from STS-B's dev
pairs, the reader and its errors, the metric wiring with stand-in embedders whose figures are
known, and the command on a tiny trained run."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import shared_file
from runs import run_cli

from mlmkit.errors import DataError

HIGH, LOW = (
    4.0,
    1.0,
)  # a pair's query finds its document at a gold score >= HIGH; < LOW: distractors


def stsb_pairs() -> list[tuple[str, str, str, float]]:
    """``(genre, sentence1, sentence2, score)`` of STS-B's dev pairs, each text once: a pair
    with a sentence seen before (in either role) is left out, so a text names one pair."""
    path = shared_file("glue/STS-B/dev.tsv")
    seen, pairs = set(), []
    for line in path.read_text(encoding="utf-8").splitlines():
        fields = line.split("\t")
        if len(fields) != 10 or fields[9] == "score":
            continue
        a, b = fields[7].strip(), fields[8].strip()
        if a == b or a in seen or b in seen:
            continue
        seen |= {a, b}
        pairs.append((fields[1], a, b, float(fields[9])))
    return pairs


def write_beir(folder: Path, pairs, split: str = "test") -> dict[str, list[str]]:
    """A BEIR-format folder: each high-score pair's sentence1 a query (q<n>), its sentence2
    the one relevant document (d<n>); each low-score pair's sentence2 a distractor document
    (x<n>) titled with the pair's sentence1. Returns the ids written."""
    high = [(i, p) for i, p in enumerate(pairs) if p[3] >= HIGH]
    low = [(i, p) for i, p in enumerate(pairs) if p[3] < LOW]
    docs = [{"_id": f"d{i}", "title": "", "text": b} for i, (_, _, b, _) in high]
    docs += [{"_id": f"x{i}", "title": a, "text": b} for i, (_, a, b, _) in low]
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    (folder / "corpus.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    (folder / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": f"q{i}", "text": a}) + "\n" for i, (_, a, _, _) in high)
    )
    (folder / "qrels" / f"{split}.tsv").write_text(
        "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i, _ in high)
    )
    return {"queries": [f"q{i}" for i, _ in high], "documents": [d["_id"] for d in docs]}


@pytest.fixture(scope="module")
def beir(tmp_path_factory) -> SimpleNamespace:
    folder = tmp_path_factory.mktemp("beir") / "stsb"
    pairs = stsb_pairs()
    ids = write_beir(folder, pairs)
    return SimpleNamespace(folder=folder, pairs=pairs, **ids)


# ---- the reader -------------------------------------------------------------------------------


def test_a_beir_folder_is_read_with_titles_before_texts(beir):
    from mlmkit.evaluation.retrieval import read_beir

    data = read_beir(beir.folder, "test")
    assert 200 <= len(beir.queries) <= 400 and len(beir.documents) > len(beir.queries) + 100
    assert list(data.queries) == beir.queries and list(data.corpus) == beir.documents
    assert data.relevant == {q: {"d" + q[1:]} for q in beir.queries}
    first = beir.queries[0][1:]
    _, a, b, _ = beir.pairs[int(first)]
    assert data.queries[f"q{first}"] == a and data.corpus[f"d{first}"] == b  # empty title: the text
    i, (_, a, b, _) = next((i, p) for i, p in enumerate(beir.pairs) if p[3] < LOW)
    assert data.corpus[f"x{i}"] == f"{a} {b}"  # BEIR's title + " " + text


def test_qrels_scores_of_zero_are_not_relevant_and_ids_may_be_numbers(tmp_path):
    from mlmkit.evaluation.retrieval import read_beir

    (tmp_path / "qrels").mkdir()
    (tmp_path / "corpus.jsonl").write_text(
        '{"_id": 1, "text": "A man plays a cello."}\n\n{"_id": "2", "text": "A cat sleeps."}\n'
    )
    (tmp_path / "queries.jsonl").write_text(
        '{"_id": "a", "text": "cello"}\n{"_id": "b", "text": "cat"}\n'
    )
    (tmp_path / "qrels" / "dev.tsv").write_text(
        "query-id\tcorpus-id\tscore\na\t1\t2\nb\t2\t0\na\t2\t0\n"
    )
    data = read_beir(tmp_path, "dev")
    assert data.corpus == {"1": "A man plays a cello.", "2": "A cat sleeps."}
    assert data.relevant == {"a": {"1"}}  # b has no relevant document: BEIR leaves it out


# ---- the metric wiring: stand-in embedders whose figures are known ----------------------------


def one_hot_embedder(data, second: str | None = None):
    """texts -> vectors: each document a one-hot vector of its own, each query its relevant
    document's; with ``second``, each query leans twice as much towards the document ``second``,
    so that its relevant document ranks second."""
    import torch

    docs = {text: i for i, text in enumerate(data.corpus.values())}
    row = {doc_id: i for i, doc_id in enumerate(data.corpus)}
    queries = {}
    for query_id, relevant in data.relevant.items():
        vector = torch.zeros(len(docs))
        vector[row[next(iter(relevant))]] = 1.0
        if second is not None:
            vector[row[second]] = 2.0
        queries[data.queries[query_id]] = vector
    calls = []

    def one_hot(i):
        vector = torch.zeros(len(docs))
        vector[i] = 1.0
        return vector

    def embed_texts(texts):
        calls.append(len(texts))
        return torch.stack([queries[t] if t in queries else one_hot(docs[t]) for t in texts])

    return embed_texts, calls


def test_perfect_embeddings_score_one(beir):
    from mlmkit.evaluation.retrieval import read_beir, retrieval_scores

    data = read_beir(beir.folder)
    embed_texts, calls = one_hot_embedder(data)
    scores = retrieval_scores(embed_texts, data, batch_size=32)
    assert scores == {
        "queries": len(beir.queries),
        "documents": len(beir.documents),
        "ndcg@10": pytest.approx(1.0),
        "recall@100": pytest.approx(1.0),
        "mrr@10": pytest.approx(1.0),
    }
    assert sum(calls) == len(beir.queries) + len(beir.documents)  # every text embedded once


def test_the_relevant_document_second_gives_mrr_one_half(beir):
    from mlmkit.evaluation.retrieval import read_beir, retrieval_scores

    data = read_beir(beir.folder)
    distractor = next(d for d in beir.documents if d.startswith("x"))
    scores = retrieval_scores(one_hot_embedder(data, second=distractor)[0], data)
    assert scores["mrr@10"] == pytest.approx(0.5)
    assert scores["ndcg@10"] == pytest.approx(1 / math.log2(3))  # one relevant document at rank 2
    assert scores["recall@100"] == pytest.approx(1.0)


def test_documents_past_the_cutoffs_count_for_nothing(beir):
    """Each query's relevant document ranked below 100 others: every figure 0."""
    import torch

    from mlmkit.evaluation.retrieval import read_beir, retrieval_scores

    data = read_beir(beir.folder)
    distractors = [i for i, d in enumerate(data.corpus) if d.startswith("x")][:100]
    assert len(distractors) == 100
    base, _ = one_hot_embedder(data)

    queries = set(data.queries.values())

    def embed_texts(texts):
        vectors = base(texts)
        is_query = torch.tensor([t in queries for t in texts])
        vectors[is_query.nonzero().squeeze(1)[:, None], torch.tensor(distractors)] = 2.0
        return vectors

    scores = retrieval_scores(embed_texts, data)
    assert scores["ndcg@10"] == scores["recall@100"] == scores["mrr@10"] == 0.0


# ---- the model: the vectors of final/'s sentence-transformers embedder -------------------------


def test_the_embeddings_are_those_of_the_exported_sentence_embedder(trained_run, beir):
    pytest.importorskip("sentence_transformers")
    import torch
    from sentence_transformers import SentenceTransformer

    from mlmkit.config import RetrievalEvalConfig
    from mlmkit.evaluation.retrieval import model_embedder

    texts = [p[2] for p in beir.pairs[:20]]
    texts.append(" ".join(p[1] for p in beir.pairs[:30]))  # longer than the 64 tokens kept
    embed_texts, resolved, length = model_embedder(
        RetrievalEvalConfig(checkpoint=str(trained_run), data_dir=str(beir.folder))
    )
    assert resolved == trained_run / "final" and length == 64  # final/'s sentence_bert_config.json
    expected = SentenceTransformer(str(resolved), device="cpu").encode(
        texts, convert_to_tensor=True
    )
    torch.testing.assert_close(embed_texts(texts), expected.cpu(), rtol=1e-4, atol=1e-5)


def test_the_tokens_kept_follow_the_setting_final_and_the_run(trained_run, tmp_path):
    from mlmkit.config import RetrievalEvalConfig
    from mlmkit.evaluation.retrieval import DEFAULT_LENGTH, embedding_length

    encoder = SimpleNamespace(
        config=SimpleNamespace(model_type="bert", max_position_embeddings=512)
    )
    cfg = RetrievalEvalConfig(checkpoint="x", data_dir="y")
    checkpoint = sorted((trained_run / "checkpoints").glob("step_*"))[-1]
    assert embedding_length(cfg, trained_run / "final", encoder) == 64
    assert embedding_length(cfg, checkpoint, encoder) == 64  # the run's data.max_seq_length
    assert embedding_length(cfg, tmp_path, encoder) == DEFAULT_LENGTH  # a model dir of no run
    cfg.max_seq_length = 100
    assert embedding_length(cfg, trained_run / "final", encoder) == 100
    encoder.config.max_position_embeddings = 40
    assert embedding_length(cfg, trained_run / "final", encoder) == 40
    # RoBERTa's positions start after its padding id: 42 rows hold 40 tokens
    roberta = SimpleNamespace(
        config=SimpleNamespace(model_type="roberta", max_position_embeddings=42, pad_token_id=1)
    )
    assert embedding_length(cfg, trained_run / "final", roberta) == 40


# ---- the command --------------------------------------------------------------------------------


def run_eval_retrieval(*overrides: str):
    return run_cli("eval-retrieval", *overrides)


def test_eval_retrieval_on_a_trained_run_and_random_weights(trained_run, beir, tmp_path):
    figures = {}
    for init in ("pretrained", "random"):
        out = tmp_path / f"{init}.json"
        proc = run_eval_retrieval(
            f"checkpoint={trained_run}", f"data_dir={beir.folder}", f"init={init}", f"output={out}"
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        figures[init] = result = json.loads(out.read_text())
        assert set(result) == {
            "checkpoint",
            "init",
            "data_dir",
            "split",
            "pooling",
            "max_seq_length",
            "queries",
            "documents",
            "ndcg@10",
            "recall@100",
            "mrr@10",
            "seconds",
        }
        assert (result["queries"], result["documents"]) == (len(beir.queries), len(beir.documents))
        assert (result["init"], result["split"], result["max_seq_length"]) == (init, "test", 64)
        assert result["checkpoint"] == str(trained_run / "final")
        lines = proc.stdout.strip().splitlines()
        assert len(lines) == 1, proc.stdout  # one line: the figures
        printed = dict(
            zip(
                ("ndcg@10", "recall@100", "mrr@10"),
                map(
                    float,
                    [
                        lines[0].split(f"{name} ")[1][:6]
                        for name in ("nDCG@10", "recall@100", "MRR@10")
                    ],
                ),
            )
        )
        for name, value in printed.items():
            assert 0.0 <= value <= 1.0 and value == pytest.approx(result[name], abs=5e-5)
        assert f"{len(beir.queries)} queries, {len(beir.documents)} documents" in lines[0]
    assert figures["pretrained"]["ndcg@10"] != figures["random"]["ndcg@10"]  # other weights


def _damage(folder: Path, case: str) -> None:
    lines = (folder / "corpus.jsonl").read_text().splitlines(keepends=True)
    qrels = folder / "qrels" / "test.tsv"
    if case == "no corpus":
        (folder / "corpus.jsonl").unlink()
    elif case == "no qrels":
        qrels.rename(folder / "qrels" / "dev.tsv")
    elif case == "bad json":
        lines[2] = lines[2][:-3] + "\n"  # the closing quote and brace cut off
        (folder / "corpus.jsonl").write_text("".join(lines))
    elif case == "unknown id":
        query_id = qrels.read_text().splitlines()[1].split("\t")[0]
        qrels.write_text(qrels.read_text() + f"{query_id}\tnot-a-doc\t1\n")
    elif case == "none relevant":
        qrels.write_text(
            "".join(
                line.replace("\t1\n", "\t0\n")
                for line in qrels.read_text().splitlines(keepends=True)
            )
        )


@pytest.mark.parametrize(
    "case,message",
    [
        ("no corpus", r"corpus.jsonl' does not exist; set data_dir to a BEIR-format folder"),
        ("no qrels", r"test.tsv' does not exist; set split to one of dev"),
        (
            "bad json",
            r"corpus.jsonl' line 3 is not valid JSON \(.*\); write one JSON object per line",
        ),
        (
            "unknown id",
            r"test.tsv' line \d+ names the corpus-id 'not-a-doc', which corpus.jsonl lacks; "
            r"add that document or remove the row",
        ),
        (
            "none relevant",
            r"test.tsv' marks no document relevant to any query; give relevant documents "
            r"a score above 0",
        ),
    ],
)
def test_malformed_folders_are_one_sentence(beir, tmp_path, trained_run, case, message):
    from mlmkit.evaluation.retrieval import read_beir

    folder = tmp_path / "beir"
    write_beir(folder, beir.pairs)
    _damage(folder, case)
    with pytest.raises(DataError, match=message):
        read_beir(folder, "test")
    proc = run_eval_retrieval(f"checkpoint={trained_run}", f"data_dir={folder}")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith("Error: ") and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and str(folder) in proc.stderr


def test_eval_retrieval_settings_are_checked():
    from mlmkit.config import RetrievalEvalConfig
    from mlmkit.errors import ConfigError

    with pytest.raises(ConfigError, match="checkpoint="):
        RetrievalEvalConfig(data_dir="x")
    with pytest.raises(ConfigError, match="data_dir=<folder"):
        RetrievalEvalConfig(checkpoint="x")
    with pytest.raises(ConfigError, match="split must name a file of qrels/"):
        RetrievalEvalConfig(checkpoint="x", data_dir="y", split="../test")
