"""The loader's log of each new pass over the training split counts epochs from 1, as users do (Keras, the
Hugging Face Trainer and Megatron print "epoch 1" for the first pass)."""
import logging

from t5x_like.data.loader import split_pass


def test_the_second_pass_is_logged_as_epoch_2(caplog):
    rows = split_pass(["a", "b", "c"], "corpus (train)", "train", seed=0)
    with caplog.at_level(logging.INFO):
        read = [rows[i] for i in range(7)]  # the first pass, the second, and one row of the third
    assert sorted(read[:3]) == sorted(read[3:6]) == ["a", "b", "c"]
    assert [r.getMessage() for r in caplog.records if "epoch" in r.getMessage()] == [
        "data: corpus (train): epoch 2 begins (3 rows per epoch)",
        "data: corpus (train): epoch 3 begins (3 rows per epoch)"]
