"""flash-attn on batches the loader flattened (model.documents): one row of real tokens with the
cumulative lengths computed on the host, the same loss as the padded batch, and no layer waiting
for the GPU. Skipped (with the reason) without a CUDA GPU and the flash-attn package: the
flattening itself is checked on a CPU (tests/model/test_documents.py, tests/data/test_loader.py)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from batches import SMALL, _ragged

from mlmkit.config import ModelConfig
from mlmkit.data.loader import TrainingCollate, to_device
from mlmkit.masking.collator import MLMCollator
from mlmkit.model.bert import MaskedLM, build_model
from mlmkit.training.doctor import HostReads

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or importlib.util.find_spec("flash_attn") is None,
        reason="needs a CUDA GPU and the flash-attn package",
    ),
]

MODERN = ModelConfig(
    architecture="modernbert",
    num_hidden_layers=3,
    hidden_size=64,
    num_attention_heads=4,
    intermediate_size=96,
    local_attention=16,
    global_attn_every_n_layers=3,
    max_position_embeddings=512,
)
LENGTHS = (40, 97, 130, 61, 12, 128)


def _seeded(rows):
    """Each row masked from its own seed, so that both collations draw the same masks."""
    return [{**row, "mask_seed": i} for i, row in enumerate(rows)]


def _model(tokenizer, config, attn):
    torch.manual_seed(0)
    return build_model(config, tokenizer, attn_implementation=attn).cuda()


def _step(objective, batch):
    """Forward and backward in bf16 autocast; (loss sum, host waits counted)."""
    with HostReads("cuda") as reads:
        reads.counting = True
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = objective(**batch)["loss_sum"]
        loss.backward()
        reads.counting = False
    return loss.detach().float(), reads.count


@pytest.mark.parametrize("config", [ModelConfig(**SMALL), MODERN], ids=["bert", "modernbert"])
def test_a_flattened_batch_runs_flash_attn_varlen_without_waiting_for_the_host(tokenizer, config):
    """The padded batch through SDPA against the batch the loader flattened, through flash-attn's
    variable-length kernel: the same loss in bf16; the padded batch through flash-attn
    (transformers' own unpadding: ``mask.all()``, ``nonzero`` and ``max().item()`` in every layer)
    waits for the host in every layer, the flattened one at most once a forward (transformers from
    5.2x probes BERT's position ids for packed sequences when it builds the mask; 5.17 does
    not)."""
    collator = MLMCollator(tokenizer, mlm_probability=0.3, seed=0)
    rows = _seeded(_ragged(tokenizer, lengths=LENGTHS))
    padded = to_device(TrainingCollate(collator)(rows), torch.device("cuda"))
    flat = to_device(TrainingCollate(collator, varlen=True)(rows), torch.device("cuda"))
    padded.pop("layout"), flat.pop("layout")
    assert flat["input_ids"].shape == (1, sum(n + 2 for n in LENGTHS)) and isinstance(
        flat["max_length_q"], int
    )
    sdpa_loss, _ = _step(MaskedLM(_model(tokenizer, config, "sdpa")), padded)
    flash = MaskedLM(_model(tokenizer, config, "flash_attention_2"))
    flash_loss, flat_waits = _step(flash, flat)
    _, padded_waits = _step(flash, padded)
    torch.testing.assert_close(flash_loss, sdpa_loss, rtol=2e-2, atol=1e-1)
    assert flat_waits <= 1, flat_waits
    assert padded_waits >= config.num_hidden_layers, padded_waits


@pytest.mark.parametrize("config", [ModelConfig(**SMALL), MODERN], ids=["bert", "modernbert"])
def test_flattened_documents_run_flash_attn_as_isolated_blocks(tokenizer, config):
    """Blocks of documents, flattened on the host one sequence a document, give through flash-attn
    the loss of the blocks with document isolation through SDPA's block-diagonal mask."""
    from batches import _packed

    sep = tokenizer.sep_token_id
    rows = _seeded(_packed(tokenizer, n=4, length=128))
    for row in rows:  # three documents a block
        row["input_ids"][40] = row["input_ids"][90] = sep
    collator = MLMCollator(tokenizer, mlm_probability=0.3, seed=0)
    blocks = to_device(TrainingCollate(collator, sep_id=sep)(rows), torch.device("cuda"))
    flat = to_device(TrainingCollate(collator, sep_id=sep, varlen=True)(rows), torch.device("cuda"))
    blocks.pop("layout"), flat.pop("layout")
    assert flat["cu_seq_lens_q"].numel() == 4 * 3 + 1
    isolated, _ = _step(MaskedLM(_model(tokenizer, config, "sdpa"), document_sep_id=sep), blocks)
    flash, waits = _step(MaskedLM(_model(tokenizer, config, "flash_attention_2")), flat)
    torch.testing.assert_close(flash, isolated, rtol=2e-2, atol=1e-1)
    assert waits <= 1, waits
