"""Token classification: a tag per word (named entities, part-of-speech tags).

    mlmkit finetune checkpoint=outputs/<run> task=ner task.data_dir=../shared/data/tokens/wnut17
    mlmkit finetune checkpoint=outputs/<run> task=pos task.data_dir=<UD_English-EWT>
    mlmkit finetune checkpoint=outputs/<run> task=tokens task.train_file=a.conll \
        task.eval_file=b.conll

Reader: ``mlmkit.finetune.conll`` (CoNLL ``token<TAB>tag`` lines, CoNLL-U's UPOS or XPOS);
the tags are ``task.labels`` or the training file's (``O`` first, then sorted); a tag of the
evaluation file outside them is an error naming its line. Without an evaluation file,
``task.eval_share`` of the sentences are held out (seeded by ``task.split_seed``).

Head: the family's ``...ForTokenClassification`` (``BertForTokenClassification``,
``RobertaForTokenClassification``, ...). Word labels meet subwords as in transformers' run_ner:
the first subword of a word carries its tag, the others are ignored by the loss (-100) and by
the decoder. A sentence longer than ``max_seq_length`` is split into windows of whole words,
each word in one window, not cut. A byte-level BPE (RoBERTa's) reads each word with the space
before it, as in running text (``word_tokenizer``).

Decoder/scorer: each word takes the tag of its first subword's largest logit; entity tags
(BIO) are scored at entity level as conlleval scores them (``mlmkit.finetune.entities``:
precision, recall, F1, overall and per type), other tags by word accuracy. The baseline is
a tagger that marks every word O (entities), or gives each word its most frequent tag in the
training set (the most frequent tag overall for a word it never saw).
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any

from mlmkit.config import FinetuneConfig
from mlmkit.errors import ConfigError, DataError
from mlmkit.finetune.conll import read_sentences
from mlmkit.finetune.entities import chunks, entity_scores, ill_formed, is_bio
from mlmkit.finetune.reader import hold_out, task_file
from mlmkit.finetune.task import Task, pad_batch

log = logging.getLogger("mlmkit")


def tag_order(tags: set[str]) -> list[str]:
    """Return the label order of a tag set: ``O`` first, then the tags sorted by type and prefix."""
    rest = sorted(tags - {"O"}, key=lambda t: (t.partition("-")[2] or t, t))
    return (["O"] if "O" in tags else []) + rest


def word_windows(counts: list[int], room: int) -> list[tuple[int, int]]:
    """``(first word, one past the last)`` of windows of whole words, in order, each holding
    at most ``room`` subwords (a word longer than that alone, its subwords cut)."""
    windows, start, used = [], 0, 0
    for i, n in enumerate(counts):
        if i > start and used + n > room:
            windows.append((start, i))
            start, used = i, 0
        used += n
    if counts:
        windows.append((start, len(counts)))
    return windows


def word_tokenizer(tokenizer):
    """Return a tokenizer that reads words split beforehand as running text has them. A byte-level
    BPE (RoBERTa's, GPT-2's) keeps a word's leading space in its first token
    ("Ġlives"), so a word given alone reads as another, rarer split ("l", "ives"): a copy of it
    that adds the space before every word (``add_prefix_space``, as transformers' run_ner sets
    it), saved so with the fine-tuned model. Other tokenizers (WordPiece, SentencePiece's word
    marks) are returned as they are."""
    import copy

    from tokenizers import pre_tokenizers

    backend = getattr(tokenizer, "backend_tokenizer", None)
    pre = backend.pre_tokenizer if backend is not None else None
    if not isinstance(pre, pre_tokenizers.ByteLevel) or pre.add_prefix_space:
        return tokenizer
    words = copy.deepcopy(tokenizer)
    words.backend_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(
        add_prefix_space=True, trim_offsets=pre.trim_offsets, use_regex=pre.use_regex
    )
    words.add_prefix_space = True
    words.init_kwargs["add_prefix_space"] = True  # its saved config: a pipeline reads words so
    return words


def subword_counts(tokenizer, sentences: list[list[str]]) -> list[list[int]]:
    """Return the number of subwords of each word of each sentence (0 for a word the tokenizer
    drops)."""
    enc = tokenizer(sentences, is_split_into_words=True, add_special_tokens=False)
    counts = []
    for i, words in enumerate(sentences):
        n = Counter(w for w in enc.word_ids(i) if w is not None)
        counts.append([n.get(j, 0) for j in range(len(words))])
    return counts


def check_tags(sentences: list[dict], labels: list[str], path, setting: str) -> None:
    """Raise an error naming the first word whose tag is not one of ``labels``."""
    known = set(labels)
    for s in sentences:
        for tag, line in zip(s["tags"], s["lines"]):
            if tag not in known:
                shown = ", ".join(labels[:12]) + (", ..." if len(labels) > 12 else "")
                raise DataError(
                    f"{str(path)!r} line {line}: the tag {tag!r} is not one of the task's tags "
                    f"({shown}); correct the line, or list every tag in task.labels "
                    f"(or point {setting} at another file)."
                )


def warn_ill_formed(sentences: list[dict], path) -> None:
    """One warning counting the tags that begin an entity with I- (not valid BIO)."""
    n = sum(ill_formed(s["tags"]) for s in sentences)
    if n:
        log.warning(
            "%s: %d tag(s) begin an entity with I- or E- (after O or another type: not valid "
            "BIO); each is read as conlleval reads it, as the first word of an entity",
            path,
            n,
        )


class TokenTask(Task):
    """A tag per word: CoNLL and CoNLL-U files, a token-classification head."""

    group_by_length = True

    def load(self):
        cfg = self.cfg
        path = task_file(cfg, "train")
        train = read_sentences(path, cfg, "task.train_file")
        dev_path = task_file(cfg, "eval") if cfg.eval_file else path
        dev = read_sentences(dev_path, cfg, "task.eval_file") if cfg.eval_file else []
        if not cfg.labels:
            cfg.labels = tag_order({t for s in train for t in s["tags"]})
            log.info(
                "task.labels from %s: %s (tag ids in this order; task.labels=[...] fixes them)",
                path,
                ", ".join(cfg.labels),
            )
        check_tags(train, cfg.labels, path, "task.train_file")
        if not cfg.eval_file:
            train, dev = hold_out(train, cfg, path, "sentences")
        check_tags(dev, cfg.labels, dev_path, "task.eval_file")
        self._choose_metric()
        if self.entities:
            warn_ill_formed(train, path)
            warn_ill_formed(dev, dev_path)
        return train, dev

    @property
    def entities(self) -> bool:
        """Whether the tags mark entities, scored at entity level (``f1`` in task.metrics)."""
        return "f1" in self.cfg.metrics

    def _choose_metric(self) -> None:
        """Entity F1 for entity tags, word accuracy for others (unless task.metrics says)."""
        cfg, bio = self.cfg, is_bio(self.cfg.labels)
        if not cfg.metrics:
            cfg.metrics = ["f1", "accuracy"] if bio else ["accuracy"]
        if "f1" in cfg.metrics and not bio:
            raise ConfigError(
                f"task.metrics: f1 scores entities, and the tags of task={cfg.name} "
                f"({', '.join(cfg.labels[:6])}, ...) mark none (no B-/I- tags); set "
                "task.metrics=[accuracy]."
            )

    def configure(self, config, cfg: FinetuneConfig) -> None:
        config.id2label = dict(enumerate(self.cfg.labels))
        config.label2id = {t: i for i, t in enumerate(self.cfg.labels)}
        config.mlmkit_task = {
            "name": self.cfg.name,
            "kind": "tokens",
            "max_seq_length": cfg.max_seq_length,
            "entities": self.entities,
        }

    def head(self, arch, config, cfg: FinetuneConfig):
        return arch.token_classifier(config)

    def tokenizer_for(self, tokenizer):
        return word_tokenizer(tokenizer)

    def features(self, examples, tokenizer, max_seq_length, training):
        ids = {t: i for i, t in enumerate(self.cfg.labels)}
        return sentence_windows(
            [e["words"] for e in examples],
            tokenizer,
            max_seq_length,
            [[ids[t] for t in e["tags"]] for e in examples],
        )

    def collate(self, tokenizer, max_seq_length: int):
        keys = [*tokenizer.model_input_names, "labels", "index"]
        pad = {"input_ids": tokenizer.pad_token_id, "labels": -100}
        return lambda rows: pad_batch(rows, keys, pad)

    def decode(self, outputs, features, examples) -> list[list[str]]:
        """Each word's tag: its first subword's argmax (O, or the first tag, where it has none)."""
        return decode_words(outputs, features, [len(e["words"]) for e in examples], self.cfg.labels)

    def score(self, predictions, examples) -> dict[str, Any]:
        gold = [e["tags"] for e in examples]
        if self.entities:
            return entity_scores(gold, predictions)
        right = sum(a == b for g, p in zip(gold, predictions) for a, b in zip(g, p))
        return {"accuracy": right / max(sum(len(g) for g in gold), 1)}

    def records(self, examples, predictions):
        for e, pred in zip(examples, predictions, strict=True):
            record = {"text": " ".join(e["words"]), "words": e["words"], "tags": e["tags"]}
            record["predicted"] = pred
            if self.entities:
                record["entities"] = entity_spans(e["words"], pred)
                record["gold_entities"] = entity_spans(e["words"], e["tags"])
            yield record

    def baseline(self) -> dict[str, Any]:
        if self.entities:
            guess = [["O"] * len(e["words"]) for e in self.eval]
            return {"baseline": "every word O", **self.score(guess, self.eval)}
        counts: dict[str, Counter] = {}
        for e in self.train:
            for word, tag in zip(e["words"], e["tags"]):
                counts.setdefault(word, Counter())[tag] += 1
        overall = Counter(t for e in self.train for t in e["tags"]).most_common(1)[0][0]
        guess = [
            [counts[w].most_common(1)[0][0] if w in counts else overall for w in e["words"]]
            for e in self.eval
        ]
        return {
            "baseline": "each word's most frequent training tag",
            **self.score(guess, self.eval),
        }

    def summary(self) -> dict[str, Any]:
        return {"labels": list(self.cfg.labels)}


def sentence_windows(
    sentences: list[list[str]], tokenizer, max_seq_length: int, tags: list[list[int]] | None = None
) -> list[dict[str, Any]]:
    """Return the model's inputs of word-split sentences: windows of whole words, each with the
    position of every word's first subword (``first``, -1 for a word without one), the index of
    its sentence (``example``) and first word (``start``), and with ``tags`` the first subword's
    label (the others -100)."""
    room = max_seq_length - tokenizer.num_special_tokens_to_add(pair=False)
    names = list(tokenizer.model_input_names)
    features = []
    counts = subword_counts(tokenizer, sentences)
    for i, words in enumerate(sentences):
        for a, b in word_windows(counts[i], room):
            enc = tokenizer(
                words[a:b], is_split_into_words=True, truncation=True, max_length=max_seq_length
            )
            first, labels, prev = [-1] * (b - a), [-100] * len(enc["input_ids"]), None
            for pos, w in enumerate(enc.word_ids()):
                if w is not None and w != prev:
                    first[w] = pos
                    labels[pos] = tags[i][a + w] if tags is not None else 0
                prev = w
            feature = {k: enc[k] for k in names if k in enc}
            feature.update(labels=labels, example=i, start=a, first=first, index=len(features))
            features.append(feature)
    return features


def decode_words(outputs, features, lengths: list[int], labels: list[str]) -> list[list[str]]:
    """Each word's tag from its windows' logits (``outputs``, one per feature)."""
    fallback = "O" if "O" in labels else labels[0]
    tags: list[list[str]] = [[fallback] * n for n in lengths]
    for feature, logits in zip(features, outputs, strict=True):
        best = logits.argmax(-1).tolist()
        for j, pos in enumerate(feature["first"]):
            if pos >= 0:
                tags[feature["example"]][feature["start"] + j] = labels[best[pos]]
    return tags


def entity_spans(words: list[str], tags: list[str]) -> list[dict[str, Any]]:
    """Return the entities of a sentence as text and character offsets into its words joined by
    spaces: ``{"type", "text", "start", "end"}``."""
    starts, at = [], 0
    for w in words:
        starts.append(at)
        at += len(w) + 1
    return [
        {
            "type": kind,
            "text": " ".join(words[a:b]),
            "start": starts[a],
            "end": starts[b - 1] + len(words[b - 1]),
        }
        for kind, a, b in chunks(tags)
    ]
