"""data.packing=documents: attention stays within each document of a packed block."""

from __future__ import annotations

import pytest
import torch

from mlmkit.config import ModelConfig
from mlmkit.masking.collator import IGNORE_INDEX
from mlmkit.model.bert import MaskedLM, build_model
from mlmkit.model.documents import block_diagonal_mask, document_layout

BERT = ModelConfig(
    num_hidden_layers=2, hidden_size=64, num_attention_heads=4, intermediate_size=128
)
# a sliding window (2 tokens each side) shorter than the documents, so the local layers' own
# mask is exercised together with the documents'
MODERNBERT = ModelConfig(
    architecture="modernbert",
    num_hidden_layers=3,
    hidden_size=64,
    num_attention_heads=4,
    intermediate_size=96,
    local_attention=4,
    global_attn_every_n_layers=3,
    max_position_embeddings=512,
)
SEP = 3


def test_layout_of_a_block():
    ids = torch.tensor(
        [[2, 10, 11, SEP, 12, 13, 14, SEP, 15, SEP]]
    )  # [CLS] a b [SEP] c d e [SEP] f [SEP]
    document, positions = document_layout(ids, SEP)
    assert document.tolist() == [[0, 0, 0, 0, 1, 1, 1, 1, 2, 2]]
    assert positions.tolist() == [[0, 1, 2, 3, 0, 1, 2, 3, 0, 1]]
    mask = block_diagonal_mask(document)[0, 0]
    assert mask[1, 2] and mask[4, 7] and not mask[3, 4] and not mask[8, 0]
    assert mask.sum().item() == 4 * 4 + 4 * 4 + 2 * 2


def _block(tokenizer, lengths, seed):
    """[CLS] doc1 [SEP] doc2 [SEP] ... with random word ids, and the span of each document."""
    g = torch.Generator().manual_seed(seed)
    ids, spans = [tokenizer.cls_token_id], []
    for n in lengths:
        start = len(ids)
        ids += torch.randint(10, len(tokenizer), (n,), generator=g).tolist() + [
            tokenizer.sep_token_id
        ]
        spans.append((start, len(ids)))
    return torch.tensor([ids]), spans


def _logits(objective, ids):
    """Full-vocabulary logits at every position, (seq, vocab)."""
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[:, 1:] = ids[:, 1:]  # every position but [CLS] predicted: the sparse head covers all
    out = objective.eval()(input_ids=ids, labels=labels)  # eval mode: the objective returns logits
    return out["logits"][: ids.size(1) - 1]


@pytest.mark.parametrize(
    "preset,attn",
    [(BERT, "sdpa"), (BERT, "eager"), (MODERNBERT, "sdpa")],
    ids=["bert", "bert-eager", "modernbert"],
)
def test_changing_one_document_leaves_the_others_unchanged(tokenizer, preset, attn):
    torch.manual_seed(0)
    model = build_model(preset, tokenizer, attn_implementation=attn).eval()
    isolated = MaskedLM(model, document_sep_id=tokenizer.sep_token_id)
    shared = MaskedLM(model)  # plain concatenate: attention across documents
    ids, spans = _block(tokenizer, [9, 12, 7], seed=1)
    other = ids.clone()
    (a, b) = spans[1]
    other[0, a : b - 1] = _block(tokenizer, [b - 1 - a], seed=2)[0][
        0, 1:-1
    ]  # doc 2 rewritten, same length
    assert not torch.equal(ids, other)
    kept = torch.cat([torch.arange(1, spans[0][1]), torch.arange(*spans[2])]) - 1  # docs 1 and 3
    with torch.no_grad():
        before, after = _logits(isolated, ids), _logits(isolated, other)
        torch.testing.assert_close(before[kept], after[kept], rtol=1e-5, atol=1e-5)
        changed = torch.arange(a, b) - 1
        assert (
            before[changed] - after[changed]
        ).abs().max() > 1e-2  # doc 2's own logits did change
        # without isolation the same change reaches the other documents
        assert (_logits(shared, ids)[kept] - _logits(shared, other)[kept]).abs().max() > 1e-3


@pytest.mark.parametrize("preset", [BERT, MODERNBERT], ids=["bert", "modernbert"])
def test_a_document_reads_as_if_it_were_alone(tokenizer, preset):
    """Positions restart at each document: doc 2 of a block gives the logits it gives as the
    whole input (its ids and [SEP], positions from 0), for BERT's learned positions and
    ModernBERT's rotary ones and sliding window alike."""
    torch.manual_seed(0)
    model = build_model(preset, tokenizer).eval()
    isolated = MaskedLM(model, document_sep_id=tokenizer.sep_token_id)
    ids, spans = _block(tokenizer, [5, 11, 6], seed=3)
    a, b = spans[1]
    alone = ids[:, a:b]
    with torch.no_grad():
        in_block = isolated.parts.encoder(model)(**_inputs(isolated, ids)).last_hidden_state[0, a:b]
        by_itself = isolated.parts.encoder(model)(input_ids=alone).last_hidden_state[0]
    torch.testing.assert_close(in_block, by_itself, rtol=1e-4, atol=1e-4)


def _inputs(objective, ids):
    from mlmkit.model.documents import document_inputs

    return document_inputs(objective.model, ids, objective.document_sep_id)


def test_isolated_training_step_has_gradients_and_no_nans(tokenizer):
    from mlmkit.masking.collator import MLMCollator

    torch.manual_seed(0)
    model = build_model(BERT, tokenizer)
    objective = MaskedLM(model, document_sep_id=tokenizer.sep_token_id)
    rows = [{"input_ids": _block(tokenizer, [6, 20, 3], seed=s)[0][0]} for s in range(4)]
    batch = MLMCollator(tokenizer, mlm_probability=0.3, seed=0)(rows)
    out = objective(**batch)
    loss = out["loss_sum"] / out["n_tokens"]
    loss.backward()
    assert torch.isfinite(loss)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU and flash-attn")
@pytest.mark.parametrize("preset", [BERT, MODERNBERT], ids=["bert", "modernbert"])
def test_varlen_flash_attention_matches_the_block_diagonal_mask(tokenizer, preset):
    pytest.importorskip("flash_attn", reason="flash-attn is not installed")
    torch.manual_seed(0)
    model = build_model(preset, tokenizer).cuda().to(torch.bfloat16).eval()
    rows = torch.cat([_block(tokenizer, [30, 50, 45], seed=s)[0] for s in range(3)]).cuda()
    labels = rows.clone()
    results = {}
    for attn in ("sdpa", "flash_attention_2"):
        model.set_attn_implementation(attn)
        with torch.no_grad():
            out = MaskedLM(model, document_sep_id=tokenizer.sep_token_id).eval()(
                input_ids=rows, labels=labels
            )
        results[attn] = out["logits"].float()
    torch.testing.assert_close(results["sdpa"], results["flash_attention_2"], rtol=0.05, atol=0.1)


@pytest.mark.parametrize("config", [BERT, MODERNBERT], ids=["bert", "modernbert"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_padded_batches_build_their_masks_without_a_host_read(tokenizer, config, attn):
    """A padded batch: MaskedLM builds the key-padding mask (and ModernBERT's window) itself, so
    transformers does not ask ``mask.all()`` (a wait for the device) on every forward; the states
    and the loss are those of transformers' own masks."""
    from batches import _ragged
    from host_reads import NoHostReads

    from mlmkit.masking.collator import MLMCollator
    from mlmkit.model.bert import prediction_positions

    torch.manual_seed(0)
    model = build_model(config, tokenizer, attn_implementation=attn).eval()
    batch = MLMCollator(tokenizer, mlm_probability=0.3, seed=0)(
        _ragged(tokenizer, lengths=(9, 20, 31, 14))
    )
    assert not batch["attention_mask"].all()
    batch["positions"], batch["targets"] = prediction_positions(batch["labels"])
    objective = MaskedLM(model)
    objective.train()  # the training step's forward: no logits returned
    with torch.no_grad():
        with NoHostReads():
            ours = objective(**batch)["loss_sum"]
        encoder = objective.parts.encoder(model)
        hidden = encoder(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]
        ).last_hidden_state
        hidden = hidden.reshape(-1, hidden.size(-1)).index_select(0, batch["positions"])
        from mlmkit.model.kernels import cross_entropy_sum

        theirs = cross_entropy_sum(objective.parts.head(model, hidden), batch["targets"])
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-4)


# -- a batch the loader flattened for flash-attn's variable-length kernel --------------------------


def _flattened(batch, sep_id=None):
    """``batch`` laid out and flattened as the training loader does for flash-attn."""
    from mlmkit.model.bert import prediction_positions
    from mlmkit.model.documents import flatten_rows, sequence_lengths, varlen_layout

    flat = {k: v.clone() for k, v in batch.items() if k not in ("positions", "targets")}
    mask = flat.get("attention_mask")
    flat.update(varlen_layout(mask, sequence_lengths(flat["input_ids"], mask, sep_id)))
    flatten_rows(flat)
    flat["positions"], flat["targets"] = prediction_positions(flat["labels"])
    return flat


def test_the_layout_by_hand():
    from mlmkit.model.documents import flatten_rows, sequence_lengths, varlen_layout

    ids = torch.tensor([[2, 10, 11, SEP, 0, 0], [2, 12, SEP, 0, 0, 0], [2, 13, SEP, 14, 15, SEP]])
    mask = (ids != 0).long()
    lengths = sequence_lengths(ids, mask)
    assert lengths.tolist() == [4, 3, 6]
    layout = varlen_layout(mask, lengths)
    assert layout["flat_index"].tolist() == [0, 1, 2, 3, 6, 7, 8, 12, 13, 14, 15, 16, 17]
    assert layout["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3, 4, 5]]
    assert layout["cu_seq_lens_q"].tolist() == [0, 4, 7, 13] and layout["max_length_q"] == 6
    labels = torch.full_like(ids, IGNORE_INDEX)
    labels[0, 1], labels[2, 4] = 10, 15
    flat = flatten_rows({"input_ids": ids, "labels": labels, "attention_mask": mask, **layout})
    assert flat["input_ids"].tolist() == [[2, 10, 11, SEP, 2, 12, SEP, 2, 13, SEP, 14, 15, SEP]]
    assert flat["labels"][0].tolist().index(10) == 1 and flat["labels"][0].tolist().index(15) == 11
    # documents isolated: the third row holds two
    documents = varlen_layout(mask, sequence_lengths(ids, mask, SEP))
    assert (
        documents["cu_seq_lens_q"].tolist() == [0, 4, 7, 10, 13] and documents["max_length_q"] == 4
    )
    assert documents["position_ids"].tolist() == [[0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 0, 1, 2]]


@pytest.mark.parametrize("preset", [BERT, MODERNBERT], ids=["bert", "modernbert"])
def test_a_flattened_padded_batch_gives_the_padded_batchs_loss(tokenizer, preset):
    """The flattened batch, its sequences kept apart by the block-diagonal mask (SDPA, as
    ``varlen_inputs`` builds it where flash-attn is absent), gives the loss and the gradients of
    the padded batch through SDPA's padding mask: positions, labels and chosen positions follow
    the flattening. The forward reads nothing on the host."""
    from batches import _ragged
    from host_reads import NoHostReads

    from mlmkit.masking.collator import MLMCollator
    from mlmkit.model.bert import prediction_positions

    torch.manual_seed(0)
    model = build_model(preset, tokenizer, attn_implementation="sdpa")
    padded = MLMCollator(tokenizer, mlm_probability=0.3, seed=0)(
        _ragged(tokenizer, lengths=(9, 20, 31, 14))
    )
    padded["positions"], padded["targets"] = prediction_positions(padded["labels"])
    flat = _flattened(padded)
    assert flat["input_ids"].shape == (1, 11 + 22 + 33 + 16)
    objective = MaskedLM(model)
    losses, grads = [], []
    for batch in (padded, flat):
        model.zero_grad()
        with NoHostReads():
            loss = objective(**batch)["loss_sum"]
        loss.backward()
        losses.append(loss.detach())
        grads.append(model.get_input_embeddings().weight.grad.clone())
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("preset", [BERT, MODERNBERT], ids=["bert", "modernbert"])
def test_flattened_documents_give_the_isolated_blocks_loss(tokenizer, preset):
    """Blocks of documents: one row of documents, positions restarting at each, gives the loss of
    the blocks with document isolation (``document_inputs``' block-diagonal mask)."""
    from mlmkit.masking.collator import MLMCollator
    from mlmkit.model.bert import prediction_positions

    torch.manual_seed(0)
    model = build_model(preset, tokenizer, attn_implementation="sdpa").eval()
    rows = [{"input_ids": _block(tokenizer, [6, 20, 3], seed=s)[0][0]} for s in range(3)]
    blocks = MLMCollator(tokenizer, mlm_probability=0.3, seed=0)(rows)
    del blocks["attention_mask"]  # packed: no padding
    blocks["positions"], blocks["targets"] = prediction_positions(blocks["labels"])
    flat = _flattened(blocks, tokenizer.sep_token_id)
    assert flat["cu_seq_lens_q"].tolist() == [0, 8, 29, 33, 41, 62, 66, 74, 95, 99]
    with torch.no_grad():  # eval mode: the chosen positions' logits too
        isolated = MaskedLM(model, document_sep_id=tokenizer.sep_token_id).eval()(**blocks)
        flattened = MaskedLM(model).eval()(**flat)
        shared = MaskedLM(model).eval()(**blocks)  # attention across the documents
    torch.testing.assert_close(flattened["loss_sum"], isolated["loss_sum"], rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(flattened["logits"], isolated["logits"], rtol=1e-4, atol=1e-4)
    assert (shared["logits"] - isolated["logits"]).abs().max() > 1e-3
