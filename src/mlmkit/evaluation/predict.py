"""Predictions of a fine-tuned classifier (``mlmkit predict``): its model dir loaded with the
class its config names, and the label and probability (or, for a regression model, the
score) of each input.

    from mlmkit.evaluation.predict import load_classifier, predict
    model, tokenizer, task = load_classifier("outputs/finetune/files/<date>/<time>/model")
    predict(model, tokenizer, [["a text"], ["another"]], max_length=128)

``load_classifier`` serves a mean-pooled BERT (``classifier_pooling: mean`` in its config,
``pooling=mean`` in finetune) as ``MeanPoolBertForSequenceClassification``, where transformers'
auto classes and ``pipeline("text-classification")`` would build ``BertForSequenceClassification``
and pool the [CLS] state; other models (``pooling=cls``, ModernBERT, the other families' own
classifiers, which pool their first token) load as those do.
"""

from __future__ import annotations

from pathlib import Path

import torch

from mlmkit.config import TaskConfig
from mlmkit.data.sources import check_not_binary
from mlmkit.data.tokenizer import load_tokenizer
from mlmkit.errors import ConfigError, DataError, first_line
from mlmkit.finetune.reader import read_rows
from mlmkit.model.architectures import (
    MODEL_TYPES,
    architecture,
    fit_tokenizer,
    transformers_class,
)
from mlmkit.model.bert import family_attention, load_pretrained_config
from mlmkit.model.classifier import MeanPoolBertForSequenceClassification
from mlmkit.model.safety import read_json_object

HEADS = ("ForSequenceClassification", "ForTokenClassification", "ForQuestionAnswering")


def classifier_class(config: dict, source: str = "the model", setting: str = "model_dir"):
    """Return the class that serves a fine-tuned model's config (its config.json, as a dict), or
    an error naming ``source`` for a model that is no fine-tuned one: a mean-pooled BERT
    (``classifier_pooling: mean``) is ``MeanPoolBertForSequenceClassification``, any other
    sequence classifier ``BertForSequenceClassification`` (or ModernBERT's, which pools as its
    config says), a token classifier or a span extractor (question answering) its
    architecture's ``...ForTokenClassification`` or ``...ForQuestionAnswering``."""
    names, model_type = list(config.get("architectures") or []), config.get("model_type")
    head = next((h for h in HEADS for n in names if str(n).endswith(h)), None)
    if model_type not in MODEL_TYPES or head is None:
        what = names[0] if names else f"{model_type!r} model"
        raise ConfigError(
            f"{setting}: {source} holds a {what}, not a fine-tuned classifier, tagger or "
            "question answerer; pass "
            "the model/ dir of an mlmkit finetune run (or the run dir)."
        )
    arch = architecture(model_type)
    if head == "ForTokenClassification":
        return transformers_class(arch.token_classification)
    if head == "ForQuestionAnswering":
        return transformers_class(arch.question_answering)
    if model_type == "bert" and config.get("classifier_pooling", "cls") == "mean":
        return MeanPoolBertForSequenceClassification
    return transformers_class(arch.sequence_classification)


def load_classifier(model_dir: str | Path, setting: str = "model_dir"):
    """``(model, tokenizer, mlmkit_task)`` of a fine-tuned classifier dir (or a finetune run dir,
    its ``model/``), in eval mode; as mlmkit's other loaders (``load_pretrained_config``), it
    reads no custom code (``auto_map`` refused, ``trust_remote_code=False``) and weights from
    safetensors only."""
    path = Path(model_dir).expanduser()
    if not (path / "config.json").is_file() and (path / "model" / "config.json").is_file():
        path = path / "model"  # a finetune run dir
    if not (path / "config.json").is_file():
        raise ConfigError(
            f"{setting}: {str(model_dir)!r} is not a model dir (no config.json); pass "
            "the model/ dir of an mlmkit finetune run (or the run dir)."
        )
    # the kind of model first (its config.json read as JSON), then the checks of every loader
    model_class = classifier_class(
        read_json_object(path / "config.json", setting), repr(str(model_dir)), setting
    )
    config = load_pretrained_config(str(path), setting)
    try:
        model = model_class.from_pretrained(
            str(path),
            config=config,
            use_safetensors=True,
            trust_remote_code=False,
            attn_implementation=family_attention(architecture(config.model_type), "sdpa"),
        )
    except Exception as exc:
        raise ConfigError(
            f"{setting}: could not load the weights of {str(path)!r} ({first_line(exc)}); "
            "the dir is damaged, so pass another model dir."
        ) from None
    tokenizer = load_tokenizer(str(path), setting)
    fit_tokenizer(tokenizer, model)
    return model.eval(), tokenizer, dict(getattr(config, "mlmkit_task", None) or {})


def read_inputs(path: Path, columns: list[str]) -> list[list[str]]:
    """Read the inputs of ``--file``: each non-blank line of a text file (a pair's two texts split
    at a tab), or the ``columns`` of each row of a .jsonl, .csv or .tsv file."""
    if not path.is_file():
        raise ConfigError(
            f"--file: {str(path)!r} does not exist; pass a .txt, .jsonl, .csv or .tsv file."
        )
    if path.suffix.lower() in (".jsonl", ".json", ".csv", ".tsv"):
        task = TaskConfig(name="predict", text_columns=columns, labels=[], hub_path=None)
        return [
            [row[c].strip() for c in columns] for _, row in read_rows(path, task, "--file", columns)
        ]
    check_not_binary(str(path), "--file")
    inputs = []
    for line, text in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not text.strip():
            continue
        texts = text.split("\t") if len(columns) == 2 else [text]
        if len(texts) != len(columns):
            raise DataError(
                f"--file: {str(path)!r} line {line} holds {len(texts)} tab-separated "
                f"texts, but the model classifies pairs ({', '.join(columns)}); write "
                "each pair on one line, its two texts separated by a tab."
            )
        inputs.append([t.strip() for t in texts])
    return inputs


def group_texts(texts: list[str], columns: list[str]) -> list[list[str]]:
    """Group the positional texts as inputs: one each, or for a pair model two by two."""
    for i, text in enumerate(texts, 1):
        if not text.strip():
            raise ConfigError(f"Text {i} on the command line is empty; give a text to classify.")
    n = len(columns)
    if len(texts) % n:
        raise ConfigError(
            f"The model classifies pairs ({', '.join(columns)}), so give its texts two "
            f"by two, first and second, or --file; got {len(texts)} texts."
        )
    return [texts[i : i + n] for i in range(0, len(texts), n)]


@torch.no_grad()
def predict(
    model, tokenizer, inputs: list[list[str]], max_length: int, batch_size: int = 32
) -> list[dict]:
    """``{"label", "probability"}`` (or ``{"score"}`` for one output) of each input: one text,
    or a pair's two."""
    device = next(model.parameters()).device
    out = []
    for start in range(0, len(inputs), batch_size):
        columns = list(zip(*inputs[start : start + batch_size]))
        enc = tokenizer(
            *columns, truncation=True, max_length=max_length, padding=True, return_tensors="pt"
        ).to(device)
        logits = model(**enc).logits.float()
        if logits.shape[-1] == 1:
            out += [{"score": s} for s in logits[:, 0].tolist()]
            continue
        probs = logits.softmax(-1)
        best = probs.argmax(-1)
        out += [
            {"label": model.config.id2label[int(c)], "probability": float(probs[i, c])}
            for i, c in enumerate(best)
        ]
    return out


@torch.no_grad()
def tag(model, tokenizer, texts: list[str], max_length: int, batch_size: int = 32) -> list[dict]:
    """``{"words", "tags"}`` of each text, its words split at spaces, each word tagged by its
    first subword (a long text in windows, as it was evaluated); a model of entity tags adds
    its ``entities`` (type, text, character offsets into the words joined by spaces)."""
    from mlmkit.finetune.entities import is_bio
    from mlmkit.finetune.task import pad_batch
    from mlmkit.finetune.tokens import (
        decode_words,
        entity_spans,
        sentence_windows,
        word_tokenizer,
    )

    tokenizer = word_tokenizer(tokenizer)  # as the model was trained (a model saved so: itself)
    sentences = [text.split() for text in texts]
    features = sentence_windows(sentences, tokenizer, max_length)
    names = list(tokenizer.model_input_names)
    device = next(model.parameters()).device
    outputs = []
    for start in range(0, len(features), batch_size):
        batch = pad_batch(
            features[start : start + batch_size], names, {"input_ids": tokenizer.pad_token_id}
        )
        outputs += list(model(**{k: v.to(device) for k, v in batch.items()}).logits.float().cpu())
    labels = [model.config.id2label[i] for i in range(len(model.config.id2label))]
    tags = decode_words(outputs, features, [len(s) for s in sentences], labels)
    entities = is_bio(labels)
    return [
        {"words": words, "tags": t, **({"entities": entity_spans(words, t)} if entities else {})}
        for words, t in zip(sentences, tags)
    ]


@torch.no_grad()
def answer(
    model, tokenizer, pairs: list[list[str]], task: dict, batch_size: int = 32
) -> list[dict]:
    """``{"answer", "start", "end", "null_margin"}`` of each ``[question, context]``: the best
    span of the context over its windows (character offsets into it), or "" where "no answer"
    wins (a v2.0 model), decoded as the model was evaluated (``mlmkit.finetune.spans``)."""
    from mlmkit.config import TaskConfig
    from mlmkit.finetune.spans import best_spans, choose, question_windows
    from mlmkit.finetune.task import pad_batch

    cfg = TaskConfig(
        name="predict",
        kind="qa",
        train_file="-",
        eval_file="-",
        metrics=["f1"],
        **{
            k: task[k] for k in ("doc_stride", "max_question_length", "max_answer_length", "n_best")
        },
    )
    examples = [{"question": q.strip(), "context": c} for q, c in pairs]
    features = question_windows(examples, tokenizer, task["max_seq_length"], cfg, training=False)
    names = [k for k in tokenizer.model_input_names if k in features[0]]
    device = next(model.parameters()).device
    outputs = []
    for start in range(0, len(features), batch_size):
        batch = pad_batch(
            features[start : start + batch_size], names, {"input_ids": tokenizer.pad_token_id}
        )
        out = model(**{k: v.to(device) for k, v in batch.items()})
        outputs += list(torch.stack([out.start_logits, out.end_logits], -1).float().cpu())
    spans = best_spans(outputs, features, examples, cfg.n_best, cfg.max_answer_length)
    chosen = [
        choose(s, bool(task.get("v2")), float(task.get("null_threshold", 0.0))) for s in spans
    ]
    return [
        {
            "answer": c["text"],
            "start": c["start"] if c["text"] else None,
            "end": c["end"] if c["text"] else None,
            "null_margin": c["margin"],
        }
        for c in chosen
    ]
