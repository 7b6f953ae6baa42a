"""Sequence classification (or regression) over the mean of the token states
(``finetune pooling=mean``).

BERT classifies from the last layer's ``[CLS]`` state, which its pretraining trained
through next-sentence prediction. Pretraining with masked-token prediction alone (as
mlmkit, RoBERTa and cramming do) never puts a loss on ``[CLS]``: in a briefly pretrained
model its state is nearly the same vector for every input, and a classifier must first
undo that. Averaging the token states, padding excluded, reads what pretraining did
train (Reimers & Gurevych (2019), 'Sentence-BERT', found mean pooling the better
sentence vector; ModernBERT offers it as ``classifier_pooling="mean"``).

The model keeps ``BertForSequenceClassification``'s weights and names (the pooler's
dense + tanh, dropout and the classifier), so the two poolings differ only in which
vector reaches the pooler; the saved config records ``classifier_pooling: mean``. Load a
saved model with ``MeanPoolBertForSequenceClassification.from_pretrained(dir)``, or any
classifier mlmkit fine-tuned with ``mlmkit.evaluation.predict.load_classifier(dir)``, which
picks the class from the config (transformers' ``AutoModelForSequenceClassification`` and
``pipeline`` would pool [CLS]).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import BertForSequenceClassification
from transformers.modeling_outputs import SequenceClassifierOutput


def masked_mean(hidden: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
    """Mean over the sequence of ``hidden`` (batch, seq, h) at the positions the mask keeps."""
    if attention_mask is None:
        return hidden.mean(1)
    keep = attention_mask.unsqueeze(-1).to(hidden.dtype)
    return (hidden * keep).sum(1) / keep.sum(1).clamp(min=1.0)


class MeanPoolBertForSequenceClassification(BertForSequenceClassification):
    """``BertForSequenceClassification`` that pools the mean of the token states, not [CLS]."""

    def __init__(self, config) -> None:
        config.classifier_pooling = "mean"
        super().__init__(config)

    def forward(
        self, input_ids=None, attention_mask=None, token_type_ids=None, labels=None, **kwargs
    ) -> SequenceClassifierOutput:
        hidden = self.bert(
            input_ids=input_ids,
            attention_mask=attention_mask,
            token_type_ids=token_type_ids,
            **kwargs,
        ).last_hidden_state
        pooler = self.bert.pooler
        pooled = pooler.activation(pooler.dense(masked_mean(hidden, attention_mask)))
        logits = self.classifier(self.dropout(pooled))
        loss = None if labels is None else sequence_loss(logits, labels, self.num_labels)
        return SequenceClassifierOutput(loss=loss, logits=logits)


def sequence_loss(logits: torch.Tensor, labels: torch.Tensor, num_labels: int) -> torch.Tensor:
    """Cross-entropy over ``num_labels`` classes, or for one output (a regression task such
    as STS-B's similarity score) the mean squared error, as ``BertForSequenceClassification``."""
    if num_labels == 1:
        return F.mse_loss(logits.float().view(-1), labels.float().view(-1))
    return F.cross_entropy(logits.float().view(-1, num_labels), labels.view(-1))
