"""from-hf checks the tokenizer files it imports against the model's vocabulary."""
import os

import pytest

from t5x_like.convert import hf
from t5x_like.errors import UserError


def test_a_tokenizer_far_smaller_than_the_vocabulary_is_refused(random_hf_gpt2, tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    random_hf_gpt2(0.0).save_pretrained(tmp_path / "hf")
    one_id = tokenizers.Tokenizer(tokenizers.models.WordLevel({"<|endoftext|>": 0}, unk_token="<|endoftext|>"))
    one_id.save(str(tmp_path / "hf" / "tokenizer.json"))
    with pytest.raises(UserError, match="the tokenizer has 1 ids but the model's vocab_size is 50257"):
        hf.from_hf(str(tmp_path / "hf"), str(tmp_path / "ours"))
    assert not os.path.exists(tmp_path / "ours" / "checkpoints") and not os.path.exists(tmp_path / "ours" / "tokenizer")
