"""Replaced-token detection (``objective=rtd``): ELECTRA's objective (Clark et al., 2020,
'ELECTRA: Pre-training Text Encoders as Discriminators Rather Than Generators').

A small generator is trained with the masked-LM loss at the chosen positions; its samples (from
its softmax, with no gradient through the sampling) replace the chosen tokens, and the model, a
discriminator, learns at every real position whether its token was replaced. A sample equal to
the original counts as original. The loss the step differentiates is

    MLM loss (over the chosen tokens)  +  lambda x discriminator loss (over the real tokens)

with lambda = ``objective.discriminator_weight`` (50 in the paper), each term averaged over its
tokens in the whole optimizer step (``model.objective``).

The parts, and why:

- The discriminator is the run's own ``BertForMaskedLM`` from its preset (or ``model.init_from``),
  the model an MLM run trains, with a head of ELECTRA's shape (dense, GELU, one logit) on its last
  states. So SDPA and flash-attn, packing and document isolation, the CPU kernels, ``torch.compile``
  and the FSDP units apply unchanged, and ``final/`` is the same plain model dir an MLM run writes,
  which every mlmkit command and ``AutoModel`` load as they load an MLM run's (its masked-LM head is
  the one part left untrained).
- The generator is transformers' ``ElectraForMaskedLM``: BERT's encoder layers, narrower
  (``objective.generator_size`` of the width, heads and FFN), with ELECTRA's projection from the
  shared embeddings (the discriminator's width, as in the paper) to its own width and back before
  the output layer tied to them. Its embeddings module *is* the discriminator's (word, position and
  token-type embeddings, as the paper shares them), so they are one set of tensors in training, in
  a checkpoint and after a resume. It runs on the same attention inputs as the discriminator, and
  its vocabulary projection only at the chosen positions (the sparse head).
- The samples come from one uniform draw per position that the collator makes from the row's
  own mask stream (``MLMCollator(draws=True)``): a token is chosen where the draw falls in its
  share of the softmax's cumulative sum, so samples, like masks, are the same in any worker, for
  any split into processes and after a resume.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from mlmkit.errors import ConfigError
from mlmkit.masking.collator import IGNORE_INDEX
from mlmkit.model.architectures import parts_of
from mlmkit.model.bert import encoder_inputs, prediction_positions
from mlmkit.model.kernels import cross_entropy_sum
from mlmkit.model.objective import Objective

GENERATOR_LAYER = "ElectraLayer"  # one FSDP unit each, beside the discriminator's layers
# A train event from this step on whose discriminator loss is within PLATEAU_NATS of the entropy
# of its replaced share (what the share alone scores) gets a warning in the log, once.
PLATEAU_STEP = 1000
PLATEAU_NATS = 0.005


def generator_config(config, objective):
    """Return the ``ElectraConfig`` of the generator of a discriminator of ``config``
    (``objective``: an ``ObjectiveConfig``): its layers, the narrower width, heads and FFN of
    ``objective.generator_shape``, and embeddings the discriminator's width, shared."""
    from transformers import ElectraConfig

    width, heads, ffn = objective.generator_shape(
        config.hidden_size, config.num_attention_heads, config.intermediate_size
    )
    if width >= config.hidden_size:
        raise ConfigError(
            f"objective.generator_size={objective.generator_size} makes a generator {width} wide, "
            f"as wide as the model ({config.hidden_size}); lower objective.generator_size."
        )
    return ElectraConfig(
        vocab_size=config.vocab_size,
        # the shared embeddings' width: the discriminator's (an ELECTRA's own embedding_size)
        embedding_size=getattr(config, "embedding_size", config.hidden_size),
        hidden_size=width,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=heads,
        intermediate_size=ffn,
        hidden_act="gelu",
        hidden_dropout_prob=config.hidden_dropout_prob,
        attention_probs_dropout_prob=config.attention_probs_dropout_prob,
        max_position_embeddings=config.max_position_embeddings,
        type_vocab_size=config.type_vocab_size,
        initializer_range=config.initializer_range,
        layer_norm_eps=config.layer_norm_eps,
        pad_token_id=config.pad_token_id,
    )


def build_generator(model, objective, attn_implementation: str):
    """Return a new generator (``ElectraForMaskedLM``) for the discriminator ``model``, sharing its
    embeddings; its output bias starts as the discriminator's (the unigram start, the padded
    vocabulary's silenced rows)."""
    refusal = parts_of(model).check_objective("rtd")  # BERT and ELECTRA share embeddings
    if refusal:
        raise ConfigError(refusal + ".")
    from transformers import ElectraForMaskedLM

    generator = ElectraForMaskedLM(generator_config(model.config, objective))
    generator.set_attn_implementation(attn_implementation)
    share_embeddings(generator, model)
    with torch.no_grad():
        generator.generator_lm_head.bias.copy_(parts_of(model).output_bias(model))
    return generator


def share_embeddings(generator, model) -> None:
    """Make the generator's embeddings the discriminator's own module, and its output layer's
    weight their word embeddings."""
    generator.electra.embeddings = parts_of(model).embeddings(model)
    generator.generator_lm_head.weight = model.get_input_embeddings().weight


def generator_weights(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Return the generator's full weights from the objective's (``generator.*``; a sharded
    engine's gathered weights may hold the shared embeddings under the discriminator's names
    only: they are taken from there)."""
    own = {
        k.removeprefix("generator."): v for k, v in weights.items() if k.startswith("generator.")
    }
    for shared in ("model.bert.embeddings.", "model.electra.embeddings."):  # a BERT's, an ELECTRA's
        for key, value in weights.items():
            if key.startswith(shared):
                own.setdefault("electra.embeddings." + key.removeprefix(shared), value)
    return own


@torch.no_grad()
def load_discriminator_head(head: nn.Module, name_or_path: str) -> bool:
    """Start ``head`` (a ``DiscriminatorHead``) from the discriminator head of a released ELECTRA
    discriminator (``ElectraForPreTraining``'s ``discriminator_predictions``) in the model dir
    ``name_or_path``, where it has one; returns whether it did."""
    from pathlib import Path

    from safetensors import safe_open

    weights = Path(name_or_path).expanduser() / "model.safetensors"
    names = {
        "dense.weight": "discriminator_predictions.dense.weight",
        "dense.bias": "discriminator_predictions.dense.bias",
        "prediction.weight": "discriminator_predictions.dense_prediction.weight",
        "prediction.bias": "discriminator_predictions.dense_prediction.bias",
    }
    if not weights.is_file():
        return False
    with safe_open(str(weights), framework="pt") as f:
        if not set(names.values()) <= set(f.keys()):
            return False
        state = {own: f.get_tensor(theirs) for own, theirs in names.items()}
    head.load_state_dict(state)
    return True


def share_entropy(share: float) -> float:
    """Return the binary entropy of a replaced share in nats (the loss of saying it everywhere)."""
    return -(share * math.log(share) + (1 - share) * math.log(1 - share))


class DiscriminatorHead(nn.Module):
    """ELECTRA's discriminator head: a dense layer, GELU, and one logit per token (replaced).

    Its logit starts at the log-odds of ``replaced_share``, the share of tokens the generator is
    expected to replace, instead of 0 (even odds), as a rare class's classifier starts at its
    prior (Lin et al., 2017, 'Focal Loss for Dense Object Detection', section 4.1). From 0 the
    first steps move every token's logit towards the prior together, through the encoder too,
    and a new encoder's last states drifted towards one vector for every token: at the
    prior they start where the loss has nothing but the tokens to learn from."""

    def __init__(self, config, replaced_share: float = 0.15) -> None:
        super().__init__()
        self.dense = nn.Linear(config.hidden_size, config.hidden_size)
        self.prediction = nn.Linear(config.hidden_size, 1)
        for layer in (self.dense, self.prediction):
            nn.init.normal_(layer.weight, std=config.initializer_range)
            nn.init.zeros_(layer.bias)
        share = min(max(replaced_share, 1e-3), 1 - 1e-3)
        nn.init.constant_(self.prediction.bias, math.log(share / (1 - share)))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.prediction(nn.functional.gelu(self.dense(hidden))).squeeze(-1)


@torch.no_grad()
def sample_tokens(logits: torch.Tensor, draws: torch.Tensor) -> torch.Tensor:
    """Sample one token per row of ``logits`` from its softmax, with a uniform ``draws`` in
    [0, 1) per row: the first token whose cumulative probability exceeds the draw. No gradient
    flows through it; tokens of probability 0 (the padded vocabulary) are never drawn."""
    cumulative = torch.softmax(logits.float(), dim=-1).cumsum(dim=-1)
    point = (draws.float() * cumulative[:, -1]).unsqueeze(1)
    chosen = torch.searchsorted(cumulative, point, right=True).squeeze(1)
    return chosen.clamp(max=logits.size(-1) - 1)


def real_tokens(attention_mask: torch.Tensor | None) -> torch.Tensor | None:
    """Return a batch's 2-D padding mask (None where every position is a real token)."""
    return attention_mask if attention_mask is not None and attention_mask.dim() == 2 else None


class ReplacedTokenDetection(Objective):
    """The RTD objective: generator and discriminator in one module the step prepares and calls.

    ``forward`` returns the generator's summed MLM loss (``loss_sum``, over the chosen positions)
    and the discriminator's summed binary loss (``rtd_loss_sum``, over the real tokens), with the
    sums the log reads; in eval mode also the generator's logits and targets (the evaluation's
    masked-token figures are the generator's) and ``rtd_sums`` (the discriminator's). Without
    ``labels``: the discriminator's last states (a probe's sentence vectors).
    """

    def __init__(
        self,
        model,
        generator,
        discriminator_weight: float,
        document_sep_id: int | None = None,
        replaced_share: float = 0.15,
    ) -> None:
        """``replaced_share``: the share of tokens expected replaced (the masking rate), where
        the discriminator's logit starts."""
        super().__init__()
        self.model, self.generator = model, generator
        self.discriminator_head = DiscriminatorHead(model.config, replaced_share)
        self.plateau_warned = False
        self.loss_weights = (1.0, float(discriminator_weight))
        self.sparse_prediction = True
        self.document_sep_id = document_sep_id
        self.parts = parts_of(model)
        # FSDP (conf/accelerate/fsdp.yaml) shards one unit per encoder layer of both models
        self._no_split_modules = [self.parts.layer_class, GENERATOR_LAYER]
        # the discriminator's masked-LM head takes no part in the loss, and DDP needs every
        # parameter it synchronises to: its own weights stay as they started (frozen)
        encoder = {id(p) for p in self.parts.encoder(model).parameters()}
        for param in model.parameters():
            if id(param) not in encoder:
                param.requires_grad_(False)

    def counts(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Return (chosen tokens, real tokens) of ``batch``: what each loss averages over."""
        labels, mask = batch["labels"], real_tokens(batch.get("attention_mask"))
        everything = torch.full((), labels.numel(), dtype=torch.long, device=labels.device)
        real = mask.sum() if mask is not None else everything
        return torch.stack([(labels != IGNORE_INDEX).sum(), real])

    def losses(self, out: dict[str, torch.Tensor]) -> torch.Tensor:
        """Return (the generator's summed MLM loss, the discriminator's summed binary loss)."""
        return torch.stack([out["loss_sum"], out["rtd_loss_sum"]])

    def stats(self, out: dict[str, torch.Tensor]) -> torch.Tensor:
        """Return (MLM loss, discriminator loss, generator hits, discriminator hits, replaced)."""
        hits = out["generator_hits"].reshape(1).float()
        return torch.cat([self.losses(out).detach().float(), hits, out["rtd_sums"][:2]])

    def figures(self, sums: list[float], counts: list[float]) -> dict[str, float]:
        """Return a train event's losses, the generator's accuracy and the discriminator's."""
        masked, real = max(counts[0], 1.0), max(counts[1], 1.0)
        mlm, rtd = sums[0] / masked, sums[1] / real
        return {
            "loss": mlm + self.loss_weights[1] * rtd,  # what the step minimises
            "mlm_loss": mlm,  # the generator's, over the chosen tokens
            "rtd_loss": rtd,  # the discriminator's binary loss, over the real tokens
            "generator_accuracy": sums[2] / masked,  # the generator's top-1 on the chosen
            "rtd_accuracy": sums[3] / real,  # the discriminator's, replaced or not
            "replaced_share": sums[4] / real,  # of the real tokens, replaced by a sample
        }

    def warning(self, event: dict) -> str | None:
        """Warn once where the discriminator, ``PLATEAU_STEP`` steps in, scores no better than
        the replaced share alone: a new one can sit there for thousands of steps."""
        share = event["replaced_share"]
        if self.plateau_warned or event["step"] < PLATEAU_STEP or not 0 < share < 1:
            return None
        prior = share_entropy(share)
        if event["rtd_loss"] < prior - PLATEAU_NATS:
            return None
        self.plateau_warned = True
        return (
            f"Step {event['step']}: the discriminator has learned next to nothing (its loss "
            f"{event['rtd_loss']:.4f} against {prior:.4f}, what the replaced share "
            f"{share:.3f} alone scores), and a new one can stay there for thousands of steps while "
            f"its last states collapse to one vector (docs/electra.md): start it from an MLM "
            f"model (model.init_from=...), lower optim.lr, or use objective=mlm on this budget."
        )

    def forward(
        self,
        input_ids: torch.Tensor,
        labels: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        positions: torch.Tensor | None = None,
        targets: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        draws: torch.Tensor | None = None,
        **varlen,
    ) -> dict[str, torch.Tensor]:
        """``positions``/``targets`` as ``MaskedLM``'s; ``draws``: the collator's uniform draw per
        position (without them, torch's global generator draws); ``varlen``: a flattened batch."""
        inputs = encoder_inputs(self.model, input_ids, attention_mask, self.document_sep_id, varlen)
        if labels is None:
            if token_type_ids is not None:
                inputs["token_type_ids"] = token_type_ids
            return {"last_hidden_state": self.parts.encoder(self.model)(**inputs).last_hidden_state}
        if positions is None or targets is None:
            positions, targets = prediction_positions(labels)
        out, sampled = self._generate(inputs, positions, targets, draws)
        real = real_tokens(attention_mask) if not varlen else None
        out.update(self._discriminate(inputs, positions, targets, sampled, real))
        return out

    def _generate(self, inputs: dict, positions, targets, draws) -> tuple[dict, torch.Tensor]:
        """Return the generator's MLM loss at the chosen positions and its samples there."""
        hidden = self.generator.electra(**inputs).last_hidden_state
        hidden = hidden.reshape(-1, hidden.size(-1)).index_select(0, positions)
        logits = self.generator.generator_lm_head(self.generator.generator_predictions(hidden))
        loss_sum = cross_entropy_sum(logits, targets)
        valid = targets != IGNORE_INDEX
        if draws is None:
            draws = torch.rand(positions.shape, device=positions.device)
        else:
            draws = draws.reshape(-1).index_select(0, positions)
        sampled = sample_tokens(logits.detach(), draws)
        hits = ((logits.detach().argmax(-1) == targets) & valid).sum()
        out = {"loss_sum": loss_sum, "n_tokens": valid.sum(), "generator_hits": hits}
        if not self.training:  # the evaluation's top-k (a training step keeps no logits)
            out.update(logits=logits, targets=targets)
        return out, sampled

    def _discriminate(self, inputs: dict, positions, targets, sampled, real) -> dict:
        """Return the discriminator's binary loss over the real tokens of the input with the
        samples in the chosen positions (a sample equal to the original counts as original)."""
        flat = inputs["input_ids"].reshape(-1)
        valid = targets != IGNORE_INDEX
        # the bucket's padding rows (index 0, no target) write to a spare slot, dropped after
        slot = torch.where(valid, positions, torch.full_like(positions, flat.numel()))
        spare = flat.new_zeros(1)
        ids = torch.cat([flat, spare]).scatter(0, slot, sampled)[:-1]
        replaced = torch.cat([torch.zeros_like(flat, dtype=torch.bool), spare.bool()])
        replaced = replaced.scatter(0, slot, sampled != targets)[:-1]
        discriminated = dict(inputs, input_ids=ids.view_as(inputs["input_ids"]))
        hidden = self.parts.encoder(self.model)(**discriminated).last_hidden_state
        logits = self.discriminator_head(hidden).reshape(-1).float()
        weight = real.reshape(-1).float() if real is not None else torch.ones_like(logits)
        loss = nn.functional.binary_cross_entropy_with_logits(
            logits, replaced.float(), weight=weight, reduction="sum"
        )
        hits = (((logits > 0) == replaced).float() * weight).sum()
        return {
            "rtd_loss_sum": loss,
            # (discriminator hits, replaced tokens, real tokens), detached
            "rtd_sums": torch.stack([hits, (replaced.float() * weight).sum(), weight.sum()]),
        }
