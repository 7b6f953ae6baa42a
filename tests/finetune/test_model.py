"""The fine-tuned model's parts (``mlmkit.finetune.model``): linear probing freezes the
encoder and computes its states once per distinct input."""

from __future__ import annotations

import pytest
import torch

from mlmkit.finetune.model import FrozenEncoderCache, freeze_encoder

# a BERT of a few thousand weights, for the classifiers' own tests
SMALL_BERT = dict(
    vocab_size=100, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32
)


def test_freeze_encoder_trains_only_the_pooler_and_classifier():
    from transformers import BertConfig

    from mlmkit.model.classifier import MeanPoolBertForSequenceClassification

    model = MeanPoolBertForSequenceClassification(BertConfig(**SMALL_BERT))
    freeze_encoder(model)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == {
        "bert.pooler.dense.weight",
        "bert.pooler.dense.bias",
        "classifier.weight",
        "classifier.bias",
    }
    before = model.bert.encoder.layer[0].output.dense.weight.clone()
    out = model(input_ids=torch.randint(5, 100, (4, 8)), labels=torch.tensor([0, 1, 0, 1]))
    out.loss.backward()
    assert model.bert.encoder.layer[0].output.dense.weight.grad is None
    assert torch.equal(model.bert.encoder.layer[0].output.dense.weight, before)


def _frozen_classifiers(kind: str):
    """Two identical classifiers (BERT mean or [CLS] pooling, ModernBERT) with frozen encoders
    (the encoder's dropout on, the classifier's off: the two draw from one generator)."""
    if kind == "modernbert":
        from transformers import ModernBertConfig, ModernBertForSequenceClassification

        def make():
            return ModernBertForSequenceClassification(
                ModernBertConfig(
                    vocab_size=100,
                    hidden_size=16,
                    num_hidden_layers=2,
                    num_attention_heads=2,
                    intermediate_size=32,
                    pad_token_id=0,
                    classifier_pooling="mean",
                    local_attention=4,
                    attn_implementation="sdpa",
                )
            )
    else:
        from transformers import BertConfig, BertForSequenceClassification

        from mlmkit.model.classifier import MeanPoolBertForSequenceClassification

        cls = (
            MeanPoolBertForSequenceClassification
            if kind == "bert-mean"
            else BertForSequenceClassification
        )

        def make():
            return cls(BertConfig(**SMALL_BERT, hidden_dropout_prob=0.2, classifier_dropout=0.0))

    models = []
    for _ in range(2):
        torch.manual_seed(0)
        models.append(make())
        freeze_encoder(models[-1])
    return models


@pytest.mark.parametrize("kind", ["bert-mean", "bert-cls", "modernbert"])
def test_a_frozen_encoder_runs_once_per_row_and_trains_the_same_head(kind):
    """Linear probing caches the frozen encoder's states: the head trains as it does when the
    encoder runs every step (in eval mode: no dropout in a frozen encoder), and the encoder
    runs only for rows it has not seen, whatever the batch and its padding."""
    plain, cached = _frozen_classifiers(kind)
    plain.base_model.eval()  # what the cache computes: the frozen encoder without dropout
    cache = FrozenEncoderCache(cached)
    calls = []
    inner = cache.forward
    cache.forward = lambda **kw: calls.append(kw["input_ids"].shape[0]) or inner(**kw)
    g = torch.Generator().manual_seed(0)
    rows = [torch.randint(5, 100, (n,), generator=g) for n in (3, 7, 5, 8, 4, 6)]
    labels = torch.tensor([0, 1, 0, 1, 1, 0])
    opts = [
        torch.optim.SGD([p for p in m.parameters() if p.requires_grad], lr=0.5)
        for m in (plain, cached)
    ]
    for _epoch in range(3):
        order = torch.randperm(6, generator=g).tolist()
        for batch in (order[:4], order[4:]):  # other batches, other padding, every epoch
            width = max(len(rows[i]) for i in batch)
            ids = torch.zeros(len(batch), width, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for j, i in enumerate(batch):
                ids[j, : len(rows[i])], mask[j, : len(rows[i])] = rows[i], 1
            for model, opt in zip((plain, cached), opts):
                loss = model(input_ids=ids, attention_mask=mask, labels=labels[batch]).loss
                loss.backward()
                opt.step()
                opt.zero_grad()
    assert sum(calls) == 6  # each row encoded once
    for (name, a), b in zip(plain.named_parameters(), cached.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    assert any(
        not torch.equal(a, b)
        for a, b in zip(plain.parameters(), _frozen_classifiers(kind)[0].parameters())
    )
    cache.close()
    assert "forward" not in vars(cached.base_model) and not cache.states  # its own forward again


def _mlm(kind: str):
    """A tiny masked-LM model of ``kind`` (bert | modernbert), as a checkpoint holds it."""
    if kind == "modernbert":
        from transformers import ModernBertConfig, ModernBertForMaskedLM

        return ModernBertForMaskedLM(
            ModernBertConfig(
                vocab_size=100, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=32, pad_token_id=0, local_attention=4, max_position_embeddings=64,
            )
        )  # fmt: skip
    from transformers import BertConfig, BertForMaskedLM

    return BertForMaskedLM(BertConfig(**SMALL_BERT, max_position_embeddings=64))


@pytest.mark.parametrize("arch", ["bert", "modernbert"])
@pytest.mark.parametrize("kind", ["tokens", "qa"])
def test_token_and_span_heads_sit_on_the_checkpoint_s_encoder(arch, kind):
    """task.kind=tokens builds ...ForTokenClassification and qa ...ForQuestionAnswering of the
    checkpoint's architecture, its encoder (and ModernBERT's head) copied, the rest seeded: the
    same for init=random, which keeps its own encoder."""
    from mlmkit.config import FinetuneConfig, TaskConfig
    from mlmkit.finetune.loop import task_of
    from mlmkit.finetune.model import build_model

    torch.manual_seed(1)
    mlm = _mlm(arch)
    labels = ["O", "B-x", "I-x"] if kind == "tokens" else []
    files = {"train_file": "a", "eval_file": "b", "hub_path": None}
    metrics = ["f1"] if kind == "tokens" else ["f1", "exact"]
    task_cfg = TaskConfig(name=kind, kind=kind, labels=labels, metrics=metrics, **files)
    models = {}
    for init in ("pretrained", "random"):
        cfg = FinetuneConfig(checkpoint="x", init=init, task=task_cfg, max_seq_length=32)
        models[init] = build_model(cfg, task_of(task_cfg), mlm)
    model = models["pretrained"]
    head = "TokenClassification" if kind == "tokens" else "QuestionAnswering"
    prefix = "ModernBert" if arch == "modernbert" else "Bert"
    assert type(model).__name__ == f"{prefix}For{head}"
    encoder = "model" if arch == "modernbert" else "bert"
    for name, tensor in getattr(mlm, encoder).state_dict().items():
        assert torch.equal(getattr(model, encoder).state_dict()[name], tensor), name
        assert not torch.equal(getattr(models["random"], encoder).state_dict()[name], tensor) or (
            tensor.abs().sum() == 0 or "norm" in name or "LayerNorm" in name
        ), name
    head_name = "qa_outputs" if (kind, arch) == ("qa", "bert") else "classifier"
    layer, other = getattr(model, head_name), getattr(models["random"], head_name)
    assert torch.equal(layer.weight, other.weight)  # the head's seeded init: the same in both
    assert layer.out_features == (3 if kind == "tokens" else 2)
    ids = torch.randint(5, 100, (2, 10))
    targets = (
        {"labels": torch.randint(0, 3, (2, 10))}
        if kind == "tokens"
        else {"start_positions": torch.tensor([1, 0]), "end_positions": torch.tensor([3, 0])}
    )
    loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), **targets).loss
    loss.backward()
    assert torch.isfinite(loss) and getattr(model, encoder).embeddings is not None
