"""Streaming: on-the-fly packing, sharding by rank and worker, exact resume in the stream."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import shared_file
from runs import assert_same_losses, run_cli

import mlmkit.data.streaming as streaming
from mlmkit.config import DataConfig, SourceConfig
from mlmkit.errors import ConfigError, DataError
from mlmkit.masking.collator import MLMCollator


@pytest.fixture(autouse=True)
def small_tokenizing_batches(monkeypatch):
    # small tokenizing batches, so that small files cross many shuffle windows and epochs
    monkeypatch.setattr(streaming, "TOKENIZE_DOCS", 8)


def _unique_lines(tmp_path, n: int, name: str = "lines.txt"):
    path = tmp_path / name
    path.write_text("\n".join(f"line {i} says {'word ' * (i % 7)}end" for i in range(n)) + "\n")
    return path


def _lines(path, **settings) -> DataConfig:
    """A stream of ``path`` with a document per line, and ``settings``."""
    return DataConfig(
        source="files", train_files=[str(path)], txt_sample_by="line", streaming=True, **settings
    )


def _rows(batch) -> list[tuple[int, ...]]:
    ids, mask = batch["input_ids"], batch.get("attention_mask")
    out = []
    for i in range(ids.size(0)):
        n = int(mask[i].sum()) if mask is not None else ids.size(1)
        out.append(tuple(ids[i, :n].tolist()))
    return out


def _batches(
    cfg,
    tokenizer,
    workers: int,
    rank: int = 0,
    world: int = 1,
    state=None,
    n: int = 10,
    batch_size: int = 4,
):
    dataset = streaming.StreamingBlocks(
        cfg, tokenizer, batch_size, rank, world, workers, seed=3, skip_first=0
    )
    collate = MLMCollator(
        tokenizer,
        0.15,
        pad_to_multiple_of=cfg.pad_to_multiple_of if cfg.packing == "line_by_line" else None,
    )
    stream = streaming.StreamingBatches(dataset, collate, workers, torch.device("cpu"))
    if state is not None:
        stream.load_state_dict(json.loads(json.dumps(state)))  # as a checkpoint stores it
    return stream, [next(stream) for _ in range(n)]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("packing", ["concatenate", "line_by_line"])
def test_resume_in_stream_gives_the_batches_of_an_uninterrupted_run(tokenizer, workers, packing):
    path = shared_file("corpora/tinyshakespeare/input.txt")
    cfg = DataConfig(
        source="files",
        train_files=[str(path)],
        streaming=True,
        shuffle_buffer=8,
        max_seq_length=32,
        packing=packing,
    )
    # uninterrupted: 9 + 12 batches
    _, whole = _batches(cfg, tokenizer, workers, n=21)
    # interrupted after 9 batches: the state a checkpoint would hold, then a new reader
    first, head = _batches(cfg, tokenizer, workers, n=9)
    state = first.state_dict()
    assert state["consumed"] == 9
    # resumes inside a later window of some shard
    assert max(s["window"] for r in state["readers"] for s in r["shards"].values()) >= 1
    _, tail = _batches(cfg, tokenizer, workers, state=state, n=12)
    for a, b in zip(whole, head + tail, strict=True):
        assert torch.equal(a["input_ids"], b["input_ids"])  # same rows, same masks
        assert torch.equal(a["labels"], b["labels"])
    # each row is masked from its own seed: the rows of a batch are not masked alike
    assert all(len({tuple((b["labels"][i] != -100).tolist()) for i in range(4)}) > 1 for b in whole)
    if packing == "line_by_line":  # padded per batch, to a multiple of 8
        assert any("attention_mask" in b and not b["attention_mask"].all() for b in whole)
        assert all(b["input_ids"].size(1) % 8 == 0 for b in whole)


def _rows_of(batches) -> list[tuple[int, ...]]:
    """The rows of ``batches`` as they were before masking."""
    out = []
    for b in batches:
        original = b["labels"].where(b["labels"] != -100, b["input_ids"])
        out.extend(_rows({"input_ids": original, "attention_mask": b.get("attention_mask")}))
    return out


def _ranks(cfg, tokenizer, world: int, workers: int, n: int, states=None, batch_size: int = 4):
    """``n`` batches of each of ``world`` ranks (from the ranks' ``states`` of a checkpoint),
    and the ranks' positions after them."""
    streams, rows = [], []
    for rank in range(world):
        dataset = streaming.StreamingBlocks(
            cfg, tokenizer, batch_size, rank, world, workers, seed=3, skip_first=0
        )
        collate = MLMCollator(tokenizer, 0.15)
        stream = streaming.StreamingBatches(dataset, collate, workers, torch.device("cpu"))
        if states is not None:
            stream.load_ranks(json.loads(json.dumps(states)), rank)  # as a checkpoint stores it
        rows += _rows_of([next(stream) for _ in range(n)])
        streams.append(stream)
    return rows, [s.state_dict() for s in streams]


@pytest.mark.parametrize(
    ("before", "after"),
    [((2, 0), (1, 0)), ((2, 0), (3, 0)), ((1, 2), (2, 0)), ((2, 2), (3, 2))],
    ids=["2to1", "2to3", "workers2to0", "2x2to3x2"],
)
def test_resume_on_other_readers_reads_what_an_uninterrupted_run_reads(
    tmp_path, tokenizer, before, after
):
    """Checkpointed by N processes x W workers, resumed on M x V: the shards are dealt out again,
    and the rows read in all equal an uninterrupted run's (none skipped, none repeated). Equal
    sets need every shard to have advanced alike at the cut: a global batch that each reader's
    shards divide, and as many batches from each worker (an even cut)."""
    path = _unique_lines(tmp_path, 2000)
    cfg = _lines(
        path,
        shuffle_buffer=8,
        max_seq_length=64,
        packing="line_by_line",
        stream_shards=12,
    )
    # 48 rows per step, in all: 12 steps, cut after 6
    (w0, k0), (w1, k1) = before, after
    whole, _ = _ranks(cfg, tokenizer, w0, k0, n=12, batch_size=48 // w0)
    head, states = _ranks(cfg, tokenizer, w0, k0, n=6, batch_size=48 // w0)
    tail, _ = _ranks(cfg, tokenizer, w1, k1, n=6, states=states, batch_size=48 // w1)
    assert len(whole) == len(head) + len(tail) == 12 * 48
    assert len(set(head + tail)) == len(head + tail)  # no row twice
    assert sorted(head + tail) == sorted(whole)  # the rows of the uninterrupted run


def test_resume_on_more_readers_than_shards_is_one_sentence(tmp_path, tokenizer):
    path = _unique_lines(tmp_path, 200)
    cfg = _lines(path, shuffle_buffer=8, stream_shards=2)
    _, states = _ranks(cfg, tokenizer, 2, 0, n=2)
    with pytest.raises(ConfigError, match="fewer than the 3 readers.*data.stream_shards"):
        _ranks(cfg, tokenizer, 3, 0, n=1, states=states)
    with pytest.raises(ConfigError, match="data.stream_shards=2 is fewer than the 4 readers"):
        _ranks(cfg, tokenizer, 2, 2, n=1)


def test_a_position_written_before_stream_shards_continues_exactly(tokenizer):
    """A checkpoint of a reader per shard (the form before data.stream_shards) reads on as the
    same stream: rewritten in today's form, with that layout, it continues the same batches."""
    path = shared_file("corpora/tinyshakespeare/input.txt")
    cfg = DataConfig(
        source="files",
        train_files=[str(path)],
        streaming=True,
        shuffle_buffer=8,
        max_seq_length=32,
        stream_shards=1,
    )
    _, whole = _batches(cfg, tokenizer, 0, n=8)
    first, _ = _batches(cfg, tokenizer, 0, n=3)
    now = first.state_dict()
    assert now["layout"] == {"shards": 1, "window": 8, "tokenize_docs": streaming.TOKENIZE_DOCS}
    reader = now["readers"][0]
    old = {  # the same position as the earlier form held it
        "streaming": True,
        "consumed": now["consumed"],
        "workers": 1,
        "epoch": now["epoch"],
        "shards": [{**reader["shards"]["0"], "batches": reader["batches"]}],
    }
    _, tail = _batches(cfg, tokenizer, 0, state=old, n=5)
    for a, b in zip(whole[3:], tail, strict=True):
        assert torch.equal(a["input_ids"], b["input_ids"]) and torch.equal(a["labels"], b["labels"])


def test_shards_by_rank_and_worker_cover_an_epoch_without_overlap(tmp_path, tokenizer):
    path = _unique_lines(tmp_path, 203)
    cfg = _lines(path, shuffle_buffer=1, max_seq_length=64, packing="line_by_line")
    # one reader of the whole stream: one row per line, in order
    it = streaming.ShardBlocks(cfg, tokenizer, 0, 1, seed=0).blocks()
    everything = [tuple(next(it)) for _ in range(203)]
    assert len(set(everything)) == 203
    # 4 shards: shard s owns lines s, s+4, ...; together exactly the epoch, no line twice
    per_shard = []
    for shard in range(4):
        it = streaming.ShardBlocks(cfg, tokenizer, shard, 4, seed=0).blocks()
        per_shard.append([tuple(next(it)) for _ in range(len(range(shard, 203, 4)))])
        assert per_shard[-1] == everything[shard::4]
    assert sorted(sum(per_shard, [])) == sorted(everything)

    # through real dataloader workers, shuffled: 2 ranks x 2 workers never share a row
    cfg = _lines(path, shuffle_buffer=16, max_seq_length=64, packing="line_by_line")
    seen: list[tuple] = []
    for rank in range(2):
        _, batches = _batches(cfg, tokenizer, 2, rank=rank, world=2, n=6, batch_size=4)
        seen.extend(_rows_of(batches))
    assert len(seen) == 48 and len(set(seen)) == 48
    assert set(seen) <= set(everything)


def test_concatenate_stream_loses_no_text_between_tokenizing_batches(tmp_path, tokenizer):
    path = _unique_lines(tmp_path, 100)
    cfg = _lines(path, shuffle_buffer=1, max_seq_length=16)
    reader = streaming.ShardBlocks(cfg, tokenizer, 0, 1, seed=0)
    it = reader.blocks()
    blocks = [next(it) for _ in range(40)]
    body = [t for b in blocks for t in b[1:-1]]
    docs = streaming.encode(
        tokenizer, [f"line {i} says {'word ' * (i % 7)}end" for i in range(100)]
    )
    stream = [t for d in docs for t in (*d, tokenizer.sep_token_id)]
    assert body == stream[: len(body)]  # the unfinished block carries over, nothing dropped
    assert all(len(b) == 16 and b[0] == tokenizer.cls_token_id for b in blocks)


def test_weighted_mix_of_sources_interleaves_by_weight(tmp_path, tokenizer):
    a = tmp_path / "a.txt"
    a.write_text("\n".join(f"alpha {i}" for i in range(3000)))
    b = tmp_path / "b.jsonl"
    b.write_text("\n".join(json.dumps({"body": f"beta {i}"}) for i in range(3000)))
    cfg = DataConfig(
        source="mix",
        txt_sample_by="line",
        streaming=True,
        sources=[
            SourceConfig(kind="files", files=[str(a)], weight=3.0),
            SourceConfig(kind="files", files=[str(b)], text_column="body", weight=1.0),
        ],
    )
    docs = []
    stream = streaming.DocStream(cfg)
    for _, doc in stream.docs():
        docs.append(doc)
        if len(docs) == 2000:
            break
    share = sum(d.startswith("alpha") for d in docs) / len(docs)
    assert 0.72 < share < 0.78
    # each source keeps its own order
    alphas = [int(d.split()[1]) for d in docs if d.startswith("alpha")]
    assert alphas == list(range(len(alphas)))
    # the position resumes the mix exactly
    pos = stream.position()
    nxt = [d for _, d in zip(range(50), (doc for _, doc in stream.docs(pos)))]
    again = streaming.DocStream(cfg)
    assert [d for _, d in zip(range(50), (doc for _, doc in again.docs(pos)))] == nxt


def test_held_out_validation_documents_are_not_trained_on(tmp_path, tokenizer):
    path = _unique_lines(tmp_path, 300)
    cfg = _lines(path, packing="line_by_line", stream_validation_docs=40, shuffle_buffer=8)
    train, val, baseline = streaming.setup_streaming(cfg, tokenizer, 4, 0, 1, 0, 0)
    val_rows = {tuple(r) for r in val["input_ids"]}
    assert len(val_rows) == 40
    reader = streaming.ShardBlocks(cfg, tokenizer, 0, 1, 0, skip_first=40)
    it = reader.blocks()
    train_rows = {tuple(next(it)) for _ in range(250)}
    assert not (val_rows & train_rows) and len(train_rows) == 250
    assert len(baseline) >= 4


def test_stream_bad_inputs_are_one_sentence(tmp_path, tokenizer):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n   \n")
    with pytest.raises(DataError, match="holds no text"):
        streaming.check_sources(
            DataConfig(source="files", train_files=[str(empty)], streaming=True)
        )
    nocol = tmp_path / "x.jsonl"
    nocol.write_text('{"body": "a b"}\n')
    with pytest.raises(DataError, match="data.text_column"):
        streaming.check_sources(
            DataConfig(source="files", train_files=[str(nocol)], streaming=True)
        )
    binary = tmp_path / "b.txt"
    binary.write_bytes(b"\x00\x01" * 100)
    with pytest.raises(DataError, match="binary"):
        streaming.check_sources(
            DataConfig(source="files", train_files=[str(binary)], streaming=True)
        )
    with pytest.raises(DataError, match="no file matches"):
        streaming.check_sources(
            DataConfig(source="files", train_files=[str(tmp_path / "*.parquet")], streaming=True)
        )


def test_parquet_and_csv_streams_in_workers_lose_nothing_and_resume(tmp_path, tokenizer):
    """datasets' streaming readers inside dataloader workers: every row once per epoch."""
    import pandas as pd

    rows = [f"row {i} of the table" for i in range(120)]
    pd.DataFrame({"body": rows[:60]}).to_parquet(tmp_path / "a.parquet")
    pd.DataFrame({"body": rows[60:]}).to_csv(tmp_path / "b.csv", index=False)
    cfg = DataConfig(
        source="files",
        train_files=[str(tmp_path / "a.parquet"), str(tmp_path / "b.csv")],
        text_column="body",
        streaming=True,
        shuffle_buffer=1,
        max_seq_length=32,
        packing="line_by_line",
    )
    stream, batches = _batches(cfg, tokenizer, 2, n=30, batch_size=4)  # 120 rows: one epoch
    seen = []
    seen.extend(_rows_of(batches))
    expected = {
        tuple([tokenizer.cls_token_id, *ids, tokenizer.sep_token_id])
        for ids in streaming.encode(tokenizer, rows)
    }
    assert len(seen) == 120 and set(seen) == expected
    # resume inside the parquet file (a datasets iterator state) and inside the csv
    for k in (5, 22):
        first, head = _batches(cfg, tokenizer, 2, n=k, batch_size=4)
        _, tail = _batches(cfg, tokenizer, 2, state=first.state_dict(), n=4, batch_size=4)
        for a, b in zip(batches[k : k + 4], tail, strict=True):
            assert torch.equal(a["input_ids"], b["input_ids"])


def test_a_hub_stream_with_enough_files_is_split_by_files(tmp_path, tokenizer):
    """A dataset dir stands in for the Hub: 4 Arrow files, 4 stream shards read by 2 ranks x 2
    workers, each reader opens only its own file; together one epoch, nothing twice; resume
    inside a file."""
    import datasets

    rows = [f"entry {i} of the hub set" for i in range(160)]
    datasets.Dataset.from_dict({"text": rows}).save_to_disk(str(tmp_path / "hubset"), num_shards=4)
    cfg = DataConfig(
        source="hub",
        hub_name=str(tmp_path / "hubset"),
        streaming=True,
        shuffle_buffer=1,
        max_seq_length=32,
        packing="line_by_line",
        stream_shards=4,
    )
    reader = streaming.ShardBlocks(cfg, tokenizer, 1, 4, seed=0)
    it = reader.blocks()
    next(it)
    assert reader.docs.stream.presharded  # 4 files for 4 shards: split by files
    expected = {
        tuple([tokenizer.cls_token_id, *ids, tokenizer.sep_token_id])
        for ids in streaming.encode(tokenizer, rows)
    }
    seen = []
    for rank in range(2):
        _, batches = _batches(cfg, tokenizer, 2, rank=rank, world=2, n=20, batch_size=4)
        seen.extend(_rows_of(batches))
    assert len(seen) == 160 and set(seen) == expected
    first, _ = _batches(cfg, tokenizer, 2, rank=1, world=2, n=7, batch_size=4)
    _, tail = _batches(
        cfg, tokenizer, 2, rank=1, world=2, state=first.state_dict(), n=5, batch_size=4
    )
    _, whole = _batches(cfg, tokenizer, 2, rank=1, world=2, n=12, batch_size=4)
    for a, b in zip(whole[7:], tail, strict=True):
        assert torch.equal(a["input_ids"], b["input_ids"])
    # 3 readers do not divide 4 files: round robin over documents instead
    reader = streaming.ShardBlocks(cfg, tokenizer, 0, 3, seed=0)
    next(reader.blocks())
    assert not reader.docs.stream.presharded
    assert streaming.hub_split_by_files(cfg, 4) and not streaming.hub_split_by_files(cfg, 8)


TINY = [
    "model.num_hidden_layers=1",
    "model.hidden_size=32",
    "model.num_attention_heads=2",
    "model.intermediate_size=64",
    "data.max_seq_length=32",
    "data.max_eval_samples=32",
    "train.batch_size=4",
    "train.progress=false",
    "train.log_every=2",
    "optim.warmup_steps=2",
    "train.eval_every=6",
    "train.save_every=6",
    "train.max_steps=12",
    "data.streaming=true",
    "data.shuffle_buffer=16",
    "data.stream_validation_docs=50",
    "train.num_workers=2",
]


def test_streaming_training_resumes_where_the_stream_was(tmp_path):
    """Train 12 steps streaming (with BPE and dataloader workers); then cut the run at its
    step-6 checkpoint and resume: steps 7-12 see the same batches (same losses)."""
    text = shared_file("corpora/tinyshakespeare/input.txt")
    tok = tmp_path / "tok"
    assert (
        run_cli(
            "tokenizer",
            "data=files",
            f"data.train_files=[{text}]",
            "tokenizer.algorithm=bpe",
            "tokenizer.vocab_size=600",
            f"out={tok}",
        ).returncode
        == 0
    )
    common = [
        "train",
        *TINY,
        "data=files",
        f"data.train_files=[{text}]",
        f"tokenizer.name_or_path={tok}",
        f"paths.cache_dir={tmp_path}/cache",
        "data.packing=line_by_line",
    ]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    proc = run_cli(*common, f"hydra.run.dir={whole}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    import shutil

    shutil.copytree(whole, cut)
    shutil.rmtree(cut / "checkpoints" / "step_0000012")
    shutil.rmtree(cut / "final")
    proc = run_cli(*common, f"hydra.run.dir={cut}", "train.resume=auto")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Resumed from" in proc.stderr and "step_0000006" in proc.stderr

    def losses(run):
        rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
        return [(e["step"], e["loss"]) for e in rows if e["event"] == "train"]

    assert len(losses(whole)) == 6
    assert_same_losses(losses(cut), losses(whole))
    state = json.loads((whole / "checkpoints" / "step_0000006" / "loop_state.json").read_text())
    assert state["stream"]["ranks"][0]["consumed"] == 6
    # another worker count deals the stream's shards out again and goes on
    proc = run_cli(
        *common,
        f"hydra.run.dir={cut}",
        "train.resume=auto",
        "train.num_workers=0",
        "train.max_steps=14",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "read by 1 process(es) x 2 worker(s) at the checkpoint, are dealt out to 1 x 1" in (
        proc.stderr
    )
    assert [s for s, _ in losses(cut)][-1] == 14
