"""The fine-tuned model: the task's head (an ``AutoModelFor...`` class of the checkpoint's
architecture) on the checkpoint's encoder, and linear probing (the encoder frozen, its states
computed once per distinct input).

The head starts from a seeded random init, the same one for ``init=random``, so the two
differ only by pretraining: BERT's encoder ``.bert`` (and, for a sequence classifier, a new
pooler), ModernBERT's encoder ``.model`` and its MLM head's dense + norm ``.head``
(``shared_with_classifier`` in ``mlmkit.model.architectures``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from mlmkit.config import FinetuneConfig, TaskConfig
from mlmkit.errors import ConfigError, DataError
from mlmkit.model.architectures import parts_of

log = logging.getLogger("mlmkit")


def build_model(cfg: FinetuneConfig, task, mlm):
    """Return the task's model for ``cfg`` on the encoder of the masked-LM model ``mlm`` (or
    the same architecture from its seeded init, ``init=random``); its config names the labels
    and records the task (``mlmkit_task``, which ``mlmkit predict`` reads)."""
    config = mlm.config.__class__.from_dict(mlm.config.to_dict())
    task.configure(config, cfg)
    config.classifier_dropout = cfg.classifier_dropout
    config._attn_implementation = "sdpa"
    arch = parts_of(mlm)  # BERT or ModernBERT: the head of the same architecture
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
    if cfg.max_seq_length > config.max_position_embeddings:
        raise ConfigError(
            f"max_seq_length ({cfg.max_seq_length}) is longer than the model's "
            f"{config.max_position_embeddings} positions; lower max_seq_length."
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


def load_head(model, source: Path, head_modules: tuple[str, ...]) -> None:
    """Load the head's weights (``head_modules``) of the fine-tuned model dir ``source``."""
    from safetensors.torch import load_file

    state = load_file(str(Path(source) / "model.safetensors"))
    head = {k: v for k, v in state.items() if k.split(".")[0] in head_modules}
    missing, unexpected = model.load_state_dict(head, strict=False)
    assert head and not unexpected, unexpected


def freeze_encoder(model, head_modules: tuple[str, ...] = ("classifier", "head")) -> None:
    """Linear probing: only the pooler (dense + tanh, or ModernBERT's head) and the
    classification layer(s) (``head_modules``) keep training."""
    trainable = 0
    prefixes = tuple(f"{m}." for m in head_modules)
    for name, p in model.named_parameters():
        keep = name.startswith(prefixes) or ".pooler." in f".{name}"
        p.requires_grad_(keep)
        trainable += p.numel() if keep else 0
    log.info(
        "freeze_encoder: the encoder is frozen; %d parameters train (pooler and classifier)",
        trainable,
    )


class FrozenEncoderCache:
    """With the encoder frozen (linear probing) its states are the same every epoch: the
    classifier's encoder (``model.base_model``) runs once per distinct input row, without
    dropout, and later batches read its token states back. The trainable parts still run on
    every step: BERT's pooler (which sits in the encoder module) and every layer after it.
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
        pooler = getattr(self.encoder, "pooler", None)
        return BaseModelOutputWithPooling(
            last_hidden_state=out, pooler_output=pooler(out) if pooler is not None else None
        )

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
