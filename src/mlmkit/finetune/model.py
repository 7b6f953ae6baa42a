"""The fine-tuned model: the task's head (an ``AutoModelFor...`` class of the checkpoint's
architecture) on the checkpoint's encoder, and linear probing (the encoder frozen, its states
computed once per distinct input).

The head starts from a seeded random init, the same one for ``init=random``, so the two
differ only by pretraining: BERT's encoder ``.bert`` (and, for a sequence classifier, a new
pooler), ModernBERT's encoder ``.model`` and its MLM head's dense + norm ``.head``, RoBERTa's
``.roberta``, ... (``shared_with_classifier`` in ``mlmkit.model.architectures``). The head is
everything outside the encoder (``model.base_model``) and the encoder's pooler: what trains
with the encoder frozen, and what a continued fine-tuning keeps.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from mlmkit.config import FinetuneConfig, TaskConfig
from mlmkit.errors import ConfigError, DataError
from mlmkit.model.architectures import parts_of
from mlmkit.model.bert import family_attention

log = logging.getLogger("mlmkit")


def build_model(cfg: FinetuneConfig, task, mlm):
    """Return the task's model for ``cfg`` on the encoder of the masked-LM model ``mlm`` (or
    the same architecture from its seeded init, ``init=random``); its config names the labels
    and records the task (``mlmkit_task``, which ``mlmkit predict`` reads)."""
    config = mlm.config.__class__.from_dict(mlm.config.to_dict())
    task.configure(config, cfg)
    config.classifier_dropout = cfg.classifier_dropout
    arch = parts_of(mlm)  # the head of the same family
    config._attn_implementation = family_attention(arch, "sdpa")  # DeBERTa's: eager
    torch.manual_seed(cfg.seed)  # the head's init: the same for both inits
    model = task.head(arch, config, cfg)
    if cfg.init == "pretrained":
        for name in arch.shared_with_classifier:
            missing, unexpected = getattr(model, name).load_state_dict(
                getattr(mlm, name).state_dict(), strict=False
            )
            assert not unexpected and all(k.startswith("pooler.") for k in missing), (
                missing,
                unexpected,
            )
    if cfg.max_seq_length > arch.positions(config):
        raise ConfigError(
            f"max_seq_length ({cfg.max_seq_length}) is longer than the model's "
            f"{arch.positions(config)} positions; lower max_seq_length."
        )
    return model


def continues(task: TaskConfig, mlm, source) -> bool:
    """Whether the checkpoint is a model fine-tuned on this task (its config's ``mlmkit_task``
    names the same task and kind), which the run continues, head and all. Its labels are the
    run's: taken where task.labels is empty, and a different list is an error, since the head's
    outputs are those labels in that order."""
    prior = getattr(mlm.config, "mlmkit_task", None) or {}
    if prior.get("name") != task.name or prior.get("kind") != task.kind:
        return False
    if task.kind in ("tokens", "classification"):
        id2label = {int(k): v for k, v in mlm.config.id2label.items()}
        labels = [id2label[i] for i in range(len(id2label))]
        if not task.labels:
            task.labels = labels
        elif list(task.labels) != labels:
            raise DataError(
                f"checkpoint={str(source)!r} was fine-tuned on task={task.name} with the labels "
                f"[{','.join(labels)}], and task.labels are [{','.join(task.labels)}]: its head "
                f"predicts its own labels, in its order; set task.labels=[{','.join(labels)}] "
                "(or leave it empty), or fine-tune from the pretrained model (its run's final/) "
                "for a new head."
            )
    log.info(
        "Continuing the fine-tuning of %s on %s: its head and labels are kept", source, task.name
    )
    return True


def load_head(model, source: Path) -> None:
    """Load the weights of the fine-tuned model dir ``source``: its head, and the encoder's pooler
    (a masked-LM model has none; its encoder is the one ``build_model`` took)."""
    from safetensors.torch import load_file

    state = load_file(str(Path(source) / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected, unexpected


def is_head(model, name: str) -> bool:
    """Whether the parameter ``name`` is the head's: outside the encoder (``model.base_model``:
    a pooler, a classification layer, ModernBERT's head), or the encoder's pooler (BERT's)."""
    return not name.startswith(f"{model.base_model_prefix}.") or ".pooler." in f".{name}"


def freeze_encoder(model) -> None:
    """Linear probing: only the head (``is_head``: the pooler and the classification layers)
    keeps training."""
    trainable, modules = 0, set()
    for name, p in model.named_parameters():
        keep = is_head(model, name)
        p.requires_grad_(keep)
        if keep:
            trainable += p.numel()
            modules.add(name.rsplit(".", 2)[0] if ".pooler." in f".{name}" else name.split(".")[0])
    log.info(
        "freeze_encoder: the encoder is frozen; %d parameters train (%s)",
        trainable,
        ", ".join(sorted(modules)),
    )


class FrozenEncoderCache:
    """With the encoder frozen (linear probing) its states are the same every epoch: the
    classifier's encoder (``model.base_model``) runs once per distinct input row, without
    dropout, and later batches read its token states back. The trainable parts still run on
    every step: the pooler of BERT and ALBERT (which sits in the encoder module) and every layer
    after it.
    Memory: the token states of every distinct row (rows x tokens x hidden)."""

    def __init__(self, model) -> None:
        self.encoder = model.base_model
        self.forward = self.encoder.forward  # the module's own forward, restored by close()
        self.states: dict[bytes, torch.Tensor] = {}
        self.encoder.forward = self  # nn.Module.__call__ looks forward up on the instance first

    def __call__(self, input_ids=None, attention_mask=None, **kwargs):
        from transformers.modeling_outputs import BaseModelOutputWithPooling

        if attention_mask is None:
            attention_mask = torch.ones_like(input_ids)
        keep = attention_mask.bool()
        keys = [ids[row].cpu().numpy().tobytes() for ids, row in zip(input_ids, keep)]
        new = sorted({i for i, key in enumerate(keys) if key not in self.states})
        if new:
            self._encode(
                input_ids[new],
                attention_mask[new],
                keep[new],
                [keys[i] for i in new],
                {
                    k: v[new] if torch.is_tensor(v) and v.shape[:1] == input_ids.shape[:1] else v
                    for k, v in kwargs.items()
                },
            )
        hidden = self.states[keys[0]]
        out = hidden.new_zeros(*input_ids.shape, hidden.shape[-1])
        for i, key in enumerate(keys):
            out[i, keep[i]] = self.states[key]
        return BaseModelOutputWithPooling(last_hidden_state=out, pooler_output=self.pool(out))

    def pool(self, hidden: torch.Tensor) -> torch.Tensor | None:
        """Return the encoder's pooled output of its token states, as its forward computes it:
        BERT's pooler (dense + tanh of the first token's state), ALBERT's dense on the first
        token's state and its separate activation; None for an encoder without a pooler."""
        pooler = getattr(self.encoder, "pooler", None)
        if pooler is None:
            return None
        activation = getattr(self.encoder, "pooler_activation", None)
        if activation is not None:  # ALBERT: a plain linear layer
            return activation(pooler(hidden[:, 0]))
        return pooler(hidden)

    @torch.no_grad()
    def _encode(self, input_ids, attention_mask, keep, keys, kwargs) -> None:
        was_training = self.encoder.training
        self.encoder.eval()
        try:
            hidden = self.forward(input_ids=input_ids, attention_mask=attention_mask, **kwargs)[0]
        finally:
            self.encoder.train(was_training)
        for key, row, mask in zip(keys, hidden, keep):
            self.states[key] = row[mask].clone()

    def close(self) -> None:
        """Restore the encoder's own forward (before the model is saved or used elsewhere)."""
        del self.encoder.forward
        self.states.clear()
