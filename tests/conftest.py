"""Test-wide setup: 8 simulated CPU devices (set before jax is imported anywhere), and a
synthetic data source that follows the trainer's data contract."""
import os
import tempfile

# Single-threaded Eigen inside each XLA:CPU op: the suite already runs one worker per core, and the
# multi-threaded pool has wedged a restore on a 2-core CI machine (a known XLA:CPU hazard; no slower here).
# XLA's cheapest CPU code generation: the suite's small programs spend their time compiling, not running
# (a tiny T5's train step: 15.6 s -> 6.9 s). Sampling once never finished with it: a running sum over a
# vocabulary split across devices, which generate.sample no longer computes (tests/t5x_like/test_generate.py).
CHEAP_FLAGS = "--xla_cpu_multi_thread_eigen=false --xla_backend_optimization_level=0 " \
              "--xla_llvm_disable_expensive_passes=true"
# The processes tests start (CLIs, multi-process runs, the documented commands) also use XLA's classic fusion
# emitters instead of its MLIR ones: compiling about halves (a tiny GPT-2's train step 9.6 -> 4.7 CPU s), and
# --xla_cpu_max_isa=AVX2 keeps them to the instructions the runs here use whatever CI's CPU is (XLA generates code
# for the CPU it runs on; this machine has no AVX-512). The pytest workers themselves keep the MLIR emitters: the
# two CI runs with the classic ones in the workers (8d3496c, c7eb6e3) each lost a worker to a fatal signal in native
# code late in the run (at about 89 % and 84 %, hundreds of tests into one process), which no whole run here
# reproduced, while every subprocess test that ran before the second crash there passed. A worker that dies ends
# `make test` at once, naming its test (Makefile).
ISA = "--xla_cpu_max_isa=AVX2"
XLA_CPU_FLAGS = f"{CHEAP_FLAGS} --xla_cpu_use_fusion_emitters=false {ISA}"
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count=8 {CHEAP_FLAGS}")
os.environ.setdefault("JAX_PLATFORMS", "cpu")
# One JAX compilation cache for the whole suite, its workers and the CLIs its tests start (they inherit the
# environment): the same small models are compiled by many tests, and a cache hit loads the executable instead.
# Every program, however quick to compile: test_eval + test_generate + test_lm 178 -> 167 s, test_optim +
# test_metrics + test_golden_checkpoints 116 -> 103 s (one process, from an empty cache each time).
os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(),
                                                                f"t5x_like-tests-jax-cache-{os.getuid()}"))
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")


def cpu_env(devices: int, *, optimized: bool = False, **extra: str) -> dict[str, str]:
    """The environment for a test's subprocess: `devices` simulated CPU devices, the suite's XLA flags, or with
    `optimized` XLA's full CPU optimisation, for a run whose steps cost more than compiling them (tens of steps of
    a quickstart-sized model: the quickstart T5's 30 steps 155 s -> 75 s)."""
    flags = f"--xla_cpu_multi_thread_eigen=false {ISA}" if optimized else XLA_CPU_FLAGS
    return dict(os.environ, JAX_PLATFORMS="cpu",
                XLA_FLAGS=f"--xla_force_host_platform_device_count={devices} {flags}", **extra)

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from t5x_like.features import DECODER_INPUT_TOKENS, DECODER_LOSS_WEIGHTS, DECODER_TARGET_TOKENS  # noqa: E402


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
