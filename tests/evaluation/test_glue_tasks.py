"""conf/task/: every GLUE task reads GLUE's own files (and the Hub's copy) into the right
texts and class ids; the f1 metric that MRPC and QQP report."""

from __future__ import annotations

import pytest
from runs import ROOT

from mlmkit.config import TaskConfig
from mlmkit.errors import DataError
from mlmkit.finetune.metric_modules import load_metric
from mlmkit.finetune.reader import load_task
from mlmkit.finetune.sequence import score

BOM = "\ufeff"  # GLUE's MRPC files start with a UTF-8 byte-order mark (see MRPC below)


def _task(name: str, **settings) -> TaskConfig:
    """conf/task/<name>.yaml with ``settings``."""
    from omegaconf import OmegaConf

    preset = OmegaConf.load(ROOT / "conf" / "task" / f"{name}.yaml")
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(TaskConfig), preset, settings))


def _tsv(header: str | None, *rows: tuple[str, ...]) -> str:
    """A TSV file's text as GLUE writes it: the header line (if any), then each row's fields
    joined by tabs, nothing quoted."""
    lines = ([header] if header is not None else []) + ["\t".join(row) for row in rows]
    return "".join(f"{line}\n" for line in lines)


STSB_HEADER = "\t".join(
    [
        "index",
        "genre",
        "filename",
        "year",
        "old_index",
        "source1",
        "source2",
        "sentence1",
        "sentence2",
        "score",
    ]
)
MNLI_COLUMNS = [
    "index",
    "promptID",
    "pairID",
    "genre",
    "sentence1_binary_parse",
    "sentence2_binary_parse",
    "sentence1_parse",
    "sentence2_parse",
    "sentence1",
    "sentence2",
    "label1",
]
MNLI_TRAIN_HEADER = "\t".join([*MNLI_COLUMNS, "gold_label"])  # 12 columns
MNLI_DEV_HEADER = "\t".join([*MNLI_COLUMNS, "label2", "label3", "label4", "label5", "gold_label"])


def _mnli_train(index: int, genre: str, premise: str, hypothesis: str, gold: str) -> tuple:
    """A 12-column row of MNLI's train.tsv: parses, the pair, one annotator's label, the gold."""
    return (
        str(index),
        f"{index}31",
        f"{index}31{gold[0]}",
        genre,
        "( The ( plan ( was approved ) ) )",
        "( ( The plan ) failed )",
        "(ROOT (S (NP (DT The) (NN plan)) (VP (VBD failed))))",
        "(ROOT (S (`` \") (NP (PRP I)) ('' \")))",
        premise,
        hypothesis,
        gold,
        gold,
    )


def _mnli_dev(
    index: int, genre: str, premise: str, hypothesis: str, votes: list[str], gold: str
) -> tuple:
    """A 16-column row of MNLI's dev files: five annotators' labels, then the gold label."""
    return (
        str(index),
        f"{index}00",
        f"{index}00e",
        genre,
        "( a b )",
        "( c d )",
        "(ROOT (S (NN a)))",
        "(ROOT (S (NN c)))",
        premise,
        hypothesis,
        *votes,
        gold,
    )


MNLI_TRAIN = _tsv(
    MNLI_TRAIN_HEADER,
    _mnli_train(
        0,
        "government",
        "The plan was approved by the board.",
        "The plan failed to win approval.",
        "contradiction",
    ),
    _mnli_train(
        1, "telephone", 'I said "yes" when she asked me.', "I agreed when asked.", "entailment"
    ),
    _mnli_train(2, "fiction", "He left the party early.", "He was tired.", "neutral"),
)
MRPC_HEADER = "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String"
QQP_HEADER = "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate"
PAIR_HEADER = "index\tsentence1\tsentence2\tlabel"  # RTE's and WNLI's
WINOGRAD = (
    "John couldn't see the stage with Billy in front of him because he is so short.",
    "Billy is so short.",
)
CARROT = (
    "I stuck a pin through a carrot. When I pulled the pin out, it had a hole.",
    "The carrot had a hole.",
)

# Each task: its files, and the (texts, label) of the train and dev examples they must give.
GLUE = {
    "cola": (
        {  # no header: source, label, the original author's mark, sentence
            "train.tsv": _tsv(
                None,
                ("gj04", "1", "", "Our friends won't buy this analysis."),
                ("gj04", "0", "*", 'The "more we study verbs, the crazier they get.'),
                ("clc95", "1", "", "They drank the pub dry."),
            ),
            "dev.tsv": _tsv(
                None,
                ("bc01", "0", "*", "The more does Bill smoke, the more he coughs."),
                ("bc01", "1", "", '"Go," Bill said and left.'),
            ),
        },
        [
            (["Our friends won't buy this analysis."], 1),
            (['The "more we study verbs, the crazier they get.'], 0),
            (["They drank the pub dry."], 1),
        ],
        [
            (["The more does Bill smoke, the more he coughs."], 0),
            (['"Go," Bill said and left.'], 1),
        ],
    ),
    "sst2": (
        {  # sentence, label (GLUE's sentences are tokenized and end in a space)
            "train.tsv": _tsv(
                "sentence\tlabel",
                ("hide new secretions from the parental units ", "0"),
                ('" the best film of the year " , says nobody ', "0"),
                ("it 's a charming and often affecting journey . ", "1"),
            ),
            "dev.tsv": _tsv("sentence\tlabel", ('a "gorgeous" , witty , seductive movie . ', "1")),
        },
        [
            (["hide new secretions from the parental units"], 0),
            (['" the best film of the year " , says nobody'], 0),
            (["it 's a charming and often affecting journey ."], 1),
        ],
        [(['a "gorgeous" , witty , seductive movie .'], 1)],
    ),
    "mrpc": (
        {  # the header line keeps msr_paraphrase_train.txt's byte-order mark
            "train.tsv": BOM
            + _tsv(
                MRPC_HEADER,
                (
                    "1",
                    "702876",
                    "702977",
                    '" We won\'t sell , " he said .',
                    'He said " we won\'t sell . "',
                ),
                (
                    "0",
                    "2108705",
                    "2108831",
                    "Yucaipa owned Dominick 's in 1995 .",
                    "Yucaipa bought a chain .",
                ),
            ),
            "dev.tsv": BOM
            + _tsv(
                MRPC_HEADER,
                (
                    "1",
                    "1355540",
                    "1355592",
                    "The shares rose 5 % .",
                    "The stock climbed 5 percent .",
                ),
            ),
        },
        [
            (['" We won\'t sell , " he said .', 'He said " we won\'t sell . "'], 1),
            (["Yucaipa owned Dominick 's in 1995 .", "Yucaipa bought a chain ."], 0),
        ],
        [(["The shares rose 5 % .", "The stock climbed 5 percent ."], 1)],
    ),
    "qqp": (
        {
            "train.tsv": _tsv(
                QQP_HEADER,
                (
                    "133273",
                    "213221",
                    "213222",
                    'What does "carpe diem" mean?',
                    "What is the meaning of carpe diem?",
                    "1",
                ),
                (
                    "402555",
                    "536040",
                    "536041",
                    "How do I learn Python?",
                    "What is the capital of Peru?",
                    "0",
                ),
            ),
            "dev.tsv": _tsv(
                QQP_HEADER,
                (
                    "201359",
                    "303345",
                    "303346",
                    'Why are "smart" phones so expensive?',
                    "How do I fix my phone?",
                    "0",
                ),
            ),
        },
        [
            (['What does "carpe diem" mean?', "What is the meaning of carpe diem?"], 1),
            (["How do I learn Python?", "What is the capital of Peru?"], 0),
        ],
        [(['Why are "smart" phones so expensive?', "How do I fix my phone?"], 0)],
    ),
    "mnli": (
        {
            "train.tsv": MNLI_TRAIN,
            "dev_matched.tsv": _tsv(
                MNLI_DEV_HEADER,
                _mnli_dev(
                    0,
                    "slate",
                    'The new "rights" are nice enough.',
                    "Everyone really likes the rights.",
                    ["neutral", "entailment", "neutral", "neutral", "neutral"],
                    "neutral",
                ),
            ),
            "dev_mismatched.tsv": _tsv(
                MNLI_DEV_HEADER,
                _mnli_dev(
                    0,
                    "letters",
                    "Your gift is appreciated.",
                    "Your gift is not welcome.",
                    ["contradiction"] * 5,
                    "contradiction",
                ),
            ),
        },
        [
            (["The plan was approved by the board.", "The plan failed to win approval."], 2),
            (['I said "yes" when she asked me.', "I agreed when asked."], 0),
            (["He left the party early.", "He was tired."], 1),
        ],
        [(['The new "rights" are nice enough.', "Everyone really likes the rights."], 1)],
    ),
    "qnli": (
        {
            "train.tsv": _tsv(
                "index\tquestion\tsentence\tlabel",
                ("0", "When was the bridge built?", "The bridge was built in 1932.", "entailment"),
                (
                    "1",
                    'Who wrote "Hamlet"?',
                    '"Hamlet" is often staged in London.',
                    "not_entailment",
                ),
            ),
            "dev.tsv": _tsv(
                "index\tquestion\tsentence\tlabel",
                (
                    "0",
                    "What is the capital of France?",
                    "Paris is the capital of France.",
                    "entailment",
                ),
            ),
        },
        [
            (["When was the bridge built?", "The bridge was built in 1932."], 0),
            (['Who wrote "Hamlet"?', '"Hamlet" is often staged in London.'], 1),
        ],
        [(["What is the capital of France?", "Paris is the capital of France."], 0)],
    ),
    "rte": (
        {
            "train.tsv": _tsv(
                PAIR_HEADER,
                (
                    "0",
                    'The "Iron Lady" led Britain for 11 years.',
                    "Britain had a leader.",
                    "entailment",
                ),
                ("1", "The storm hit the coast.", "No storm hit the coast.", "not_entailment"),
            ),
            "dev.tsv": _tsv(
                PAIR_HEADER,
                ("0", "Dana Reeve died of lung cancer.", "Dana Reeve was ill.", "entailment"),
            ),
        },
        [
            (['The "Iron Lady" led Britain for 11 years.', "Britain had a leader."], 0),
            (["The storm hit the coast.", "No storm hit the coast."], 1),
        ],
        [(["Dana Reeve died of lung cancer.", "Dana Reeve was ill."], 0)],
    ),
    "wnli": (
        {
            "train.tsv": _tsv(PAIR_HEADER, ("0", CARROT[0], CARROT[1], "1"), ("1", *WINOGRAD, "0")),
            "dev.tsv": _tsv(
                PAIR_HEADER, ("0", 'The sign said "closed", so we left.', "We left.", "1")
            ),
        },
        [(list(CARROT), 1), (list(WINOGRAD), 0)],
        [(['The sign said "closed", so we left.', "We left."], 1)],
    ),
}
GLUE["mnli_mm"] = (
    GLUE["mnli"][0],
    GLUE["mnli"][1],
    [(["Your gift is appreciated.", "Your gift is not welcome."], 2)],
)


def _write(folder, files: dict[str, str]) -> None:
    folder.mkdir()
    for name, text in files.items():
        (folder / name).write_text(text, encoding="utf-8")


def _pairs(examples):
    return [(e["text"], e["label"]) for e in examples]


@pytest.mark.parametrize("name", sorted(GLUE))
def test_glue_files_give_the_texts_and_class_ids(tmp_path, name):
    files, train, dev = GLUE[name]
    _write(tmp_path / name, files)
    got_train, got_dev = load_task(_task(name, data_dir=str(tmp_path / name)))
    assert _pairs(got_train) == train and len(got_train) == len(train)
    assert _pairs(got_dev) == dev and len(got_dev) == len(dev)


STSB_ROWS = [
    (
        "0",
        "main-captions",
        "MSRvid",
        "2012test",
        "0001",
        "none",
        "none",
        "A plane is taking off.",
        "An air plane is taking off.",
        "5.000",
    ),
    (
        "1",
        "main-news",
        "headlines",
        "2015",
        "0002",
        "none",
        "none",
        'The man said "no".',
        "A woman is dancing.",
        "0.250",
    ),
]


@pytest.mark.parametrize("header", [True, False], ids=["glue_header", "no_header"])
def test_stsb_reads_its_files_with_or_without_the_header_line(tmp_path, header):
    _write(
        tmp_path / "STS-B",
        {
            "train.tsv": _tsv(STSB_HEADER if header else None, *STSB_ROWS),
            "dev.tsv": _tsv(STSB_HEADER if header else None, STSB_ROWS[1]),
        },
    )
    train, dev = load_task(_task("stsb", data_dir=str(tmp_path / "STS-B")))
    assert _pairs(train) == [
        (["A plane is taking off.", "An air plane is taking off."], 5.0),
        (['The man said "no".', "A woman is dancing."], 0.25),
    ]
    assert _pairs(dev) == [(['The man said "no".', "A woman is dancing."], 0.25)]


def test_a_label_outside_the_classes_names_the_file_and_line(tmp_path):
    # MultiNLI gives a pair without a majority label the gold label "-" (Williams et al., 2018);
    # GLUE's MNLI files leave such pairs out, and a task refuses one
    split_vote = ["neutral", "entailment", "neutral", "entailment", "contradiction"]
    dev = _tsv(
        MNLI_DEV_HEADER,
        _mnli_dev(0, "slate", "A b.", "C d.", ["neutral"] * 5, "neutral"),
        _mnli_dev(1, "slate", "E f.", "G h.", split_vote, "-"),
    )
    _write(tmp_path / "MNLI", {"train.tsv": MNLI_TRAIN, "dev_matched.tsv": dev})
    with pytest.raises(
        DataError,
        match=r"dev_matched\.tsv' line 3: the gold_label '-' is not one "
        r"of task\.labels \(entailment, neutral, contradiction\)",
    ):
        load_task(_task("mnli", data_dir=str(tmp_path / "MNLI")))


# nyu-mll/glue on the Hub: each task's text columns and the names of its integer labels (its
# loading script's GlueConfig text_features and label_classes; STS-B's label is a float score).
HUB = {
    "cola": (["sentence"], ["unacceptable", "acceptable"]),
    "sst2": (["sentence"], ["negative", "positive"]),
    "mrpc": (["sentence1", "sentence2"], ["not_equivalent", "equivalent"]),
    "qqp": (["question1", "question2"], ["not_duplicate", "duplicate"]),
    "stsb": (["sentence1", "sentence2"], None),
    "mnli": (["premise", "hypothesis"], ["entailment", "neutral", "contradiction"]),
    "mnli_mm": (["premise", "hypothesis"], ["entailment", "neutral", "contradiction"]),
    "qnli": (["question", "sentence"], ["entailment", "not_entailment"]),
    "rte": (["sentence1", "sentence2"], ["entailment", "not_entailment"]),
    "wnli": (["sentence1", "sentence2"], ["not_entailment", "entailment"]),
}


@pytest.mark.parametrize("name", sorted(HUB))
def test_class_ids_are_the_hubs_integer_labels(name):
    """A file's label and the Hub's integer label give the same class id: the task's labels
    are the Hub's class names in order, or, where GLUE's files write the Hub's integers
    (0 / 1), those integers in order."""
    task, names = _task(name), HUB[name][1]
    assert task.hub_path == "nyu-mll/glue" and task.hub_name == name.removesuffix("_mm")
    if names is None:
        assert task.kind == "regression" and task.labels == []
    elif task.labels[0].isdigit():
        assert task.labels == [str(i) for i in range(len(names))]
    else:
        assert task.labels == names


@pytest.mark.parametrize("name", sorted(HUB))
def test_hub_rows_give_the_texts_and_class_ids(monkeypatch, name):
    """The Hub's copy names its columns apart from GLUE's files (MRPC's ``#1 String`` is
    ``sentence1``, every label ``label``): a task reads both."""
    import datasets

    texts, names = HUB[name]
    task = _task(name)
    label = datasets.ClassLabel(names=names) if names else datasets.Value("float32")
    features = datasets.Features(
        {
            **{c: datasets.Value("string") for c in texts},
            "label": label,
            "idx": datasets.Value("int32"),
        }
    )
    values = [1, 0, -1] if names else [4.5, 1.0, 2.0]  # -1: an unlabelled row, as in test splits
    text = {c: [f'{c} {i} "q"' for i in range(3)] for c in texts}
    rows = {**text, "label": values, "idx": [0, 1, 2]}
    split = datasets.Dataset.from_dict(rows, features=features)
    calls = []

    def load_dataset(path, config_name):
        calls.append((path, config_name))
        return datasets.DatasetDict({"train": split, task.hub_eval_split: split.select([1])})

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    train, dev = load_task(task)
    assert calls == [("nyu-mll/glue", name.removesuffix("_mm"))]
    # the texts in the Hub's column order; the unlabelled row (-1) left out, a score always kept
    expected = [([text[c][i] for c in texts], values[i]) for i in range(3 if names is None else 2)]
    assert _pairs(train) == expected
    assert _pairs(dev) == [expected[1]]


def test_f1_is_the_f1_of_class_1():
    f1 = load_metric("f1")
    # TP 2 (positions 0, 4), FP 1 (1), FN 1 (3): precision 2/3, recall 2/3
    got = f1.compute(predictions=[1, 1, 0, 0, 1], references=[1, 0, 0, 1, 1])
    assert got == {"f1": pytest.approx(2 / 3)}
    # TP 1, FP 0, FN 2: precision 1, recall 1/3, F1 = 2 * 1/3 / (4/3) = 1/2
    assert f1.compute(predictions=[0, 1, 0, 0], references=[1, 1, 0, 1])["f1"] == pytest.approx(0.5)
    # nothing predicted 1 (precision 0 / 0): no error, F1 0
    assert f1.compute(predictions=[0, 0, 0], references=[1, 0, 1]) == {"f1": 0.0}
    assert f1.compute(predictions=[0, 0], references=[0, 0]) == {"f1": 0.0}  # no positive at all


def test_mrpc_and_qqp_report_f1_then_accuracy():
    for name in ("mrpc", "qqp"):
        figures = score(_task(name), [1, 1, 0, 0, 1], [1, 0, 0, 1, 1])
        assert list(figures) == ["f1", "accuracy"]  # the first is the headline
        assert figures["f1"] == pytest.approx(2 / 3) and figures["accuracy"] == pytest.approx(3 / 5)
