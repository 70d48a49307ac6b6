"""classification: the default label lists (examples, fields and training: tests/t5x_like/eval/test_classification.py)."""
from t5x_like.data.objectives import classification


def test_default_labels():
    def examples(*labels):
        return [classification.LabelledText(text="w3", text_pair=None, label=label) for label in labels]

    assert classification.default_labels(examples("True", "True")) == ["False", "True"]
    assert classification.default_labels(examples("2", "0", "2")) == ["0", "1", "2"]
    assert classification.default_labels(examples("neutral", "entailment", "neutral")) == ["entailment", "neutral"]
