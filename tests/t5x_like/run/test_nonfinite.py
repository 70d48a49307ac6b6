"""nonfinite.NonfiniteCheck: which skipped steps a float16 run's dynamic loss scale handles (its overflows, logged),
and which mean the state itself is bad (stopping after `in_a_row`)."""
import numpy as np
import pytest

from t5x_like import step_fns
from t5x_like.run import nonfinite

PARAMS = {"dense": {"kernel": np.zeros(2), "bias": np.zeros(2)}}
DYNAMIC = step_fns.LossScaleConfig(initial_scale_power=32, min_scale=1.0)


def step_values(loss: float, scale: float | None, skipped: bool = True) -> dict:
    values = {"loss": loss, "skipped": int(skipped)}
    return values if scale is None else {**values, "loss_scale": scale}


OVERFLOW = np.array([False, True])  # the gradients of one parameter of two are not finite


def test_a_dynamic_scales_overflows_are_skipped_while_it_backs_off(caplog):
    check = nonfinite.NonfiniteCheck(PARAMS, "stop", in_a_row=5, loss_scale=DYNAMIC)
    with caplog.at_level("INFO"):
        for step in range(1, 33):  # Megatron's 2**32 backing off one halving a step
            check(step, step_values(10.5, 2.0 ** (33 - step)), OVERFLOW)
    assert "step 32: the gradients overflowed at loss scale 2; update skipped, the scale backs off" in caplog.text
    check(33, step_values(10.4, 2.0, skipped=False), np.array([True, True]))


def test_overflows_at_the_minimum_scale_mean_a_bad_state():
    check = nonfinite.NonfiniteCheck(PARAMS, "stop", in_a_row=3, loss_scale=DYNAMIC)
    check(1, step_values(10.5, 1.0), OVERFLOW)
    check(2, step_values(10.5, 1.0), OVERFLOW)
    with pytest.raises(nonfinite.NonfiniteLossError, match=r"step 3: 3 steps in a row .* from step 1: the model's "
                                                           r"state itself is bad.*dense/bias"):
        check(3, step_values(10.5, 1.0), OVERFLOW)


@pytest.mark.parametrize("loss_scale, loss", [(step_fns.LossScaleConfig(static_scale=1024.0), 10.5),
                                              (DYNAMIC, float("nan"))])
def test_a_static_scale_or_a_nonfinite_loss_is_not_the_scalers_to_handle(loss_scale, loss):
    check = nonfinite.NonfiniteCheck(PARAMS, "stop", in_a_row=2, loss_scale=loss_scale)
    check(1, step_values(loss, 1024.0), OVERFLOW)
    with pytest.raises(nonfinite.NonfiniteLossError, match=r"step 2: 2 steps in a row"):
        check(2, step_values(loss, 1024.0), OVERFLOW)


def test_without_a_loss_scale_stop_stops_at_the_first():
    check = nonfinite.NonfiniteCheck(PARAMS, "stop")
    with pytest.raises(nonfinite.NonfiniteLossError, match=r"step 7: loss is 10.5000 but the gradients are not "
                                                           r"finite; non-finite gradients in 1 of 2 parameters"):
        check(7, step_values(10.5, None), OVERFLOW)
