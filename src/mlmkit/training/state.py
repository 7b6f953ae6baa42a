"""Where a run stands, beside the weights and the optimizer: the step, the tokens seen, the
budget's clock, this rank's data position and mask RNG. ``TrainState.state_dict()`` is the
loop state a checkpoint holds (``checkpoint_files.LOOP_STATE``); ``load_state_dict`` restores it."""

from __future__ import annotations

import base64
from typing import Any

import torch
from accelerate.utils import gather_object

from mlmkit.errors import ConfigError
from mlmkit.training.budget import Budget


def encode_rng(state: torch.Tensor) -> str:
    return base64.b64encode(state.numpy().tobytes()).decode()


def decode_rng(text: str) -> torch.Tensor:
    return torch.frombuffer(bytearray(base64.b64decode(text)), dtype=torch.uint8).clone()


class TrainState:
    """The loop's own state; every rank holds one (its stream and collator are its own)."""

    def __init__(
        self, budget: Budget, stream, collator, rank: int, world: int, streaming: bool
    ) -> None:
        self.step = 0
        self.tokens_seen = 0
        self.bad_steps = 0  # consecutive steps skipped for a non-finite gradient
        self.skipped_steps = 0  # all such steps of this process
        self.budget, self.stream, self.collator = budget, stream, collator
        self.rank, self.world, self.streaming = rank, world, streaming

    def finish_step(self, step_tokens: int) -> None:
        self.tokens_seen += step_tokens
        self.budget.finish_step(step_tokens)
        self.step += 1

    def state_dict(self) -> dict[str, Any]:
        """Return the loop state of the whole run (collective: every rank must call it)."""
        stream = (
            {"streaming": True, "ranks": gather_object([self.stream.state_dict()])}
            if self.streaming
            else self.stream.state_dict()
        )
        return {
            "step": self.step,
            "tokens_seen": self.tokens_seen,
            "stream": stream,
            "collator": gather_object([encode_rng(self.collator.generator.get_state())]),
            # masking.on_device: the generator of the step's masks, on the device
            "collator_step": gather_object(
                [None if (g := self.collator.step_generator_state()) is None else encode_rng(g)]
            ),
            "world_size": self.world,
            "budget": self.budget.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.tokens_seen = state["step"], state["tokens_seen"]
        self.budget.load_state_dict(state.get("budget", {"tokens": self.tokens_seen}))
        stream_state = state["stream"]
        saved_world = state.get("world_size", self.world)
        if bool(stream_state.get("streaming")) != self.streaming:
            raise ConfigError(
                f"The checkpoint was written with data.streaming="
                f"{str(not self.streaming).lower()}; resume with the same setting."
            )
        if self.streaming:  # the ranks' positions: dealt out again on another process count
            self.stream.load_ranks(stream_state["ranks"], self.rank)
        else:
            self.stream.load_state_dict(stream_state, self.world, saved_world)
        collator_states = state.get("collator", [])
        if self.rank < len(collator_states):
            self.collator.generator.set_state(decode_rng(collator_states[self.rank]))
        step_states = state.get("collator_step", [])
        if self.rank < len(step_states) and step_states[self.rank] is not None:
            self.collator.load_step_generator_state(decode_rng(step_states[self.rank]))
