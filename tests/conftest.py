"""Test-wide setup: 8 simulated CPU devices (set before jax is imported anywhere), the tiers and the rules every
test keeps (tests/support/tiers.py), and fixtures many files share."""
from tests.support.environment import configure_this_process, release_compiled, single_device_programs_only_in_the_cache

configure_this_process()
single_device_programs_only_in_the_cache()

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from t5x_like.features import DECODER_INPUT_TOKENS, DECODER_LOSS_WEIGHTS, DECODER_TARGET_TOKENS  # noqa: E402

# The tiers and the rules every test keeps, as a plugin (so its fixture hook also sees session-scoped fixtures,
# which a conftest's hooks below the root directory do not); pytester runs tests/test_suite_rules.py's breakers.
pytest_plugins = ["pytester", "tests.support.rules"]


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """After the last test of a file this worker runs: its compiled programs go (environment.release_compiled)."""
    if nextitem is None or nextitem.path != item.path:
        release_compiled()


class SyntheticSource:
    """Rows of a learnable pattern (each row counts up by a per-row stride modulo the vocab).

    Row r of step i depends only on (seed, split, i, r), so hosts can read disjoint slices and a
    resumed source continues exactly; state is the step index.
    """

    def __init__(self, split, *, batch_size, feature_lengths, seed, shard_index, shard_count, vocab_size=256):
        self.split, self.batch_size, self.seed = split, batch_size, seed
        self.seq_len = feature_lengths["targets"]
        self.shard_index, self.vocab_size = shard_index, vocab_size
        self.eod_id, self.tokenizer_path, self.index, self.num_batches = 0, None, 0, None
        self.passes_begun = ()  # endless rows: no epochs

    def __iter__(self):
        return self

    def __next__(self):
        rows = [self.row(self.index, self.shard_index * self.batch_size + r) for r in range(self.batch_size)]
        self.index += 1
        tokens = np.stack(rows)
        return {DECODER_INPUT_TOKENS: tokens[:, :-1], DECODER_TARGET_TOKENS: tokens[:, 1:],
                DECODER_LOSS_WEIGHTS: np.ones((self.batch_size, self.seq_len), np.float32)}

    def row(self, index, row):
        rng = np.random.default_rng([self.seed, {"train": 0, "validation": 1}[self.split], index, row])
        start, stride = rng.integers(0, self.vocab_size), rng.integers(1, 4)
        return ((start + stride * np.arange(self.seq_len + 1)) % self.vocab_size).astype(np.int32)

    def get_state(self):
        return {"index": self.index}

    def set_state(self, state):
        self.index = state["index"]

    def reset(self):
        self.index = 0

    def close(self):
        pass


@pytest.fixture(scope="session")
def synthetic_source():
    return SyntheticSource


@pytest.fixture(scope="session")
def builtin_texts() -> list[str]:
    """The builtin corpus's documents, read once per worker (builtin_documents parses the standard library's
    sources: 6-11 s a call)."""
    from t5x_like.data.builtin import builtin_documents

    return builtin_documents()


@pytest.fixture(scope="session")
def random_hf_gpt2():
    """A builder of small transformers GPT2LMHeadModels with every tensor perturbed by `scale`
    (odd sizes, the full 50257-id vocabulary so padding is exercised); skips without the torch extra."""
    torch = pytest.importorskip("torch", reason="needs the torch extra (torch, transformers)")
    transformers = pytest.importorskip("transformers", reason="needs the torch extra (torch, transformers)")

    def build(scale: float, seed: int = 0):
        torch.manual_seed(seed)
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            vocab_size=50257, n_positions=40, n_embd=36, n_layer=2, n_head=4, n_inner=52,
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * scale)
        return model

    return build


@pytest.fixture(scope="session")
def random_hf_neox():
    """A builder of small transformers GPTNeoXForCausalLMs (4 heads of 16 dims, 2 layers) with every
    tensor perturbed by `scale`; `sizes` override the config (e.g. vocab_size=50277, the 20B
    tokenizer's, so padding is exercised); skips without the torch extra."""
    torch = pytest.importorskip("torch", reason="needs the torch extra (torch, transformers)")
    transformers = pytest.importorskip("transformers", reason="needs the torch extra (torch, transformers)")

    def build(scale: float, *, rotary_pct: float = 0.25, parallel: bool = True, seed: int = 0, **sizes):
        torch.manual_seed(seed)
        config = transformers.GPTNeoXConfig(**{
            "vocab_size": 301, "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
            "intermediate_size": 80, "max_position_embeddings": 40, "hidden_dropout": 0.0,
            "attention_dropout": 0.0, "rotary_pct": rotary_pct, "use_parallel_residual": parallel, **sizes})
        model = transformers.GPTNeoXForCausalLM(config).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * scale)
        return model

    return build


@pytest.fixture(autouse=True)
def no_cli_state_left_behind():
    """Every test starts and ends without gin bindings, and ends with absl's logger at the level it
    found: a CLI test that parsed a run file (its macros, a bad TOKENIZER) and absl flags (which set
    absl's verbosity) must not configure the functions, or silence the log, of a later test in the
    same worker."""
    import logging

    import gin

    absl_logger = logging.getLogger("absl")
    level = absl_logger.level
    gin.clear_config()
    yield
    gin.clear_config()
    absl_logger.setLevel(level)
