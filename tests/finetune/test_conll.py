"""Word-tagged sentences from CoNLL and CoNLL-U files (``mlmkit.finetune.conll``)."""

from __future__ import annotations

import pytest
from conftest import shared_file
from helpers import task_config

from mlmkit.errors import ConfigError, DataError
from mlmkit.finetune.conll import read_sentences

CONLLU = """# sent_id = a-1
# text = Don't go.
1-2\tDon't\t_\t_\t_\t_\t_\t_\t_\t_
1\tDo\tdo\tAUX\tVBP\t_\t3\taux\t_\t_
2\tn't\tnot\tPART\tRB\t_\t3\tadvmod\t_\t_
3\tgo\tgo\tVERB\tVB\t_\t0\troot\t_\t_
3.1\tgone\tgo\tVERB\tVBN\t_\t_\t_\t_\t_
4\t.\t.\tPUNCT\t.\t_\t3\tpunct\t_\t_

# sent_id = a-2
1\tYes\tyes\tINTJ\tUH\t_\t0\troot\t_\t_
"""


def test_conll_sentences_end_at_empty_lines_and_lone_tabs(tmp_path):
    path = tmp_path / "a.conll"
    path.write_text(
        "-DOCSTART- -X- O O\n\nEU B-ORG\nrejects O\n\t\nJohn\tB-PER\nLennon\tI-PER\n\n\n"
        "Paris NNP B-NP B-LOC\n"
    )
    sentences = read_sentences(
        path, task_config("tokens", train_file="a.conll", eval_file="a.conll"), "task.train_file"
    )
    assert [s["words"] for s in sentences] == [["EU", "rejects"], ["John", "Lennon"], ["Paris"]]
    assert [s["tags"] for s in sentences] == [["B-ORG", "O"], ["B-PER", "I-PER"], ["B-LOC"]]
    assert [s["lines"] for s in sentences] == [[3, 4], [6, 7], [10]]  # the last column is the tag


def test_conllu_reads_upos_or_xpos_and_skips_comments_ranges_and_empty_nodes(tmp_path):
    path = tmp_path / "a.conllu"
    path.write_text(CONLLU)
    upos = read_sentences(path, task_config("pos", train_file="a.conllu"), "task.train_file")
    assert [s["words"] for s in upos] == [["Do", "n't", "go", "."], ["Yes"]]
    assert [s["tags"] for s in upos] == [["AUX", "PART", "VERB", "PUNCT"], ["INTJ"]]
    assert upos[0]["lines"] == [4, 5, 6, 8]
    xpos = read_sentences(
        path, task_config("pos", train_file="a.conllu", label_column="xpos"), "task.train_file"
    )
    assert xpos[0]["tags"] == ["VBP", "RB", "VB", "."]
    with pytest.raises(ConfigError, match=r"task.label_column='label' is no CoNLL-U tag column"):
        read_sentences(path, task_config("pos", label_column="label"), "task.train_file")


def test_bad_lines_and_files_are_one_sentence_naming_the_line(tmp_path):
    task = task_config("tokens", train_file="a.conll", eval_file="a.conll")
    path = tmp_path / "a.conll"
    path.write_text("EU\tB-ORG\nrejects\n")
    with pytest.raises(DataError, match=r"a.conll' line 2: 'rejects' has no tag column; write"):
        read_sentences(path, task, "task.train_file")
    path.write_text("\n\t\n")
    with pytest.raises(DataError, match=r"task.train_file: .*a.conll' holds no sentence"):
        read_sentences(path, task, "task.train_file")
    with pytest.raises(DataError, match=r"task.eval_file: .*b.conll' does not exist; set task"):
        read_sentences(tmp_path / "b.conll", task, "task.eval_file")
    cut = tmp_path / "c.conllu"
    cut.write_text(CONLLU.replace("3\tgo\tgo\tVERB\tVB\t_\t0\troot\t_\t_", "3\tgo\tgo\tVERB"))
    with pytest.raises(DataError, match=r"c.conllu' line 6: 4 tab-separated column\(s\) where"):
        read_sentences(cut, task_config("pos"), "task.train_file")


def test_the_shared_sets_read_as_their_readme_counts_them():
    wnut = shared_file("tokens/wnut17/train.conll").parent
    task = task_config("ner")
    counts = [
        len(read_sentences(wnut / f"{name}.conll", task, "task.train_file"))
        for name in ("train", "dev", "test")
    ]
    assert counts == [3394, 1009, 1287]
    ud = read_sentences(
        shared_file("tokens/ud-ewt/en_ewt-ud-dev.conllu"), task_config("pos"), "task.train_file"
    )
    assert len(ud) == 2001
    assert {t for s in ud for t in s["tags"]} >= {"NOUN", "VERB", "PUNCT", "PROPN", "ADP"}
