"""Training from a TFDS dataset prepared as array_record, read with tfds.data_source (no TensorFlow)."""
import json
import re

import numpy as np
import pytest
import tensorflow_datasets as tfds
from etils import epath

from t5x_like.data import SourceSettings, load_tokenizer, make_source
from t5x_like.data.train_tokenizer import train_byte_level_bpe
from t5x_like.features import DECODER_INPUT_TOKENS, DECODER_LOSS_WEIGHTS, DECODER_POSITIONS, DECODER_SEGMENT_IDS, DECODER_TARGET_TOKENS

# tensorflow-datasets reads FieldDescriptor.label, deprecated in protobuf 6 (the versions >= 4.9.10 that the test
# extra pins cope with protobuf 7, where it is gone; the filter keeps the warning quiet where it is still raised).
pytestmark = pytest.mark.filterwarnings(r"ignore:label\(\) is deprecated:DeprecationWarning")


class TinyStories(tfds.core.GeneratorBasedBuilder):
    """60 train and 12 validation documents 'story N: ...' of different lengths."""

    VERSION = tfds.core.Version("1.0.0")
    code_path = epath.Path(__file__)  # tfds would otherwise look the test module up as a package resource

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({"story": tfds.features.Text()}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(range(60)), "validation": self._generate_examples(range(60, 72))}

    def _generate_examples(self, numbers):
        for n in numbers:
            yield n, {"story": f"story {n}: " + "once upon a time " * (1 + n % 9)}


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    root = tmp_path_factory.mktemp("tfds")
    TinyStories(data_dir=str(root / "data"), file_format="array_record").download_and_prepare()
    tokenizer = root / "tokenizer.json"
    train_byte_level_bpe([f"story {n}: once upon a time" for n in range(100)], 300).save(str(tokenizer))
    return {"tfds_name": "tiny_stories", "tfds_data_dir": str(root / "data"), "tokenizer": str(tokenizer),
            "text_key": "story"}


def tfds_source(prepared, split="train", *, batch_size=2, shard_index=0, shard_count=1, **settings):
    return make_source(split, SourceSettings(**{**prepared, **settings}), batch_size=batch_size,
                       feature_lengths={"targets": 24}, seed=0, shard_index=shard_index, shard_count=shard_count)


def stories(batches, decode):
    return {int(n) for b in batches for row in b[DECODER_INPUT_TOKENS] for n in re.findall(r"story (\d+)", decode(row))}


@pytest.mark.parametrize("packing", [False, True])
def test_batches_resume_exactly(prepared, packing):
    src = tfds_source(prepared, packing=packing)
    batches = [next(src) for _ in range(4)]
    keys = {DECODER_INPUT_TOKENS, DECODER_TARGET_TOKENS, DECODER_LOSS_WEIGHTS} | ({DECODER_SEGMENT_IDS, DECODER_POSITIONS} if packing else set())
    assert set(batches[0]) == keys and batches[0][DECODER_INPUT_TOKENS].shape == (2, 24)
    state = json.loads(json.dumps(src.get_state()))
    after = [next(src) for _ in range(4)]
    resumed = tfds_source(prepared, packing=packing)
    resumed.set_state(state)
    for expected in after:
        got = next(resumed)
        for key in keys:
            np.testing.assert_array_equal(got[key], expected[key])
    assert src.vocab_size == 300 and src.tokenizer_path == prepared["tokenizer"]


def test_packed_rows_mark_documents(prepared):
    batch = next(tfds_source(prepared, packing=True, batch_size=4))
    segments = batch[DECODER_SEGMENT_IDS]
    assert (segments > 1).any()
    same = (np.diff(np.concatenate([segments, segments[:, -1:]], 1), axis=1) == 0) & (segments > 0)
    assert ((batch[DECODER_LOSS_WEIGHTS] == 1) <= same).all()


def test_hosts_read_different_documents_and_validation_is_its_own_split(prepared):
    decode = load_tokenizer(prepared["tokenizer"]).decode
    hosts = [stories([next(s) for _ in range(6)], decode) for s in
             (tfds_source(prepared, shard_index=h, shard_count=2) for h in range(2))]
    assert hosts[0] and hosts[1] and not hosts[0] & hosts[1]
    validation = stories([next(tfds_source(prepared, "validation")) for _ in range(1)], decode)
    assert validation and min(validation) >= 60


def test_tfds_splits_map_a_split_to_a_slice(prepared):
    decode = load_tokenizer(prepared["tokenizer"]).decode
    holdout = tfds.data_source("tiny_stories", split="train[50:]", data_dir=prepared["tfds_data_dir"])
    expected = {int(re.match(rb"story (\d+)", holdout[i]["story"]).group(1)) for i in range(len(holdout))}
    src = tfds_source(prepared, "validation", tfds_splits={"validation": "train[50:]"})
    seen = stories([next(src) for _ in range(12)], decode)
    assert seen == expected and len(expected) == 10


@pytest.mark.system
def test_worker_processes_tokenize_with_the_same_result(prepared):
    expected = [next(s) for s in [tfds_source(prepared, packing=True)] for _ in range(3)]
    src = tfds_source(prepared, packing=True, worker_count=2)
    try:
        for batch in expected:
            np.testing.assert_array_equal(next(src)[DECODER_INPUT_TOKENS], batch[DECODER_INPUT_TOKENS])
    finally:
        src.close()


def test_configuration_errors(prepared):
    with pytest.raises(ValueError, match="TFDS dataset tiny_stories: set TOKENIZER"):
        tfds_source(prepared, tokenizer=None)
    with pytest.raises(KeyError, match=r"no feature 'text' \(features: story\); set make_source.text_key"):
        next(tfds_source(prepared, text_key="text"))


@pytest.fixture(scope="module")
def bos_tokenizer(prepared, tmp_path_factory):
    """The fixture's BPE with a '<s>' BOS that its post-processor puts first (as a Llama tokenizer.json does)."""
    from tokenizers import Tokenizer, processors

    tokenizer = Tokenizer.from_file(prepared["tokenizer"])
    tokenizer.add_special_tokens(["<s>"])
    bos = tokenizer.token_to_id("<s>")
    tokenizer.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", bos)])
    path = tmp_path_factory.mktemp("bos") / "tokenizer.json"
    tokenizer.save(str(path))
    return str(path), bos


@pytest.mark.parametrize("add_bos", [True, False])
def test_documents_start_with_the_tokenizers_bos_as_preprocess_writes_them(prepared, bos_tokenizer, add_bos):
    path, bos = bos_tokenizer
    batch = next(tfds_source({**prepared, "tokenizer": path}, packing=True, batch_size=4, add_bos=add_bos))
    tokens, segments = batch[DECODER_INPUT_TOKENS], batch[DECODER_SEGMENT_IDS]
    starts = (segments > 0) & (batch[DECODER_POSITIONS] == 0)  # documents, and pieces of ones longer than a row
    is_bos = tokens == bos
    assert not (is_bos & ~starts).any()  # BOS only where a segment starts
    assert is_bos.sum() >= (4 if add_bos else 0) and (add_bos or not is_bos.any())
