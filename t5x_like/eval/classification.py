"""Classification with an encoder-only checkpoint's classification head: accuracy, F1 for two labels, and each
example's prediction."""
from __future__ import annotations

from typing import Sequence

import jax
import numpy as np

from partitioning import Partitioner
from t5x_like.data.objectives import classification, mlm
from t5x_like.errors import UserError
from t5x_like.eval.scoring import pad_rows
from t5x_like.inference import loading
from t5x_like.lm import LanguageModel, make_lm


def evaluate_classification(config, params, tokenizer, partitioner: Partitioner, *, checkpoint: str, data: str,
                            batch_size: int, limit: int | None) -> dict:
    """--task=classification: accuracy (and F1 for two labels) of the checkpoint's classification head on
    a JSONL / TSV of text, text_pair, label (labels named as the checkpoint's label list records them),
    with every prediction."""
    lm = make_lm(config)
    if lm.KIND != "encoder_only" or "classification" not in lm.objectives(config):
        raise UserError(f"--task=classification needs a checkpoint with a classification head; {checkpoint} "
                        f"is a {lm.KIND} model ({config.summary()}).")
    names = config.label_names()
    ids, gold, _ = classification.classification_examples(data, tokenizer, names, config.max_input_length())
    ids, gold = ids[:limit], gold[:limit]
    predicted = classify(lm, params, partitioner, ids, batch_size, mlm.mlm_vocabulary(tokenizer).pad_id)
    result = {"task": "classification", **classification_metrics(gold, predicted, names),
              "predictions": [{"index": i, "prediction": names[p], "label": names[g]}
                              for i, (p, g) in enumerate(zip(predicted.tolist(), gold.tolist()))]}
    result.update(checkpoint=checkpoint, data=data, tokenizer=tokenizer.path)
    return result


def classify(lm: LanguageModel, params, partitioner: Partitioner, ids: list[tuple[np.ndarray, np.ndarray]],
             batch_size: int, pad_id: int) -> np.ndarray:
    """The predicted label index of each (token ids, token types) example, in batches of `batch_size` rows
    (rounded up to the data-parallel shards) as long as the longest example."""
    shards = partitioner.batch_shards
    rows_per_batch = -(-batch_size // shards) * shards
    rows = classification.ClassificationRows(ids, np.zeros(len(ids), np.int32), max(len(t) for t, _ in ids), pad_id)
    sharding = partitioner.batch_sharding()
    with partitioner.activate():
        predict = jax.jit(lambda p, b: lm.score(p, b)["predictions"], out_shardings=partitioner.replicated)
        predictions = []
        for start in range(0, len(rows), rows_per_batch):
            batch = [rows[i] for i in range(start, min(start + rows_per_batch, len(rows)))]
            arrays = {k: pad_rows(np.stack([row[k] for row in batch]), rows_per_batch) for k in batch[0]}
            out = jax.device_get(predict(params, {k: loading.global_array(v, sharding) for k, v in arrays.items()}))
            predictions.append(np.asarray(out[:len(batch)]))
    return np.concatenate(predictions)


def classification_metrics(gold: np.ndarray, predicted: np.ndarray, names: Sequence[str]) -> dict:
    """accuracy, and with two labels F1 of the second ('True', '1', ...) as the positive one."""
    correct = int((gold == predicted).sum())
    metrics = {"num_examples": len(gold), "num_correct": correct, "accuracy": correct / len(gold)}
    if len(names) == 2:
        true_positive = int(((predicted == 1) & (gold == 1)).sum())
        precision = true_positive / max(int((predicted == 1).sum()), 1)
        recall = true_positive / max(int((gold == 1).sum()), 1)
        metrics.update(positive_label=names[1],
                       f1=2 * precision * recall / (precision + recall) if precision + recall else 0.0)
    return metrics
