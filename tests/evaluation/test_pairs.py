"""mlmkit eval-pairs: pseudo-log-likelihoods (Salazar et al., 2020) against a reference that
masks one copy at a time, a model whose preferences are known (its head reduced to the output
bias), the reader of JSONL and TSV pair files and its errors, and the command on a tiny run."""

from __future__ import annotations

import json

import pytest
import torch
from runs import run_cli

from mlmkit.config import ModelConfig, PairsEvalConfig
from mlmkit.errors import ConfigError, DataError
from mlmkit.evaluation.pairs import pair_accuracy, pseudo_log_likelihoods, read_pairs, score_pairs
from mlmkit.model.architectures import parts_of
from mlmkit.model.bert import build_model

SENTENCES = [
    "The function returns the value.",
    "Hi",
    "The function returns the value.",  # scored once
    "A much longer sentence, with a good many more words in it than any of the others.",
    "Lists are sorted.",
]
ARCHITECTURES = {
    "bert": ModelConfig(
        num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128
    ),
    "modernbert": ModelConfig(
        architecture="modernbert",
        num_hidden_layers=2,
        hidden_size=64,
        num_attention_heads=4,
        intermediate_size=96,
        local_attention=16,
        global_attn_every_n_layers=2,
    ),
}


@pytest.fixture(scope="module")
def tokenizer(trained_run):
    """The tokenizer of the tiny trained run (a vocabulary of 1000 from Python's documentation)."""
    from mlmkit.data.tokenizer import load_tokenizer

    return load_tokenizer(str(trained_run / "final"))


def tiny_model(tokenizer, architecture: str = "bert"):
    torch.manual_seed(0)
    return build_model(ARCHITECTURES[architecture], tokenizer)


def reference_plls(model, tokenizer, sentences, max_length: int) -> list[float]:
    """Each sentence's pseudo-log-likelihood, one masked copy per forward pass of the whole
    masked-LM model, log-softmax over all its outputs."""
    model.eval()
    totals = []
    for sentence in sentences:
        enc = tokenizer(
            sentence, truncation=True, max_length=max_length, return_special_tokens_mask=True
        )
        total = 0.0
        for position, special in enumerate(enc["special_tokens_mask"]):
            if special:
                continue
            ids = torch.tensor([enc["input_ids"]])
            ids[0, position] = tokenizer.mask_token_id
            with torch.no_grad():
                logits = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits[
                    0, position
                ]
            total += torch.log_softmax(logits.float(), dim=-1)[enc["input_ids"][position]].item()
        totals.append(total)
    return totals


# ---- pseudo-log-likelihoods -------------------------------------------------------------------


@pytest.mark.parametrize("architecture", ["bert", "modernbert", "trained"])
def test_batched_scores_equal_one_masked_copy_at_a_time(tokenizer, trained_run, architecture):
    if architecture == "trained":
        from mlmkit.training.trained_model import load_model_and_tokenizer

        model = load_model_and_tokenizer(trained_run)[0]
    else:
        model = tiny_model(tokenizer, architecture)
    model.train()
    assert model.config.vocab_size > len(tokenizer)  # a padded vocabulary, as a run's
    lengths = [len(tokenizer(s)["input_ids"]) for s in SENTENCES]
    assert lengths[3] > 16 > lengths[0] > lengths[1]
    # 7 copies a pass: the copies of one sentence span passes, and a pass holds several sentences
    got = pseudo_log_likelihoods(model, tokenizer, SENTENCES, max_seq_length=16, batch_size=7)
    assert model.training  # left in the mode it came in (scored in eval mode, without dropout)
    expected = reference_plls(model, tokenizer, SENTENCES, max_length=16)  # the long one cut at 16
    assert got == pytest.approx(expected, abs=1e-4)
    assert got[0] == got[2] and all(s < 0 for s in got)
    assert pseudo_log_likelihoods(model, tokenizer, SENTENCES, batch_size=512)[:3] == pytest.approx(
        reference_plls(model, tokenizer, SENTENCES[:3], max_length=128), abs=1e-4
    )


def test_bf16_autocast_scores_near_the_fp32_ones(trained_run):
    """eval-pairs' precision=bf16 (auto on bf16 hardware): the fp32 weights under autocast,
    log-softmax in fp32; each sentence's score within 2% of the fp32 one, and not the same."""
    from mlmkit.training.trained_model import load_model_and_tokenizer

    model, tokenizer = load_model_and_tokenizer(trained_run)[:2]
    model = model.float()
    fp32 = pseudo_log_likelihoods(model, tokenizer, SENTENCES)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        bf16 = pseudo_log_likelihoods(model, tokenizer, SENTENCES)
    assert bf16 == pytest.approx(fp32, rel=0.02) and bf16 != fp32


def unigram_model(tokenizer, favoured: dict[str, float]):
    """A masked LM whose prediction ignores the context: the head's layer norm zeroed, its
    logits are the output bias, here 0 but for the tokens of ``favoured``."""
    model = tiny_model(tokenizer)
    with torch.no_grad():
        norm = model.cls.predictions.transform.LayerNorm
        norm.weight.zero_()
        norm.bias.zero_()
        bias = parts_of(model).output_bias(model)
        bias[: len(tokenizer)] = 0.0
        for word, value in favoured.items():
            bias[tokenizer.convert_tokens_to_ids(word)] = value
    return model, torch.log_softmax(bias[: len(tokenizer)].detach(), dim=-1)


def test_a_model_that_prefers_a_word_prefers_the_sentences_with_it(tokenizer):
    assert {"function", "method"} <= set(tokenizer.get_vocab())
    model, log_probs = unigram_model(tokenizer, {"function": 3.0, "method": -3.0})
    good, bad = "the function is called here .", "the method is called here ."
    plls = pseudo_log_likelihoods(model, tokenizer, [good, bad])
    for sentence, pll in zip([good, bad], plls):
        ids = tokenizer(sentence, add_special_tokens=False)["input_ids"]
        assert pll == pytest.approx(float(log_probs[ids].sum()), abs=1e-4)  # the unigram sum
    assert plls[0] > plls[1]
    pairs = [(good, bad)] * 3 + [(bad, good)] + [(good, good)]  # 3 right, 1 wrong, 1 tie
    assert score_pairs(model, tokenizer, pairs, batch_size=4) == {"accuracy": 3.5 / 5, "pairs": 5}


def test_swapping_the_sentences_of_every_pair_turns_a_into_one_minus_a(tokenizer):
    model = tiny_model(tokenizer)
    words = ["function", "method", "string", "file", "value", "list", "class", "number"]
    pairs = [
        (f"the {a} is near the {b} .", f"the {b} is near the {a} .")
        for a in words[:4]
        for b in words[4:]
    ]
    pairs.append(("a tie : the same sentence .", "a tie : the same sentence ."))
    forward = score_pairs(model, tokenizer, pairs)
    swapped = score_pairs(model, tokenizer, [(b, a) for a, b in pairs])
    assert forward["pairs"] == swapped["pairs"] == len(pairs)
    assert 0.0 < forward["accuracy"] < 1.0
    assert swapped["accuracy"] == pytest.approx(1.0 - forward["accuracy"])
    assert pair_accuracy([1.0, 2.0, 3.0], [0.0, 2.0, 4.0]) == pytest.approx(0.5)


# ---- reading the files ------------------------------------------------------------------------


def write_jsonl(path, pairs, good="sentence_good", bad="sentence_bad"):
    path.write_text("".join(json.dumps({good: g, bad: b, "UID": "x"}) + "\n" for g, b in pairs))
    return path


def write_tsv(path, pairs, header=("id", "good", "bad")):
    rows = ["\t".join(header)] + [f"{i}\t{g}\t{b}" for i, (g, b) in enumerate(pairs)]
    path.write_text("\n".join(rows) + "\n")
    return path


PAIRS = [
    ("Many girls were insulting themselves.", "Many girls were insulting herself."),
    ('He said "yes" to them.', 'He said "yes" to themselves.'),
]


def test_jsonl_and_tsv_files_are_read(tmp_path):
    path = write_jsonl(tmp_path / "blimp.jsonl", PAIRS)
    path.write_text(path.read_text() + "\n")  # a blank line is skipped
    assert read_pairs(path) == PAIRS
    assert (
        read_pairs(write_jsonl(tmp_path / "own.jsonl", PAIRS, "ok", "not_ok"), "ok", "not_ok")
        == PAIRS
    )
    # a quote is text, not a quoting character (csv.QUOTE_NONE)
    assert read_pairs(write_tsv(tmp_path / "pairs.tsv", PAIRS), "good", "bad") == PAIRS


@pytest.mark.parametrize(
    "case,message,error",
    [
        (
            "missing",
            r"files: '.*absent.jsonl' does not exist; set files=\[\.\.\.\] to JSONL or TSV",
            DataError,
        ),
        ("empty", r"files: '.*empty.jsonl' holds no pairs; write one pair a line", DataError),
        (
            "no field",
            r"'.*nofield.jsonl' line 2 has no 'sentence_bad' \(a JSON string\); set bad_field",
            DataError,
        ),
        (
            "no column",
            r"'.*nocolumn.tsv' has no column 'sentence_good' in its header line \(it has 'id', "
            r"'good', 'bad'\); set good_field",
            DataError,
        ),
        (
            "bad json",
            r"'.*broken.jsonl' line 1 is not valid JSON \(.*\); write one JSON object per line",
            DataError,
        ),
        (
            "short row",
            r"'.*short.tsv' line 4 has 2 tab-separated fields and its header 3",
            DataError,
        ),
        ("other type", r"files: '.*pairs.txt' is neither a .jsonl nor a .tsv file", ConfigError),
    ],
)
def test_unreadable_files_are_one_sentence_naming_the_file(tmp_path, case, message, error):
    if case == "missing":
        path = tmp_path / "absent.jsonl"
    elif case == "empty":
        path = tmp_path / "empty.jsonl"
        path.write_text("\n\n")
    elif case == "no field":
        path = write_jsonl(tmp_path / "nofield.jsonl", PAIRS)
        path.write_text(path.read_text().splitlines()[0] + '\n{"sentence_good": "A cat."}\n')
    elif case == "no column":
        path = write_tsv(tmp_path / "nocolumn.tsv", PAIRS)
    elif case == "bad json":
        path = tmp_path / "broken.jsonl"
        path.write_text('{"sentence_good": "A cat.", "sentence_bad": "A cats."\n')
    elif case == "short row":
        path = write_tsv(
            tmp_path / "short.tsv", PAIRS, header=("id", "sentence_good", "sentence_bad")
        )
        path.write_text(path.read_text() + "2\tonly one\n")
    else:
        path = tmp_path / "pairs.txt"
        path.write_text("a\tb\n")
    with pytest.raises(error, match=message) as caught:
        read_pairs(path)
    assert "\n" not in str(caught.value) and str(caught.value).endswith(".")


def test_eval_pairs_settings_are_checked():
    with pytest.raises(ConfigError, match="checkpoint="):
        PairsEvalConfig(files=["a.jsonl"])
    with pytest.raises(ConfigError, match=r"files=\[a.jsonl,b.tsv\]"):
        PairsEvalConfig(checkpoint="x")
    with pytest.raises(ConfigError, match="'a.csv' is neither a .jsonl nor a .tsv"):
        PairsEvalConfig(checkpoint="x", files=["a.csv"])
    with pytest.raises(ConfigError, match="more than once"):
        PairsEvalConfig(checkpoint="x", files=["a.jsonl", "a.jsonl"])
    with pytest.raises(ConfigError, match="two different fields"):
        PairsEvalConfig(checkpoint="x", files=["a.tsv"], good_field="s", bad_field="s")
    with pytest.raises(ConfigError, match="max_seq_length must be at least 8"):
        PairsEvalConfig(checkpoint="x", files=["a.tsv"], max_seq_length=4)
    with pytest.raises(ConfigError, match="batch_size must be at least 1"):
        PairsEvalConfig(checkpoint="x", files=["a.tsv"], batch_size=0)


# ---- the command ------------------------------------------------------------------------------


def run_eval_pairs(*overrides: str):
    return run_cli("eval-pairs", *overrides)


def test_eval_pairs_on_a_trained_run_and_random_weights(trained_run, tmp_path):
    from mlmkit.training.runtime import cpu_has_bf16

    agreement = [
        (f"The {n} {v}s here.", f"The {n} {v} here.")
        for n in ("man", "dog", "city")
        for v in ("stay", "work", "wait")
    ]
    anaphor = PAIRS + [("The boys saw themselves.", "The boys saw himself.")]
    jsonl = write_jsonl(tmp_path / "agreement.jsonl", agreement)
    tsv = write_tsv(
        tmp_path / "anaphor.tsv", anaphor, header=("id", "sentence_good", "sentence_bad")
    )
    for init, precision in (("pretrained", "no"), ("random", "bf16")):
        out = tmp_path / f"{init}.json"
        proc = run_eval_pairs(
            f"checkpoint={trained_run}",
            f"files=[{jsonl},{tsv}]",
            f"init={init}",
            f"output={out}",
            "batch_size=64",
            f"precision={precision}",
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        result = json.loads(out.read_text())
        assert set(result) == {
            "checkpoint",
            "init",
            "files",
            "accuracy",
            "pairs",
            "precision",
            "seconds",
        }
        assert result["precision"] == precision
        assert (result["checkpoint"], result["init"]) == (str(trained_run / "final"), init)
        assert {name: f["pairs"] for name, f in result["files"].items()} == {
            str(jsonl): 9,
            str(tsv): 3,
        }
        assert result["pairs"] == 12
        accuracies = [f["accuracy"] for f in result["files"].values()]
        assert all(0.0 <= a <= 1.0 for a in accuracies)
        assert result["accuracy"] == pytest.approx(sum(accuracies) / 2)  # the mean over files
        lines = proc.stdout.strip().splitlines()
        if precision == "bf16" and not cpu_has_bf16():  # said once, naming the setting
            warning = lines.pop(0)
            assert (
                warning.startswith("bf16 emulated on this CPU")
                and "set precision=auto or no" in warning
            )
        assert len(lines) == 3, proc.stdout  # a line per file, and the summary
        assert lines[0] == f"{jsonl}: accuracy {accuracies[0]:.4f} over 9 pairs"
        assert lines[2].endswith(f"accuracy {result['accuracy']:.4f} over 12 pairs in 2 files")


def test_eval_pairs_errors_and_help(trained_run, tmp_path):
    proc = run_eval_pairs(f"checkpoint={trained_run}", f"files=[{tmp_path / 'absent.jsonl'}]")
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith("Error: ") and "Traceback" not in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "absent.jsonl" in proc.stderr
    if not torch.cuda.is_available():  # fp16 autocast is a GPU's
        pairs = write_jsonl(tmp_path / "pairs.jsonl", PAIRS)
        proc = run_eval_pairs(f"checkpoint={trained_run}", f"files=[{pairs}]", "precision=fp16")
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
        assert (
            proc.stderr.strip()
            == "Error: precision=fp16 needs a CUDA GPU; use bf16 or no on this machine."
        )
    with pytest.raises(ConfigError, match="precision"):
        PairsEvalConfig(checkpoint="x", files=["a.tsv"], precision="fp8")
    shown = run_eval_pairs("--help")
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "good_field=sentence_good" in shown.stdout and "files=[]" in shown.stdout
