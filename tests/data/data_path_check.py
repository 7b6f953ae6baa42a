"""Every source of mlmkit's data path, run in the environment this Python has (the GPU image's
versions with a carried wheel set on PYTHONPATH, for ``test_installs.py``): the built-in corpus,
local files of each kind, a mix, streaming's in-memory blocks and ``mlmkit eval``'s files, each
read, packed and fetched as the training loader and the evaluation fetch them. Prints one JSON
object a line: the versions, then each case's figures or its error, then the warnings datasets
logged while fingerprinting.

    python tests/data/data_path_check.py TOKENIZER_DIR WORK_DIR
"""

from __future__ import annotations

import csv
import importlib.metadata
import json
import logging
import sys
from pathlib import Path


def _write_files(work: Path, docs: list[str]) -> dict[str, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    files = {"txt": work / "a.txt", "jsonl": work / "b.jsonl", "csv": work / "c.csv"}
    files["txt"].write_text("\n\n".join(docs[:100]))
    files["jsonl"].write_text("\n".join(json.dumps({"body": d}) for d in docs[100:200]))
    with open(files["csv"], "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["body"])
        writer.writerows([d] for d in docs[200:300])
    files["parquet"] = work / "d.parquet"
    pq.write_table(pa.table({"body": docs[300:400]}), files["parquet"])
    return files


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _fetched(packed, tokenizer) -> dict:
    """What training and evaluation read of a packed dataset: a loader batch, the baseline's
    counts and the fixed evaluation masks."""
    from mlmkit.config import MaskingConfig
    from mlmkit.data.loader import KeyedRows
    from mlmkit.data.packing import token_counts
    from mlmkit.training.validation import fixed_eval_batches

    rows = KeyedRows(packed["train"]).__getitems__([(i, i) for i in range(4)])
    batches = fixed_eval_batches(packed["validation"], tokenizer, MaskingConfig(), 8)
    return {
        "train": len(packed["train"]),
        "validation": len(packed["validation"]),
        "batch": [len(r["input_ids"]) for r in rows],
        "tokens": int(token_counts(packed["train"], tokenizer).sum()),
        "eval_batches": len(batches),
    }


def cases(work: Path, tokenizer) -> dict:
    """Each case's function: name -> a function returning its figures."""
    from mlmkit.config import DataConfig, EvalConfig, SourceConfig
    from mlmkit.data.packing import prepare_datasets
    from mlmkit.data.sources import builtin_documents
    from mlmkit.data.streaming import setup_streaming
    from mlmkit.evaluation.mlm import eval_dataset

    files = _write_files(work, builtin_documents()[:400])
    every = [str(p) for p in files.values()]

    def packed(name: str, cfg: DataConfig):
        cfg.max_seq_length = 64
        return lambda: _fetched(prepare_datasets(cfg, tokenizer, work / "cache" / name), tokenizer)

    def streaming():
        cfg = DataConfig(source="files", train_files=[str(files["txt"])], streaming=True)
        _, val, baseline = setup_streaming(cfg, tokenizer, 8, 0, 1, 0, 0)
        return _fetched({"train": baseline, "validation": val}, tokenizer)

    def eval_files():
        cfg = EvalConfig(checkpoint="unused", files=every)
        cfg.data.text_column, cfg.data.max_seq_length = "body", 64
        blocks = eval_dataset(cfg, tokenizer)
        return _fetched({"train": blocks, "validation": blocks}, tokenizer)

    mix = [
        SourceConfig(kind="builtin", weight=1.0),
        SourceConfig(kind="files", files=[str(files["txt"])], weight=1.0),
    ]
    return {
        "builtin": packed("builtin", DataConfig(source="builtin")),
        "files": packed("files", DataConfig(source="files", train_files=every, text_column="body")),
        "mix": packed("mix", DataConfig(source="mix", sources=mix)),
        "streaming": streaming,
        "eval files": eval_files,
    }


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def main() -> int:
    tokenizer_dir, work = sys.argv[1], Path(sys.argv[2])
    work.mkdir(parents=True, exist_ok=True)
    # transformers imports torchvision when it is installed (image processors, a model's
    # build); a user's own code may import it first too
    if _version("torchvision"):
        import torchvision  # noqa: F401
    from transformers import AutoTokenizer

    names = ("datasets", "pyarrow", "dill", "torch", "torchvision")
    print(json.dumps({"versions": {n: _version(n) for n in names}}), flush=True)
    print(json.dumps({"pyarrow": __import__("pyarrow").__file__}))
    caught = _Warnings()
    logging.getLogger("datasets").addHandler(caught)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    failed = 0
    for name, case in cases(work, tokenizer).items():
        try:
            print(json.dumps({"case": name, **case()}), flush=True)
        except Exception as exc:
            failed += 1
            print(json.dumps({"case": name, "error": f"{type(exc).__name__}: {exc}"[:500]}))
    print(json.dumps({"datasets_warnings": caught.messages}))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
