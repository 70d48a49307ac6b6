"""Which steps a run saves, and the save itself: the one place that decides "does this step save".

A run saves every `checkpoint_every` steps and at `save_steps` (Pythia's log-spaced ones; 0 is the initial state,
saved before the first step when MODEL_DIR has no checkpoint yet), and its last step (TRAIN_STEPS or a stop every
process agreed on) unless that step is saved already. A save holds the parameters, the rest of the train state
(run/resume.py's `train_state_item`), the data position and the model item (config, tokenizer, TRAIN_STEPS and the
next learning rate, which a resume with another TRAIN_STEPS compares)."""
from __future__ import annotations

from typing import Sequence

from t5x_like import optim, step_fns
from t5x_like.checkpoint import store
from t5x_like.run.resume import train_state_item


class Saves:
    """The saving policy of one run over its checkpointer, its data source and its model item."""

    def __init__(self, ckpt: store.Checkpointer, source, model_info: dict, optimizer: optim.Optimizer, *,
                 checkpoint_every: int, save_steps: Sequence[int] = ()):
        self.ckpt, self.source, self.model_info, self.optimizer = ckpt, source, model_info, optimizer
        self.checkpoint_every, self.save_steps = checkpoint_every, set(save_steps)

    def due(self, step: int) -> bool:
        """Whether the step just taken is saved (its interval or a save step)."""
        return step % self.checkpoint_every == 0 or step in self.save_steps

    def initial(self, state: step_fns.TrainState) -> None:
        """Save the initial state when step 0 is a save step and MODEL_DIR holds no checkpoint yet."""
        if int(state.step) == 0 and 0 in self.save_steps and self.ckpt.latest_step() is None:
            self.save(0, state)

    def final(self, step: int, state: step_fns.TrainState) -> None:
        """Save the run's last step unless it is saved already (the loop waits for the write at its very end, so a
        final validation overlaps it)."""
        if self.ckpt.latest_step() != step:
            self.save(step, state)

    def save(self, step: int, state: step_fns.TrainState) -> None:
        """Start saving `step` (orbax writes it in the background)."""
        info = {**self.model_info,
                "next_learning_rate": float(self.optimizer.schedule(optim.applied_updates(state.opt_state)))}
        self.ckpt.save(step, params=state.params, train_state=train_state_item(state),
                       data_state=self.source.get_state(), model=info)
