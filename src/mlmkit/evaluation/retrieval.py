"""Zero-shot retrieval on a BEIR-format folder: the encoder as the embedder behind vector search.

    mlmkit eval-retrieval checkpoint=outputs/<run> data_dir=path/to/beir/scifact
    mlmkit eval-retrieval checkpoint=outputs/<run> data_dir=... init=random   # random weights
    mlmkit eval-retrieval checkpoint=outputs/<run> data_dir=... split=dev     # qrels/dev.tsv

The folder is laid out as BEIR's datasets are (Thakur et al., 2021, "BEIR: A Heterogeneous
Benchmark for Zero-shot Evaluation of Information Retrieval Models"): ``corpus.jsonl``, one
JSON object per line with ``_id``, an optional ``title`` and ``text`` (a document reads
``title + " " + text`` when it has a title, BEIR's convention); ``queries.jsonl``, with
``_id`` and ``text``; ``qrels/<split>.tsv``, the header ``query-id  corpus-id  score`` and one
judgment per line, a score above 0 marking a relevant document.

Each query and document is embedded alone as ``mlmkit eval-sts`` embeds a sentence (``embed``:
mean pooling, the sentence vector of the sentence-transformers files in a run's ``final/``),
the documents are ranked by the cosine similarity of their embeddings to each query's, and
sentence-transformers' ``InformationRetrievalEvaluator`` scores the rankings: nDCG@10 (BEIR's
headline figure), recall@100 and MRR@10, averaged over the queries that have a relevant
document. Nothing is trained.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from mlmkit.config import RetrievalEvalConfig
from mlmkit.data.sources import check_not_binary
from mlmkit.errors import ConfigError, DataError
from mlmkit.evaluation.sts import embed, load_encoder, write_output
from mlmkit.model.architectures import parts_of
from mlmkit.training.trained_model import run_settings

log = logging.getLogger("mlmkit")

FIGURES = ("ndcg@10", "recall@100", "mrr@10")
QRELS_HEADER = ["query-id", "corpus-id", "score"]
DEFAULT_LENGTH = 512  # tokens kept when neither the setting nor the model dir says
LAYOUT = "a BEIR-format folder (corpus.jsonl, queries.jsonl and qrels/<split>.tsv)"


@dataclass
class BeirData:
    """A BEIR folder's texts and judgments: ``{id: text}`` of the documents and queries, and
    ``{query id: ids of its relevant documents}`` for the queries that have one."""

    corpus: dict[str, str]
    queries: dict[str, str]
    relevant: dict[str, set[str]]


# ---- reading the folder -----------------------------------------------------------------------


def read_beir(data_dir: str | Path, split: str = "test") -> BeirData:
    """Read the documents, queries and relevance judgments in the BEIR-format ``data_dir``."""
    folder = Path(data_dir).expanduser()
    if not folder.is_dir():
        raise DataError(f"data_dir={str(folder)!r} is not a folder; set data_dir to {LAYOUT}.")
    corpus = read_jsonl(folder / "corpus.jsonl", with_title=True)
    queries = read_jsonl(folder / "queries.jsonl", with_title=False)
    qrels = qrels_file(folder, split)
    return BeirData(corpus, queries, read_qrels(qrels, corpus, queries))


def read_jsonl(path: Path, with_title: bool) -> dict[str, str]:
    """``{_id: text}`` of a BEIR ``corpus.jsonl`` (``with_title``: ``title + " " + text``
    where a title is given) or ``queries.jsonl``."""
    if not path.is_file():
        raise DataError(f"{str(path)!r} does not exist; set data_dir to {LAYOUT}.")
    check_not_binary(str(path), "data_dir")
    keys = '"_id", "title" and "text"' if with_title else '"_id" and "text"'
    texts: dict[str, str] = {}
    with open(path, encoding="utf-8-sig", errors="replace") as f:
        for line, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw)
            except ValueError as exc:
                raise DataError(
                    f"{str(path)!r} line {line} is not valid JSON ({exc}); write one JSON "
                    f"object per line, with {keys}."
                ) from None
            doc_id, text = _entry(obj, path, line, keys, with_title)
            if doc_id in texts:
                raise DataError(
                    f"{str(path)!r} line {line} repeats the _id {doc_id!r} of an earlier "
                    "line; give each line its own _id."
                )
            texts[doc_id] = text
    if not texts:
        raise DataError(f"{str(path)!r} is empty; write one JSON object per line, with {keys}.")
    return texts


def _entry(obj: Any, path: Path, line: int, keys: str, with_title: bool) -> tuple[str, str]:
    """``(_id, text)`` of one parsed line of a corpus or queries file."""
    where = f"{str(path)!r} line {line}"
    if not isinstance(obj, dict):
        raise DataError(f"{where} is not a JSON object; write one object per line, with {keys}.")
    doc_id = obj.get("_id")
    if isinstance(doc_id, int) and not isinstance(doc_id, bool):
        doc_id = str(doc_id)
    if not isinstance(doc_id, str) or not doc_id:
        raise DataError(f'{where} has no "_id" (a text or a whole number); give every line one.')
    text = obj.get("text")
    title = obj.get("title") if with_title else None
    if not isinstance(text, str):
        raise DataError(f'{where} has no "text" (a JSON string); give every line one.')
    if title is not None and not isinstance(title, str):
        raise DataError(
            f'{where} has a "title" that is not a JSON string; write it as text, or leave it out.'
        )
    return doc_id, f"{title} {text}" if title else text


def qrels_file(folder: Path, split: str) -> Path:
    """``qrels/<split>.tsv`` of ``folder``, which must exist."""
    path = folder / "qrels" / f"{split}.tsv"
    if path.is_file():
        return path
    present = sorted(p.stem for p in (folder / "qrels").glob("*.tsv"))
    if present:
        raise DataError(
            f"{str(path)!r} does not exist; set split to one of {', '.join(present)} "
            "(the files of qrels/)."
        )
    raise DataError(
        f"{str(path)!r} does not exist; set data_dir to {LAYOUT}, or add the judgments "
        "as that file."
    )


def read_qrels(path: Path, corpus: dict[str, str], queries: dict[str, str]) -> dict[str, set[str]]:
    """``{query id: ids of its relevant documents}`` from a BEIR qrels file; every row must
    name a query of ``queries`` and a document of ``corpus``."""
    check_not_binary(str(path), "split")
    with open(path, encoding="utf-8-sig", errors="replace") as f:
        rows = [
            (line, raw.rstrip("\r\n").split("\t")) for line, raw in enumerate(f, 1) if raw.strip()
        ]
    if not rows or [c.strip().lower() for c in rows[0][1]] != QRELS_HEADER:
        raise DataError(
            f"{str(path)!r} does not start with the header line query-id<TAB>corpus-id"
            "<TAB>score; add it as the first line (BEIR's qrels format)."
        )
    relevant: dict[str, set[str]] = {}
    for line, fields in rows[1:]:
        query_id, doc_id, score = _judgment(fields, path, line)
        if query_id not in queries:
            raise DataError(
                f"{str(path)!r} line {line} names the query-id {query_id!r}, which "
                "queries.jsonl lacks; add that query or remove the row."
            )
        if doc_id not in corpus:
            raise DataError(
                f"{str(path)!r} line {line} names the corpus-id {doc_id!r}, which "
                "corpus.jsonl lacks; add that document or remove the row."
            )
        if score > 0:
            relevant.setdefault(query_id, set()).add(doc_id)
    if not relevant:
        raise DataError(
            f"{str(path)!r} marks no document relevant to any query; give relevant "
            "documents a score above 0, or choose another split."
        )
    return relevant


def _judgment(fields: list[str], path: Path, line: int) -> tuple[str, str, float]:
    """``(query id, corpus id, score)`` of one row of a qrels file."""
    if len(fields) != 3:
        raise DataError(
            f"{str(path)!r} line {line} has {len(fields)} tab-separated fields; write "
            "query-id<TAB>corpus-id<TAB>score."
        )
    try:
        score = float(fields[2])
    except ValueError:
        raise DataError(
            f"{str(path)!r} line {line}: the score {fields[2].strip()!r} is not a number; "
            "write the relevance as a number (above 0: relevant)."
        ) from None
    return fields[0].strip(), fields[1].strip(), score


# ---- scoring ----------------------------------------------------------------------------------


class TextEmbedder:
    """What ``InformationRetrievalEvaluator`` asks of the model it scores (``encode_query``,
    ``encode_document``, its similarity and model card) over a function from a list of texts to
    their ``(len(texts), dim)`` embeddings."""

    similarity_fn_name = "cosine"

    def __init__(self, embed_texts: Callable[[list[str]], torch.Tensor]) -> None:
        self.embed_texts = embed_texts
        self.model_card_data = _NoModelCard()

    def encode(self, sentences: str | Sequence[str], **_: Any) -> torch.Tensor:
        texts = [sentences] if isinstance(sentences, str) else list(sentences)
        return torch.as_tensor(self.embed_texts(texts), dtype=torch.float32)

    encode_query = encode_document = encode

    @staticmethod
    def similarity(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return _cosine(a, b)


class _NoModelCard:
    """The evaluator records its figures on the model's card; an embedder has none to keep."""

    def set_evaluation_metrics(self, *args: Any, **kwargs: Any) -> None:
        pass


def _cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Return the cosine similarity of each row of ``a`` with each row of ``b``."""
    a = torch.nn.functional.normalize(torch.as_tensor(a, dtype=torch.float32), dim=-1)
    b = torch.nn.functional.normalize(torch.as_tensor(b, dtype=torch.float32), dim=-1)
    return a @ b.T


def _evaluator_class():
    try:
        from sentence_transformers.sentence_transformer.evaluation import (
            InformationRetrievalEvaluator,
        )
    except ImportError:
        try:  # sentence-transformers before 6.0
            from sentence_transformers.evaluation import InformationRetrievalEvaluator
        except ImportError:
            raise ConfigError(
                "eval-retrieval scores with sentence-transformers, which is not "
                "installed; pip install 'mlmkit[embeddings]' (or sentence-transformers)."
            ) from None
    return InformationRetrievalEvaluator


def retrieval_scores(
    embed_texts: Callable[[list[str]], torch.Tensor], data: BeirData, batch_size: int = 64
) -> dict[str, Any]:
    """Return ``{"queries", "documents", "ndcg@10", "recall@100", "mrr@10"}`` of the rankings by the
    cosine similarity of ``embed_texts``'s embeddings (queries without a relevant document
    are left out, as BEIR leaves them out)."""
    evaluator = _evaluator_class()(
        queries=data.queries,
        corpus=data.corpus,
        relevant_docs=data.relevant,
        mrr_at_k=[10],
        ndcg_at_k=[10],
        accuracy_at_k=[10],
        precision_recall_at_k=[100],
        map_at_k=[100],
        batch_size=batch_size,
        show_progress_bar=False,
        write_csv=False,
        score_functions={"cosine": _cosine},
    )
    quiet = logging.getLogger("sentence_transformers")
    level = quiet.level
    quiet.setLevel(logging.WARNING)  # its per-metric report: the figures are returned
    try:
        metrics = evaluator(TextEmbedder(embed_texts))
    finally:
        quiet.setLevel(level)
    return {
        "queries": len(evaluator.queries),
        "documents": len(evaluator.corpus),
        **{name: float(metrics[f"cosine_{name}"]) for name in FIGURES},
    }


# ---- the model --------------------------------------------------------------------------------


def embedding_length(cfg: RetrievalEvalConfig, resolved: Path, encoder) -> int:
    """Tokens kept of each text: ``max_seq_length``, else the length the model dir's
    sentence-transformers files cut at (a run's ``final/``), else its run's training blocks
    (a checkpoint), else ``DEFAULT_LENGTH``; never more than the model's positions."""
    positions = parts_of(encoder).positions(encoder.config)
    if cfg.max_seq_length is not None:
        return min(cfg.max_seq_length, positions)
    length = None
    try:
        length = json.loads((resolved / "sentence_bert_config.json").read_text())["max_seq_length"]
    except (OSError, ValueError, KeyError, TypeError):
        try:
            found = run_settings(resolved)
        except (ConfigError, OSError):  # unreadable settings: the default
            found = None
        if found is not None:
            length = (found[1].get("data") or {}).get("max_seq_length")
    return min(int(length) if isinstance(length, int) and length > 0 else DEFAULT_LENGTH, positions)


def model_embedder(
    cfg: RetrievalEvalConfig,
) -> tuple[Callable[[list[str]], torch.Tensor], Path, int]:
    """``(texts -> embeddings, resolved path, tokens kept)`` for the encoder of ``cfg.checkpoint``
    (``init=random``: the same architecture with seeded random weights)."""
    encoder, tokenizer, resolved = load_encoder(cfg)
    length = embedding_length(cfg, Path(resolved), encoder)

    def embed_texts(texts: list[str]) -> torch.Tensor:
        # longest first, so that each batch pads to a similar length; then back in order
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]), reverse=True)
        vectors = embed(
            encoder,
            tokenizer,
            [texts[i] for i in order],
            pooling=cfg.pooling,
            batch_size=cfg.batch_size,
            max_seq_length=length,
        )
        out = torch.empty_like(vectors)
        out[order] = vectors
        return out

    return embed_texts, Path(resolved), length


def evaluate_retrieval(cfg: RetrievalEvalConfig) -> dict[str, Any]:
    """Return the retrieval figures of ``cfg``; also written to ``cfg.output`` when set."""
    data = read_beir(cfg.data_dir, cfg.split)
    _evaluator_class()  # a missing sentence-transformers: said before the model loads
    embed_texts, resolved, length = model_embedder(cfg)
    t0 = time.perf_counter()
    scores = retrieval_scores(embed_texts, data, batch_size=cfg.batch_size)
    result = {
        "checkpoint": str(resolved),
        "init": cfg.init,
        "data_dir": str(cfg.data_dir),
        "split": cfg.split,
        "pooling": cfg.pooling,
        "max_seq_length": length,
        **scores,
        "seconds": round(time.perf_counter() - t0, 1),
    }
    write_output(cfg.output, result)
    return result
