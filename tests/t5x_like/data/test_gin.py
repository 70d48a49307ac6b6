"""The data's settings bind from gin under the names run files write (data.make_source.*, registered by the gin
front-end as data.SourceSettings), objective settings included, and make the batches make_source reads."""
import gin
import numpy as np

from t5x_like.config import configurables
from t5x_like.data import make_source
from t5x_like.features import DECODER_INPUT_TOKENS, DECODER_LOSS_WEIGHTS, DECODER_POSITIONS, DECODER_SEGMENT_IDS, DECODER_TARGET_TOKENS


def test_gin_binds_the_configured_arguments(numbered_file, tmp_path, write_token_file):
    other = write_token_file(tmp_path / "other", [[5] * 30] * 40, vocab_size=1 << 20)
    with gin.unlock_config():
        gin.parse_config(f"""
            DATA_PATH = ['{numbered_file}', '{other}']
            DATA_SPLIT = '8,1,1'
            data.make_source.data_path = %DATA_PATH
            data.make_source.blend_weights = [0.5, 0.5]
            data.make_source.data_split = %DATA_SPLIT
            data.make_source.packing = True
            data.make_source.add_bos = False
        """)
    try:
        settings = configurables.source_settings()
    finally:
        gin.clear_config()
    assert (settings.blend_weights, settings.data_split, settings.packing) == ([0.5, 0.5], "8,1,1", True)
    assert settings.options == {"add_bos": False}  # an objective's own setting
    batch = next(make_source("train", settings, batch_size=4, feature_lengths={"targets": 16}, seed=0, shard_index=0,
                             shard_count=1))
    assert set(batch) == {DECODER_INPUT_TOKENS, DECODER_TARGET_TOKENS, DECODER_LOSS_WEIGHTS, DECODER_SEGMENT_IDS, DECODER_POSITIONS}
    assert (batch[DECODER_INPUT_TOKENS] == 5).any() and (batch[DECODER_INPUT_TOKENS] > 1000).any()
    assert np.asarray(batch[DECODER_INPUT_TOKENS]).shape == (4, 16)
