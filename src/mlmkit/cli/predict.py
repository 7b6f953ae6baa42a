"""Classify, tag or answer with a fine-tuned model: the label and its probability (for a
regression model the score) of each input, (a token classifier) each word's tag, or (a question
answerer) the answer to each question on its context, one line each, in the order given.

    mlmkit predict outputs/finetune/files/<date>/<time>/model "a text" "another text"
    mlmkit predict <model dir> --file in.txt            one text per line (a pair: tab-separated)
    mlmkit predict <model dir> --file in.jsonl --json   .jsonl/.csv/.tsv: the model's text columns
    mlmkit predict outputs/finetune/ner/<date>/<time> "Maria flew to Kyoto"   word/TAG ...
    mlmkit predict outputs/finetune/qa/<date>/<time> "Who flew?" "Maria flew to Kyoto."

The model dir is the ``model/`` that ``mlmkit finetune`` writes (or the finetune run dir). A
pair model takes its texts two by two, a question answerer its question and context; a token
classifier's words are split at spaces (--json adds its entities, or the answer's, character
offsets). The class that loads it comes from its config
(``mlmkit.evaluation.predict``), so a mean-pooled BERT pools as it was trained.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from mlmkit.cli.errors import ArgumentParser
from mlmkit.errors import ConfigError, DataError


def main(argv: list[str] | None = None) -> int:
    parser = ArgumentParser(prog="mlmkit predict", description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "model_dir", help="the model/ dir of an mlmkit finetune run (or the run dir)"
    )
    parser.add_argument("texts", nargs="*", help="texts to classify (a pair model: two by two)")
    parser.add_argument(
        "--file", type=Path, help="a .txt file (one input per line), or .jsonl/.csv/.tsv"
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--batch-size", type=int, default=32, help="inputs per forward pass (32)")
    args = parser.parse_args(argv)
    if args.batch_size < 1:
        raise ConfigError(f"--batch-size must be at least 1, got {args.batch_size}.")
    if not args.texts and args.file is None:
        raise ConfigError(
            "Give the texts to classify, or --file <file>; see mlmkit predict --help."
        )
    import torch
    from transformers.utils import logging as transformers_logging

    from mlmkit.evaluation.predict import group_texts, load_classifier, predict, read_inputs
    from mlmkit.model.architectures import parts_of

    # stdout and stderr carry the results and errors only
    transformers_logging.disable_progress_bar()
    model, tokenizer, task = load_classifier(args.model_dir)
    kind = task.get("kind", "classification")
    columns = {"tokens": ["text"], "qa": ["question", "context"]}.get(
        kind, list(task.get("text_columns") or ["text"])
    )
    inputs = group_texts(args.texts, columns) + (
        read_inputs(args.file, columns) if args.file else []
    )
    if not inputs:
        raise DataError(f"--file: {str(args.file)!r} holds no text to classify.")
    if torch.cuda.is_available():
        model.cuda()
    max_length = int(
        task.get("max_seq_length")
        or min(tokenizer.model_max_length, parts_of(model).positions(model.config))
    )
    if kind == "tokens":
        from mlmkit.evaluation.predict import tag

        results = tag(model, tokenizer, [t[0] for t in inputs], max_length, args.batch_size)
    elif kind == "qa":
        from mlmkit.evaluation.predict import answer

        results = answer(model, tokenizer, inputs, {**task, "max_seq_length": max_length})
    else:
        results = predict(model, tokenizer, inputs, max_length, args.batch_size)
    for texts, result in zip(inputs, results, strict=True):
        print_result(texts, result, args.json)
    sys.stdout.flush()
    return 0


def print_result(texts: list[str], result: dict, as_json: bool) -> None:
    """One line: a JSON object, or the label, probability (or score, or word/TAG) and texts."""
    if as_json:
        print(
            json.dumps(
                {"text": texts if len(texts) > 1 else texts[0], **result}, ensure_ascii=False
            )
        )
    elif "tags" in result:
        print(" ".join(f"{w}/{t}" for w, t in zip(result["words"], result["tags"])))
    elif "answer" in result:
        print((result["answer"] or "(no answer)") + "\t" + texts[0])
    elif "score" in result:
        print(f"{result['score']:.4f}\t" + "\t".join(texts))
    else:
        print(f"{result['label']}\t{result['probability']:.4f}\t" + "\t".join(texts))
