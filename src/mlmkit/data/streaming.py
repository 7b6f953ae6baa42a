"""Streaming: documents are read, tokenized and packed on the fly (``data.streaming=true``).

For corpora larger than disk or RAM. Nothing is preprocessed or cached; memory is bounded
by ``data.shuffle_buffer`` blocks per reader.

- **Documents** come from local files (.txt and .jsonl read natively, with byte offsets;
  .json/.parquet/.csv through ``datasets``' streaming readers), the Hub (``datasets``
  streaming), the built-in corpus, or a weighted mix of these. The stream repeats in
  epochs without end.
- **Shards.** Each process (rank) and each of its dataloader workers is a shard; document
  ``i`` of the stream belongs to shard ``i % shards``. Every shard reads the stream and
  tokenizes only its own documents, so no document is seen twice in an epoch. A single
  hub stream whose file count is a multiple of the shard count is split by files
  instead, so each shard downloads only its own files.
- **Blocks.** A shard tokenizes its documents in batches and packs them as map mode
  does (``concatenate`` carries the unfinished block over, so no text is lost between
  batches; ``line_by_line`` gives one sequence per document, long ones split).
- **Shuffling** fills a window of at least ``data.shuffle_buffer`` blocks, permutes it with
  a seed of (train.seed, shard, window) and hands it out.
- **Position.** A shard's state is small: where its current window started in the
  document stream (file and byte offset, or the ``datasets`` iterator state), the
  unfinished block carried in, and how many blocks of the window were handed out.
  Each batch carries the state after it, so the main process always knows the position
  of what it has consumed (not what workers prefetched); a resumed run re-reads at most
  one window and continues with the very next batch.
"""

from __future__ import annotations

import json
import logging
import os
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from mlmkit.config import DataConfig, SourceConfig
from mlmkit.data.fingerprint import content, in_memory
from mlmkit.data.packing import check_predictable, encode, pack_concat, pack_lines
from mlmkit.data.sources import (
    SPLIT_SEED,
    TEXT_EXTENSIONS,
    builtin_documents,
    check_not_binary,
    check_text_column,
    hub_error,
    iter_jsonl,
    iter_txt,
    load_hub,
    mix_probabilities,
    resolve_files,
    warn_jsonl_stats,
    warn_txt_stats,
)
from mlmkit.errors import ConfigError, DataError

log = logging.getLogger(__name__)

TOKENIZE_DOCS = 256  # documents tokenized together


# ----------------------------------------------------------------------------------------
# Documents, resumable
# ----------------------------------------------------------------------------------------


def _rows(ds) -> Iterator[dict]:
    """Yield the rows of a ``datasets.IterableDataset`` in order, in any process.

    Inside a dataloader worker, iterating the dataset directly would keep only that
    worker's share of its files; mlmkit shards documents itself, so it reads through
    ``iter`` (batches of one row), which reads everything in every process and is the
    path ``state_dict()`` tracks.
    """
    for batch in ds.iter(batch_size=1):
        yield {k: v[0] for k, v in batch.items()}


def _texts(ds, column: str) -> Iterator[str]:
    """Yield the non-empty texts of ``column`` in the rows of ``ds`` (``_rows``), stripped."""
    for row in _rows(ds):
        text = row.get(column)
        if isinstance(text, str) and text.strip():
            yield text.strip()


class FilesSource:
    """Documents of a list of local files; position = (file index, offset in the file)."""

    def __init__(self, files: list[str], text_column: str, sample_by: str) -> None:
        self.files, self.column, self.sample_by = files, text_column, sample_by
        self.pos: dict[str, Any] = {"file": 0, "offset": 0}
        self._ds = None

    def position(self) -> dict[str, Any]:
        if self._ds is not None:
            return {"file": self.pos["file"], "offset": self._ds.state_dict()}
        return dict(self.pos)

    def docs(self, pos: dict[str, Any] | None) -> Iterator[str]:
        pos = pos or {"file": 0, "offset": 0}
        for i in range(pos["file"], len(self.files)):
            path = self.files[i]
            start = pos["offset"] if i == pos["file"] else 0
            ext = Path(path).suffix.lower()
            stats: dict = {}
            self.pos = {"file": i, "offset": start}
            if TEXT_EXTENSIONS[ext] == "text":
                for doc, offset in iter_txt(path, self.sample_by, start or 0, stats):
                    self.pos = {"file": i, "offset": offset}
                    yield doc
                warn_txt_stats(path, stats)
            elif ext == ".jsonl":
                for doc, offset in iter_jsonl(path, self.column, start or 0, stats):
                    self.pos = {"file": i, "offset": offset}
                    yield doc
                warn_jsonl_stats(path, self.column, stats)
            else:
                import datasets

                self._ds = datasets.load_dataset(
                    TEXT_EXTENSIONS[ext], data_files=[path], split="train", streaming=True
                )
                if start:
                    self._ds.load_state_dict(start)
                try:
                    yield from _texts(self._ds, self.column)
                finally:
                    self._ds = None
        self.pos = {"file": len(self.files), "offset": 0}


class HubSource:
    """A streamed hub dataset; position = the ``datasets`` iterator state."""

    def __init__(self, name: str, config: str | None, split: str, text_column: str) -> None:
        self.name, self.config, self.split, self.column = name, config, split, text_column
        self._ds = None
        self.shard: tuple[int, int] | None = None  # (this reader, readers): read only its files
        self.presharded = False

    def position(self) -> Any:
        return self._ds.state_dict() if self._ds is not None else None

    def docs(self, pos: Any) -> Iterator[str]:
        self._ds = load_hub(self.name, self.config, self.split, self.column, streaming=True)
        if (
            self.shard is not None
            and self.shard[1] > 1
            and self._ds.num_shards % self.shard[1] == 0
        ):
            # as many files per reader: each reader downloads only its own files
            self._ds = self._ds.shard(
                num_shards=self.shard[1], index=self.shard[0], contiguous=True
            )
            self.presharded = True
        if pos is not None:
            self._ds.load_state_dict(pos)
        try:
            yield from _texts(self._ds, self.column)
        except DataError:
            raise
        except Exception as exc:  # the connection dropped mid-stream
            raise hub_error(self.name, self.config, exc) from None


class ListSource:
    """Documents held in memory (the built-in corpus); position = index."""

    def __init__(self, docs: list[str]) -> None:
        self.list, self.pos = docs, 0

    def position(self) -> int:
        return self.pos

    def docs(self, pos: int | None) -> Iterator[str]:
        self.pos = pos or 0
        for i in range(pos or 0, len(self.list)):
            self.pos = i + 1
            yield self.list[i]


def _make_source(src: SourceConfig, cfg: DataConfig, setting: str):
    if src.kind == "builtin":
        return ListSource(builtin_documents())
    if src.kind == "hub":
        return HubSource(src.name, src.config, src.split, src.text_column)
    return FilesSource(resolve_files(src.files, setting), src.text_column, cfg.txt_sample_by)


def stream_sources(cfg: DataConfig, split: str = "train") -> list[tuple[SourceConfig, str]]:
    """Return the sources (with the setting that names them) of the train or validation stream;
    an empty list for validation means: hold out the first documents of the train stream."""
    if split == "validation":
        if cfg.validation_files:
            return [
                (
                    SourceConfig(
                        kind="files", files=cfg.validation_files, text_column=cfg.text_column
                    ),
                    "data.validation_files",
                )
            ]
        if cfg.source == "hub" and cfg.hub_validation_split:
            return [
                (
                    SourceConfig(
                        kind="hub",
                        name=cfg.hub_name,
                        config=cfg.hub_config,
                        split=cfg.hub_validation_split,
                        text_column=cfg.text_column,
                    ),
                    "data.hub_validation_split",
                )
            ]
        return []
    if cfg.source == "builtin":
        return [(SourceConfig(kind="builtin"), "data.source")]
    if cfg.source == "hub":
        return [
            (
                SourceConfig(
                    kind="hub",
                    name=cfg.hub_name,
                    config=cfg.hub_config,
                    split=cfg.hub_split,
                    text_column=cfg.text_column,
                ),
                "data.hub_name",
            )
        ]
    if cfg.source == "mix":
        return [(s, f"data.sources[{i}]") for i, s in enumerate(cfg.sources)]
    return [
        (
            SourceConfig(kind="files", files=cfg.train_files, text_column=cfg.text_column),
            "data.train_files",
        )
    ]


class DocStream:
    """The document stream of a split, endless over epochs, with a JSON-able position.

    Several sources are interleaved: each document is drawn from source k with its weight's
    share (a seeded generator, the same order every epoch). ``first_exhausted`` ends the
    epoch when any source runs out; ``all_exhausted`` restarts a finished source until
    every source has finished once. ``skip_first`` documents of every epoch are left out
    (they are the held-out validation documents).
    """

    def __init__(
        self,
        cfg: DataConfig,
        split: str = "train",
        skip_first: int = 0,
        shard: tuple[int, int] | None = None,
    ) -> None:
        specs = stream_sources(cfg, split) or stream_sources(cfg, "train")
        self.sources = [_make_source(s, cfg, setting) for s, setting in specs]
        if shard is not None and len(self.sources) == 1 and isinstance(self.sources[0], HubSource):
            self.sources[0].shard = shard  # a single hub stream is split by files when it can be
        self.reader = shard[0] if shard else 0
        self.probs = mix_probabilities([s for s, _ in specs])
        self.stopping = cfg.mix_stopping
        self.skip_first = skip_first
        self.state: dict[str, Any] = self._epoch_start(0)
        self._iters: list[Iterator[str]] = []
        self._started: list[bool] = []  # has the source yielded since it was (re)opened?
        self._rng: np.random.Generator | None = None

    def _epoch_start(self, epoch: int) -> dict[str, Any]:
        return {
            "epoch": epoch,
            "index": 0,
            "sources": [None] * len(self.sources),
            "finished": [False] * len(self.sources),
            "rng": None,
        }

    @property
    def presharded(self) -> bool:
        """True when the source itself gives this reader only its own documents."""
        return any(getattr(s, "presharded", False) for s in self.sources)

    def _skip(self) -> int:
        # split by files, the held-out first documents are all in the first reader's files
        return 0 if self.presharded and self.reader != 0 else self.skip_first

    def position(self) -> dict[str, Any]:
        """Return the position after the last document taken (call between documents)."""
        st = dict(self.state)
        started = self._started or [False] * len(self.sources)
        st["sources"] = [
            s.position() if go else p
            for s, go, p in zip(self.sources, started, self.state["sources"])
        ]
        st["rng"] = self._rng.bit_generator.state if self._rng is not None else None
        return json.loads(json.dumps(st))  # a copy, and proof it can be saved

    def docs(self, state: dict[str, Any] | None = None) -> Iterator[tuple[int, str]]:
        """(index in the epoch, document), from ``state`` on, without end."""
        self.state = json.loads(json.dumps(state)) if state else self._epoch_start(0)
        while True:
            st = self.state
            self._iters = [s.docs(p) for s, p in zip(self.sources, st["sources"])]
            self._started = [False] * len(self.sources)
            self._rng = np.random.default_rng(SPLIT_SEED) if len(self.sources) > 1 else None
            if self._rng is not None and st["rng"] is not None:
                self._rng.bit_generator.state = st["rng"]
            while True:
                k = (
                    0
                    if self._rng is None
                    else int(self._rng.choice(len(self.sources), p=self.probs))
                )
                try:
                    doc = next(self._iters[k])
                except StopIteration:
                    st["finished"][k] = True
                    if (
                        self._rng is None
                        or self.stopping == "first_exhausted"
                        or all(st["finished"])
                    ):
                        break
                    self._iters[k] = self.sources[k].docs(None)  # all_exhausted: start it over
                    self._started[k] = False
                    st["sources"][k] = None
                    continue
                self._started[k] = True
                i = st["index"]
                st["index"] += 1
                if i >= self._skip():
                    yield i, doc
            self._iters, self._started = [], []
            if st["index"] <= self._skip() and st["sources"] == [None] * len(self.sources):
                if not self._skip():
                    raise DataError(
                        "The training corpus holds no text; add text to it, or check "
                        "data.text_column."
                    )
                raise DataError(
                    "The corpus holds no training text beyond the held-out validation "
                    "documents; add text or lower data.stream_validation_docs."
                )
            self.state = self._epoch_start(st["epoch"] + 1)


# ----------------------------------------------------------------------------------------
# Blocks of one shard
# ----------------------------------------------------------------------------------------


def _key(position: dict[str, Any] | None) -> tuple[int, int]:
    """(epoch, index of the next document) of a ``DocStream`` position (None: the start)."""
    return (0, 0) if position is None else (int(position["epoch"]), int(position["index"]))


class SharedDocs:
    """One reading of the document stream, dealt to the shards of one reader.

    Document ``i`` of an epoch belongs to shard ``i % shards`` (or to the one shard the source
    serves, when the source gives a shard only its own files: ``DocStream.presharded``). Each
    shard takes its documents from its own position (``starts``, where its windows start); what
    is read ahead for one shard waits in that shard's queue, with the stream position after it
    at the end of each tokenizing batch of ``every`` documents (where a window can end), so that
    every shard knows where it stands however far the others have gone.
    """

    def __init__(
        self, stream: DocStream, shards: int, starts: dict[int, Any], every: int = 1
    ) -> None:
        self.stream, self.shards, self.every = stream, shards, every
        self.queues: dict[int, deque] = {v: deque() for v in starts}
        self.start = {v: _key(p) for v, p in starts.items()}
        self.dealt = dict.fromkeys(starts, 0)  # documents dealt to each shard
        first = min(starts.values(), key=_key)
        self._docs = stream.docs(first)
        self._epoch = _key(first)[0]

    def take(self, shard: int) -> tuple[int, int, str, dict[str, Any]]:
        """Return the shard's next (epoch, index, document, stream position after it: None
        within a tokenizing batch)."""
        queue, epochs = self.queues[shard], 0
        while not queue:
            i, doc = next(self._docs)
            epoch = self.stream.state["epoch"]
            if epoch != self._epoch:
                self._epoch, epochs = epoch, epochs + 1
                if epochs > 1:  # a whole epoch read without one document for this shard
                    raise DataError(
                        f"The corpus has too few documents for {self.shards} stream shards; "
                        "add text, or lower data.stream_shards or train.num_workers."
                    )
            owner = shard if self.stream.presharded else i % self.shards
            if owner in self.queues and (epoch, i) >= self.start[owner]:
                self.dealt[owner] += 1
                # a shard's window ends with a tokenizing batch of ``every`` documents: only
                # there is the position asked for
                last = self.dealt[owner] % self.every == 0
                self.queues[owner].append((epoch, i, doc, self.stream.position() if last else None))
        return queue.popleft()


class ShardBlocks:
    """Blocks of shard ``shard`` of ``shards``: tokenized, packed and window-shuffled.

    ``docs``: the reading it takes its documents from, shared with the reader's other shards
    (its own reading of the stream by default); ``window``: blocks shuffled together
    (``data.shuffle_buffer`` by default); ``tokenize_docs``: documents tokenized together.
    """

    def __init__(
        self,
        cfg: DataConfig,
        tokenizer,
        shard: int,
        shards: int,
        seed: int,
        skip_first: int = 0,
        split: str = "train",
        docs: SharedDocs | None = None,
        window: int | None = None,
        tokenize_docs: int | None = None,
    ) -> None:
        self.cfg, self.tokenizer = cfg, tokenizer
        self.shard, self.shards, self.seed = shard, shards, seed
        self.skip_first, self.split, self.docs = skip_first, split, docs
        self.window = window or cfg.shuffle_buffer
        self.tokenize_docs = tokenize_docs or TOKENIZE_DOCS
        self.state: dict[str, Any] = {"docs": None, "carry": [], "window": 0, "emitted": 0}
        self._epoch = _key(None)[0]

    def _pack(self, texts: list[str], carry: list[int]) -> tuple[list, list[int]]:
        ids = encode(self.tokenizer, texts)
        cls_id, sep_id = self.tokenizer.cls_token_id, self.tokenizer.sep_token_id
        if self.cfg.packing == "line_by_line":
            return pack_lines(ids, cls_id, sep_id, self.cfg.max_seq_length), carry
        blocks, carry = pack_concat(ids, cls_id, sep_id, self.cfg.max_seq_length, carry)
        return list(blocks), carry

    def _fill(self, carry: list[int]) -> tuple[list, list[int], dict[str, Any]]:
        """At least ``window`` blocks (whole tokenizing batches), the carry after them and the
        stream position after their last document."""
        window: list = []
        texts: list[str] = []
        while True:
            self._epoch, _, doc, position = self.docs.take(self.shard)
            texts.append(doc)
            if len(texts) == self.tokenize_docs:
                blocks, carry = self._pack(texts, carry)
                window.extend(blocks)
                texts = []
                if len(window) >= self.window:
                    return window, carry, position

    def blocks(self) -> Iterator[Any]:
        """Blocks without end, from ``self.state`` on; ``self.state`` follows each block."""
        st = self.state
        self._epoch = _key(st["docs"])[0]
        if self.docs is None:
            stream = DocStream(self.cfg, self.split, self.skip_first, (self.shard, self.shards))
            self.docs = SharedDocs(
                stream, self.shards, {self.shard: st["docs"]}, self.tokenize_docs
            )
        carry = list(st["carry"])
        while True:
            window, carry, position = self._fill(carry)
            if self.window > 1:
                order = np.random.default_rng([self.seed, self.shard, st["window"]]).permutation(
                    len(window)
                )
            else:
                order = range(len(window))
            for j in range(st["emitted"], len(window)):
                st["emitted"] = j + 1
                yield window[order[j]]
            # the next window starts where this one stopped reading
            st.update(
                docs=position, carry=list(map(int, carry)), window=st["window"] + 1, emitted=0
            )

    def epoch(self) -> int:
        return int(self._epoch)


def mask_seed(seed: int, shard: int, batch: int) -> int:
    return (((seed * 1_000_003 + 7) * 1_000_003 + batch) * 8_191 + shard) % 2**63


SHARDS_PER_READER = 12  # data.stream_shards=null: shards per reader at the run's start


def hub_split_by_files(cfg: DataConfig, shards: int) -> bool:
    """Return whether the training stream is one hub dataset whose files divide among
    ``shards`` (each shard then downloads only its own files)."""
    specs = stream_sources(cfg, "train")
    if len(specs) != 1 or specs[0][0].kind != "hub":
        return False
    src = specs[0][0]
    ds = load_hub(src.name, src.config, src.split, src.text_column, streaming=True)
    return ds.num_shards % shards == 0


class StreamingBlocks(torch.utils.data.IterableDataset):
    """Endless batches of one rank; each dataloader worker is a reader of its own.

    The stream is cut into ``layout["shards"]`` shards, fixed for the run
    (``data.stream_shards``; by default 12 per reader at the start). Reader ``r`` of ``R``
    (processes x workers) reads shards ``r, r + R, ...``, takes a batch's rows from them in
    turn, and reads the stream once for all of them (``SharedDocs``). A shard's position does
    not depend on who reads it, so a run resumed on another number of readers deals the same
    shards out again: every document of the epoch is still read once.

    A worker plays the role ``(worker id + rotation) % workers``: after a resume the
    dataloader asks worker 0 first, while the next batch was due from role
    ``consumed % workers``, so the roles rotate to keep the order.
    """

    def __init__(
        self,
        cfg: DataConfig,
        tokenizer,
        batch_size: int,
        rank: int,
        world: int,
        workers: int,
        seed: int,
        skip_first: int,
    ) -> None:
        self.cfg, self.tokenizer, self.batch_size = cfg, tokenizer, batch_size
        self.rank, self.world, self.workers, self.seed = rank, world, max(1, workers), seed
        self.skip_first = skip_first
        readers = world * self.workers
        shards = cfg.stream_shards or SHARDS_PER_READER * readers
        if shards < readers:
            raise ConfigError(
                f"data.stream_shards={shards} is fewer than the {readers} readers of the stream "
                "(processes x dataloader workers); raise data.stream_shards."
            )
        self.layout = {
            "shards": shards,
            # the windows of all of a reader's shards hold data.shuffle_buffer blocks together
            "window": -(-cfg.shuffle_buffer * readers // shards),
            "tokenize_docs": -(-TOKENIZE_DOCS * readers // shards),
        }
        self.states: list[dict | None] = [None] * self.workers
        self.rotation = 0

    @property
    def readers(self) -> int:
        return self.world * self.workers

    def owned(self, reader: int) -> list[int]:
        return list(range(reader, self.layout["shards"], self.readers))

    def _readings(self, owned: list[int], starts: dict[int, Any]) -> dict[int, SharedDocs]:
        """Return the readings of the stream the shards take their documents from: one for
        all, or one each where each shard downloads only its own files."""
        shards = self.layout["shards"]

        def stream(shard: tuple[int, int] | None) -> DocStream:
            return DocStream(self.cfg, "train", self.skip_first, shard)

        every = self.layout["tokenize_docs"]
        if len(owned) == 1 or hub_split_by_files(self.cfg, shards):
            return {
                v: SharedDocs(stream((v, shards)), shards, {v: starts[v]}, every) for v in owned
            }
        shared = SharedDocs(stream(None), shards, starts, every)
        return dict.fromkeys(owned, shared)

    def __iter__(self):
        info = torch.utils.data.get_worker_info()
        role = ((info.id if info else 0) + self.rotation) % self.workers
        reader = self.rank * self.workers + role
        owned = self.owned(reader)
        state = json.loads(json.dumps(self.states[role] or new_reader_state()))
        saved = state["shards"]
        readings = self._readings(owned, {v: (saved.get(str(v)) or {}).get("docs") for v in owned})
        shards: dict[int, ShardBlocks] = {}
        for v in owned:
            shards[v] = ShardBlocks(
                self.cfg, self.tokenizer, v, self.layout["shards"], self.seed, self.skip_first,
                docs=readings[v], window=self.layout["window"],
                tokenize_docs=self.layout["tokenize_docs"],
            )  # fmt: skip
            if str(v) in saved:
                shards[v].state = saved[str(v)]
        blocks = {v: shards[v].blocks() for v in owned}
        while True:
            rows = []
            for _ in range(self.batch_size):
                rows.append(next(blocks[owned[state["next"] % len(owned)]]))
                state["next"] += 1
            state["batches"] += 1
            state["shards"] = {str(v): shards[v].state for v in owned}
            yield {
                "rows": rows,
                "mask_seed": mask_seed(self.seed, reader, state["batches"]),
                "role": role,
                "state": json.loads(json.dumps(state)),
                "epoch": min(shards[v].epoch() for v in owned),
            }


def new_reader_state() -> dict[str, Any]:
    """Return the state of a reader that has handed out nothing: its shards' states, the next
    shard's turn, and its batches (their mask seeds)."""
    return {"shards": {}, "next": 0, "batches": 0}


class StreamCollate:
    """Collate a streamed batch (in the worker), keeping its position beside the tensors."""

    def __init__(self, collate) -> None:
        self.collate = collate

    def __call__(self, item: dict) -> dict:
        # every row its own mask seed (the collator masks each row from its seed)
        batch = self.collate(
            [
                {
                    "input_ids": torch.as_tensor(r, dtype=torch.long),
                    "mask_seed": (item["mask_seed"] + j) % 2**63,
                }
                for j, r in enumerate(item["rows"])
            ]
        )
        batch["_position"] = (item["role"], item["state"], item["epoch"])
        return batch


class StreamingBatches:
    """The training stream of one rank for the trainer: ``next()`` and ``state_dict()``."""

    def __init__(
        self,
        dataset: StreamingBlocks,
        collate,
        num_workers: int,
        device: torch.device,
        pin_memory: bool = False,
    ) -> None:
        self.dataset, self.collate, self.num_workers = dataset, StreamCollate(collate), num_workers
        self.device, self.pin_memory = device, pin_memory
        self.consumed = 0
        self.epoch = 0
        self._it = None

    def _start(self) -> None:
        from torch.utils.data import DataLoader

        self.dataset.rotation = self.consumed % self.dataset.workers
        if self.num_workers > 0:
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        loader = DataLoader(
            self.dataset,
            batch_size=None,
            collate_fn=self.collate,
            num_workers=self.num_workers,
            pin_memory=self.pin_memory,
            prefetch_factor=2 if self.num_workers > 0 else None,
        )
        self._it = iter(loader)

    def __next__(self) -> dict[str, torch.Tensor]:
        if self._it is None:
            self._start()
        batch = next(self._it)
        role, state, epoch = batch.pop("_position")
        self.dataset.states[role] = state
        self.consumed += 1
        self.epoch = epoch
        return {
            k: v.to(self.device, non_blocking=True) if isinstance(v, torch.Tensor) else v
            for k, v in batch.items()
        }

    def state_dict(self) -> dict[str, Any]:
        """Return this rank's position (the trainer gathers the ranks')."""
        return {
            "streaming": True,
            "consumed": self.consumed,
            "workers": self.dataset.workers,
            "epoch": self.epoch,
            "layout": self.dataset.layout,
            "readers": self.dataset.states,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue where ``state``, this rank's own position, stood (``load_ranks``: from the
        positions of all the ranks of a checkpoint)."""
        dataset = self.dataset
        state = upgrade(state, dataset.rank, dataset.world, dataset.cfg.shuffle_buffer)
        if state["workers"] != dataset.workers:  # dealt out again: one process's whole stream
            self.load_ranks([state], 0)
            return
        dataset.layout, dataset.states = dict(state["layout"]), list(state["readers"])
        self.consumed, self.epoch, self._it = state["consumed"], state.get("epoch", 0), None

    def load_ranks(self, ranks: list[dict[str, Any]], rank: int) -> None:
        """Continue from the positions of all the ranks that wrote a checkpoint: this rank's
        own where the processes and workers are as they were, else the stream's shards dealt
        out again to the readers there are now."""
        if not all(r.get("streaming") for r in ranks):
            raise ConfigError(
                "The checkpoint was written by a map-mode run; resume it with "
                "data.streaming=false, or start a new run."
            )
        buffer = self.dataset.cfg.shuffle_buffer
        ranks = [upgrade(r, i, len(ranks), buffer) for i, r in enumerate(ranks)]
        dataset = self.dataset
        dataset.layout = dict(ranks[0]["layout"])
        self.epoch = min(r.get("epoch", 0) for r in ranks)
        if (len(ranks), ranks[0]["workers"]) == (dataset.world, dataset.workers):
            self.load_state_dict(ranks[rank])
            return
        shards: dict[str, Any] = {}
        batches = 0
        for r in ranks:
            for reader in r["readers"]:
                if reader is not None:
                    shards.update(reader["shards"])
                    batches += reader["batches"]
        total, readers = dataset.layout["shards"], dataset.readers
        if total < readers:
            raise ConfigError(
                f"The checkpoint's stream has {total} shards, fewer than the {readers} readers "
                "(processes x dataloader workers) it would have now; resume with fewer processes "
                "or a lower train.num_workers, or start the run with a higher data.stream_shards."
            )
        if rank == 0:
            log.info(
                "The stream's %d shards, read by %d process(es) x %d worker(s) at the checkpoint, "
                "are dealt out to %d x %d now: each shard goes on where it stood.",
                total, len(ranks), ranks[0]["workers"], dataset.world, dataset.workers,
            )  # fmt: skip
            if total % readers:
                log.warning(
                    "%d stream shards do not divide evenly among %d readers: readers with more "
                    "shards take each of them more slowly (no document is skipped or repeated); "
                    "a data.stream_shards that every reader count divides avoids this.",
                    total,
                    readers,
                )
        dataset.states = []
        for role in range(dataset.workers):
            owned = dataset.owned(dataset.rank * dataset.workers + role)
            state = new_reader_state()
            state["shards"] = {str(v): shards[str(v)] for v in owned if str(v) in shards}
            state["batches"] = batches  # masks drawn from seeds no reader has used
            dataset.states.append(state)
        self.consumed = 0
        self._it = None


def upgrade(rank_state: dict[str, Any], rank: int, world: int, shuffle_buffer: int) -> dict:
    """Rank ``rank`` of ``world``'s stream position as written before the stream had shards of
    its own (a shard per reader, ``data.shuffle_buffer`` blocks per window), in today's form:
    the same stream, continued exactly."""
    if "layout" in rank_state:
        return rank_state
    workers = rank_state["workers"]
    readers: list[dict | None] = []
    for role, old in enumerate(rank_state["shards"]):
        if old is None:
            readers.append(None)
            continue
        shard = {k: old[k] for k in ("docs", "carry", "window", "emitted")}
        reader = rank * workers + role
        readers.append({"shards": {str(reader): shard}, "next": 0, "batches": old["batches"]})
    return {
        **rank_state,
        "layout": {
            "shards": world * workers,
            "window": shuffle_buffer,
            "tokenize_docs": TOKENIZE_DOCS,
        },
        "readers": readers,
    }


# ----------------------------------------------------------------------------------------
# Set-up: checks, validation blocks, texts for tokenizer training
# ----------------------------------------------------------------------------------------


def check_sources(cfg: DataConfig, splits: tuple[str, ...] = ("train", "validation")) -> None:
    """Fail early, in the main process, with one sentence: no files, binary or UTF-16
    files, a missing column or one without text, an unreachable hub dataset, a corpus
    without any text."""
    for split in splits:
        for src, setting in stream_sources(cfg, split):
            if src.kind == "files":
                for f in resolve_files(src.files, setting):
                    if Path(f).suffix.lower() != ".parquet":
                        check_not_binary(f, setting)
                    check_text_column(f, src.text_column, setting)
            source = _make_source(src, cfg, setting)
            try:
                next(iter(source.docs(None)))
            except StopIteration:
                if len(stream_sources(cfg, split)) == 1:
                    raise DataError(f"{setting}: the {split} corpus holds no text.") from None
                log.warning("%s holds no text", setting)


def validation_rows(cfg: DataConfig, tokenizer) -> list:
    """Return the validation blocks (at most ``max_eval_samples``) packed like the training ones."""
    held_out = not stream_sources(cfg, "validation")
    stream = DocStream(cfg, "validation")
    limit = cfg.max_eval_samples or 10**9
    rows: list = []
    carry: list[int] = []
    texts: list[str] = []
    reader = ShardBlocks(cfg, tokenizer, 0, 1, 0)
    for i, doc in stream.docs():
        if stream.state["epoch"] > 0 or (held_out and i >= cfg.stream_validation_docs):
            break
        texts.append(doc)
        if len(texts) == TOKENIZE_DOCS:
            blocks, carry = reader._pack(texts, carry)
            rows.extend(blocks)
            texts = []
            if len(rows) >= limit:
                break
    if texts:
        blocks, carry = reader._pack(texts, carry)
        rows.extend(blocks)
    rows = [np.asarray(r, dtype=np.int32) for r in rows[:limit]]
    if not rows:
        raise DataError(
            f"The validation documents pack into zero blocks of {cfg.max_seq_length} tokens; add "
            "text (data.validation_files), raise data.stream_validation_docs or lower "
            "data.max_seq_length."
        )
    return rows


def first_blocks(cfg: DataConfig, tokenizer, n: int, skip_first: int) -> list:
    """Return the first ``n`` training blocks in stream order (for the majority-token baseline)."""
    from dataclasses import replace

    reader = ShardBlocks(replace(cfg, shuffle_buffer=1), tokenizer, 0, 1, 0, skip_first)
    it = reader.blocks()
    return [np.asarray(next(it), dtype=np.int32) for _ in range(n)]


def iter_texts(cfg: DataConfig) -> Iterator[str]:
    """Every training document once, streamed (tokenizer training), after the checks of
    ``check_sources``: a file that cannot be read is one sentence before any training."""
    check_sources(cfg, splits=("train",))
    stream = DocStream(cfg, "train")
    for _, doc in stream.docs():
        if stream.state["epoch"] > 0:
            return
        yield doc


def as_dataset(rows: list):
    """Return blocks of ids (numpy arrays) as a dataset in memory, as map mode's packed splits
    are (``packing.id_rows`` reads them), fingerprinted by their content."""
    return in_memory({"input_ids": [r.tolist() for r in rows]}, content(rows))


def setup_streaming(
    cfg: DataConfig, tokenizer, batch_size: int, rank: int, world: int, num_workers: int, seed: int
):
    """Return (the training ``StreamingBlocks``, validation dataset, baseline dataset)."""
    check_sources(cfg)
    skip = 0 if stream_sources(cfg, "validation") else cfg.stream_validation_docs
    val_rows = validation_rows(cfg, tokenizer)
    first = first_blocks(cfg, tokenizer, min(2000, max(batch_size, 256)), skip)
    check_predictable(first, tokenizer, stream_sources(cfg, "train")[0][1])
    check_predictable(
        val_rows, tokenizer, (stream_sources(cfg, "validation") or stream_sources(cfg))[0][1]
    )
    val, baseline = as_dataset(val_rows), as_dataset(first)
    dataset = StreamingBlocks(cfg, tokenizer, batch_size, rank, world, num_workers, seed, skip)
    return dataset, val, baseline
