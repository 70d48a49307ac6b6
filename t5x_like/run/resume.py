"""What a training run starts from: the train state and data position its checkpoints hold (saving.py saves them):
MODEL_DIR's newest checkpoint that verifies (parameters, optimizer state and data position, read straight into
their shardings), else a fresh initialisation, with RESTORE_FROM's parameters when given."""
from __future__ import annotations

import math
from typing import Any

from absl import logging

from t5x_like import data, optim, step_fns
from t5x_like.checkpoint import store
from t5x_like.errors import UserError
from t5x_like.experiment import Experiment


def stored_model_info(ckpt: store.Checkpointer, latest: int | None, restore_from: str | None) -> dict | None:
    """The model item the run starts from: its newest intact checkpoint's, else RESTORE_FROM's (None: neither)."""
    if latest is not None:
        return ckpt.model_info()
    return store.read_model_info(restore_from) if restore_from else None


def starting_state(ckpt: store.Checkpointer, exp: Experiment, target: step_fns.TrainState, source, *,
                   resuming: bool, stored: dict | None, restore_from: str | None, on_corrupt: str, restart_data: bool,
                   train_steps: int) -> step_fns.TrainState:
    """The state the first step starts from (`target`: the state's abstract arrays with their shardings); a resume
    also moves `source` to the checkpoint's data position."""
    resumed = restore_newest(ckpt, target, exp.shardings, on_corrupt) if resuming else None
    if resumed is None:
        state = exp.init_state()
        return state.replace(params=pretrained_params(restore_from, state.params, exp)) if restore_from else state
    state, data_state = resumed
    resume_data(source, data_state, restart_data, ramping=exp.rampup is not None)
    logging.info("resumed from %s at step %d", ckpt.directory, int(state.step))
    warn_schedule_change(stored, exp.optimizer, train_steps, int(state.step),
                         int(optim.applied_updates(state.opt_state)))
    return state


def train_state_item(state: step_fns.TrainState) -> dict:
    """The checkpoint's train_state: all but the parameters (the FP8 state only when the model has one)."""
    item = {"step": state.step, "opt_state": state.opt_state, "rng": state.rng, "loss_scale": state.loss_scale}
    return item if state.fp8_state is None else {**item, "fp8_state": state.fp8_state}


def restore_newest(ckpt, state, shardings, on_corrupt: str):
    """(state, data position) from the newest checkpoint that verifies, or None when there is none."""
    target = store.with_shardings(train_state_item(state), train_state_item(shardings))
    restored = ckpt.restore_newest(params=store.with_shardings(state.params, shardings.params),
                                   train_state=target, on_corrupt=on_corrupt)
    if restored is None:
        return None
    _, params, rest, data_state = restored
    return state.replace(params=params, **rest), data_state


def pretrained_params(restore_from: str, params: Any, exp: Experiment) -> Any:
    """RESTORE_FROM's parameters for a new run; a head the checkpoint cannot supply (the family's
    HEAD_PARAMS: a classifier on a masked-LM encoder) keeps its fresh initialisation."""
    restored, fresh = store.restore_pretrained(
        restore_from, store.with_shardings(params, exp.shardings.params), exp.config.HEAD_PARAMS)
    logging.info("initialised parameters from %s (params only)%s", restore_from,
                 f"; {', '.join(fresh)} start fresh (not in the checkpoint)" if fresh else "")
    return {k: restored.get(k, v) for k, v in params.items()}


def resume_data(source, data_state: dict, restart_data: bool, *, ramping: bool = False) -> None:
    """The data source at the checkpoint's position, or (`restart_data`) at its start, said so; not at its start
    with a batch-size ramp-up (`ramping`), whose batches follow from the step."""
    if not restart_data:
        source.set_state(data_state)
        return
    if ramping:
        raise UserError("train.restart_data=True with BATCH_SIZE_RAMPUP set: the data would start over at the "
                        "ramp-up's first batch while the run continues at its step; resume the data (drop "
                        "restart_data), or once the ramp-up is over set BATCH_SIZE_RAMPUP=None to start it over.")
    logging.warning("train.restart_data=True: the data starts over from its first batch (the model, optimizer and "
                    "step continue from the checkpoint)")


def warn_schedule_change(stored: dict | None, optimizer: optim.Optimizer, train_steps: int, step: int,
                         applied: int) -> None:
    """Changing TRAIN_STEPS on resume reshapes the learning-rate schedule: show the jump (`applied`:
    the optimizer's count of applied updates, which the schedule reads)."""
    saved = (stored or {}).get("train_steps")
    if saved is None or saved == train_steps:
        return
    before, after = (stored or {}).get("next_learning_rate"), float(optimizer.schedule(applied))
    if isinstance(before, (int, float)) and math.isclose(before, after, rel_tol=1e-6):
        change = f"the learning rate stays at {after:.3e} at step {step}"
    else:
        jump = f"from {before:.3e} to {after:.3e}" if isinstance(before, (int, float)) else f"to {after:.3e}"
        change = f"at step {step} the learning rate jumps {jump}"
    logging.warning("TRAIN_STEPS=%d but the checkpoint's run had TRAIN_STEPS=%d: the learning-rate schedule "
                    "changes; %s", train_steps, saved, change)


def tokenizer_record(source) -> dict | None:
    """What checkpoints record of the data's tokenizer: its files, so readers find it wherever the run moves
    (nothing, said once, when the data names a tokenizer that does not load: older token files)."""
    if not source.tokenizer_path:
        return None
    try:
        return data.tokenizer_record(data.load_tokenizer(source.tokenizer_path))
    except UserError as e:
        logging.warning("the checkpoints record no tokenizer: the data's tokenizer does not load (%s); generate, "
                        "eval and convert will need --tokenizer", e)
        return None
