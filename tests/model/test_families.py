"""Every encoder family mlmkit continues, at a tiny size from a released-model folder: its
masking with its own tokenizer, the sparse head's loss against the full head's, documents of a
packed block isolated, and its parts in the registry."""

from __future__ import annotations

import pytest
import torch
from families import FAMILY_TOKENIZERS, released_model

from mlmkit.masking.collator import IGNORE_INDEX, MLMCollator, continuation_lookup
from mlmkit.model.architectures import MODEL_TYPES, architecture, parts_of
from mlmkit.model.bert import MaskedLM, encoder_inputs, load_pretrained

TYPES = list(FAMILY_TOKENIZERS)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """``model_type -> its released folder``, built on first use."""
    made: dict[str, object] = {}
    root = tmp_path_factory.mktemp("released")

    def folder(model_type: str):
        if model_type not in made:
            made[model_type] = released_model(root / model_type, model_type)
        return made[model_type]

    return folder


def loaded(folders, model_type: str):
    from transformers import AutoTokenizer

    folder = folders(model_type)
    return load_pretrained(str(folder)), AutoTokenizer.from_pretrained(str(folder))


def test_every_model_type_has_parts_and_transformers_classes():
    import transformers

    for model_type in MODEL_TYPES:
        parts = architecture(model_type)
        for name in (parts.masked_lm, parts.sequence_classification, parts.token_classification):
            assert hasattr(transformers, name), (model_type, name)
    assert architecture("xlm-roberta").masked_lm == "XLMRobertaForMaskedLM"
    assert architecture("xlm-roberta").layer_class == "XLMRobertaLayer"
    assert architecture("distilbert").layer_class == "TransformerBlock"


@pytest.mark.parametrize("model_type", TYPES)
def test_the_family_loads_as_its_own_class_with_its_parts(folders, model_type):
    model, tokenizer = loaded(folders, model_type)
    parts = parts_of(model)
    assert type(model).__name__ == parts.masked_lm
    assert len(parts.layers(model)) >= 1
    assert type(parts.layers(model)[0]).__name__ == parts.layer_class
    # the output bias is the head's: moving it moves the logits of that token only
    hidden = torch.randn(3, model.config.hidden_size)
    before = parts.head(model, hidden)
    assert before.shape == (3, model.config.vocab_size)
    with torch.no_grad():
        parts.output_bias(model)[5] += 1.0
    delta = parts.head(model, hidden) - before
    assert torch.allclose(delta[:, 5], torch.ones(3)) and delta[:, :5].abs().max() < 1e-6
    expected = "eager" if model_type == "deberta-v2" else "sdpa"
    assert model.config._attn_implementation == expected


@pytest.mark.parametrize("model_type", TYPES)
def test_sparse_head_loss_and_gradients_equal_the_full_heads(folders, model_type):
    model, tokenizer = loaded(folders, model_type)
    model.eval()  # no dropout: both passes see the same network
    ids = tokenizer(["the quick brown fox jumps over the lazy dog"] * 2, return_tensors="pt")
    batch = MLMCollator(tokenizer, mlm_probability=0.4, seed=0)(
        [{"input_ids": row.tolist()} for row in ids["input_ids"]]
    )
    losses, grads = [], []
    for sparse in (True, False):
        objective = MaskedLM(model, sparse_prediction=sparse)
        model.zero_grad()
        out = objective(batch["input_ids"], batch["labels"])
        (out["loss_sum"] / out["n_tokens"]).backward()
        losses.append(float(out["loss_sum"].detach()))
        grads.append(parts_of(model).embeddings(model).word_embeddings.weight.grad.clone())
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


@pytest.mark.parametrize("model_type", ["roberta", "xlm-roberta", "deberta-v2", "albert"])
def test_80_10_10_masking_with_the_familys_own_mask_token(folders, model_type):
    _, tokenizer = loaded(folders, model_type)
    text = "rivers run to the sea and the sea returns the rain to the hills " * 40
    row = tokenizer(text, truncation=True, max_length=256)["input_ids"]
    batch = MLMCollator(tokenizer, mlm_probability=0.15, seed=1)([{"input_ids": row}] * 64)
    original = torch.tensor([row] * 64)
    chosen = batch["labels"] != IGNORE_INDEX
    special = torch.isin(original, torch.tensor(tokenizer.all_special_ids))
    assert not (chosen & special).any()  # <s>, </s>, [CLS], [SEP] never chosen
    share = chosen.sum() / (~special).sum()
    assert abs(float(share) - 0.15) < 0.02
    masked = (batch["input_ids"] == tokenizer.mask_token_id) & chosen
    assert abs(float(masked.sum() / chosen.sum()) - 0.8) < 0.04
    assert tokenizer.convert_ids_to_tokens(tokenizer.mask_token_id) == tokenizer.mask_token


@pytest.mark.parametrize(
    "model_type, mark", [("roberta", "Ġ"), ("xlm-roberta", "▁"), ("deberta-v2", "▁")]
)
def test_whole_word_masking_reads_the_tokenizers_own_word_starts(folders, model_type, mark):
    _, tokenizer = loaded(folders, model_type)
    lookup = continuation_lookup(tokenizer, len(tokenizer))
    words = "unbelievably transformational reconsideration of the hills"
    ids = tokenizer(words, add_special_tokens=False)["input_ids"]
    tokens = tokenizer.convert_ids_to_tokens(ids)
    # a piece continues a word unless it carries the mark (the text's first word has none in a
    # byte-level BPE, and no piece before it to continue)
    for n, (token, i) in enumerate(zip(tokens, ids)):
        if n:
            assert bool(lookup[i]) == (not token.startswith(mark)), (token, bool(lookup[i]))
    assert sum(bool(lookup[i]) for i in ids) >= 3  # the long words are split into pieces
    collator = MLMCollator(
        tokenizer, mlm_probability=0.3, seed=0, strategy="whole_word", max_word_tokens=32
    )
    batch = collator([{"input_ids": [tokenizer.cls_token_id, *ids, tokenizer.sep_token_id]}] * 32)
    chosen = (batch["labels"] != IGNORE_INDEX)[:, 1:-1]
    starts = torch.tensor([n == 0 or not bool(lookup[i]) for n, i in enumerate(ids)])
    word = starts.cumsum(0) - 1
    for row in chosen:  # every word is chosen whole or not at all
        for w in word.unique():
            picked = row[word == w]
            assert picked.all() or not picked.any()


@pytest.mark.parametrize("model_type", [t for t in TYPES if t != "deberta-v2"])
def test_a_document_of_a_packed_block_reads_as_if_alone(folders, model_type):
    """data.packing=documents: the second document's states in a packed block equal its states
    alone (positions restart at the family's first position: RoBERTa's padding_idx + 1).
    DeBERTa is refused (tests/e2e/test_continue_families.py)."""
    model, tokenizer = loaded(folders, model_type)
    model.eval()
    first = tokenizer("the lazy dog sleeps", add_special_tokens=False)["input_ids"]
    second = tokenizer("rivers run to the sea", add_special_tokens=False)["input_ids"]
    sep, cls = tokenizer.sep_token_id, tokenizer.cls_token_id
    block = torch.tensor([[cls, *first, sep, *second, sep]])
    alone = torch.tensor([[*second, sep]])
    encoder = parts_of(model).encoder(model)
    with torch.no_grad():
        packed = encoder(**encoder_inputs(model, block, None, sep, {})).last_hidden_state
        inputs = {"input_ids": alone}
        if parts_of(model).position_offset_of(model.config) == 0:
            inputs["position_ids"] = torch.arange(alone.size(1))[None]
        single = encoder(**inputs).last_hidden_state
    tail = packed[0, -alone.size(1) :]
    assert torch.allclose(tail, single[0], atol=1e-5), (tail - single[0]).abs().max()
    # without isolation the same tokens see the first document: their states differ
    with torch.no_grad():
        mixed = encoder(input_ids=block).last_hidden_state[0, -alone.size(1) :]
    assert not torch.allclose(mixed, single[0], atol=1e-3)


def test_roberta_positions_start_after_the_padding_index(folders):
    model, _ = loaded(folders, "roberta")
    parts = parts_of(model)
    assert parts.position_offset_of(model.config) == model.config.pad_token_id + 1
    assert parts.positions(model.config) == model.config.max_position_embeddings - (
        model.config.pad_token_id + 1
    )
