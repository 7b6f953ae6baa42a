"""What the training step asks of an objective: the module it prepares, calls on every
micro-batch and normalises.

An objective is an ``nn.Module`` around the model it trains. The step (``training.step``)
calls it on each micro-batch and asks it four things:

- ``counts(batch)``: the tokens each of its loss terms is averaged over (a 1-D tensor, one
  entry a term). The step sums them over the step's micro-batches and all ranks first, so a
  term is normalised by its count in the whole optimizer step, not per micro-batch;
- ``losses(out)``: each term's loss *summed* over its tokens, from the forward's output;
- ``loss_weights``: each term's weight in the loss the step differentiates,
  sum_k weight_k x losses_k / counts_k;
- ``stats(out)`` and ``figures(sums, counts)``: what the log window adds up (no host wait) and
  how a log event reads it; ``warning(event)``: a sentence for the log where a train event shows
  the objective learning nothing (None: MLM's loss says so itself).

This base class is the masked-LM objective's: one term, the cross-entropy summed over the chosen
positions (``loss_sum``), averaged over the chosen tokens of the step, logged as ``loss``.
``model.bert.MaskedLM`` is it; ``model.rtd.ReplacedTokenDetection`` adds a second term.
"""

from __future__ import annotations

import torch
from torch import nn

from mlmkit.masking.collator import IGNORE_INDEX


class Objective(nn.Module):
    """The step's view of an objective; the defaults are MLM's (one term, ``loss_sum``)."""

    loss_weights: tuple[float, ...] = (1.0,)

    def counts(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """Return the tokens each loss term averages over in ``batch``: MLM's chosen ones."""
        return (batch["labels"] != IGNORE_INDEX).sum().reshape(1)

    def losses(self, out: dict[str, torch.Tensor]) -> torch.Tensor:
        """Return each term's summed loss in ``out`` (the forward's output), with its gradient."""
        return out["loss_sum"].reshape(1)

    def stats(self, out: dict[str, torch.Tensor]) -> torch.Tensor:
        """Return the sums the log window adds up for ``figures`` (detached, on the device)."""
        return out["loss_sum"].detach().float().reshape(1)

    def figures(self, sums: list[float], counts: list[float]) -> dict[str, float]:
        """Return a train event's figures from a log window's ``sums`` and ``counts``."""
        return {"loss": sums[0] / max(counts[0], 1.0)}

    def warning(self, event: dict) -> str | None:
        """Return a warning for the log that a train ``event`` calls for, or None."""
        return None
