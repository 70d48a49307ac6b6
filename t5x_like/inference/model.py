"""A checkpoint from Python, as transformers' `AutoModelForCausalLM.from_pretrained(path)`, `model(ids).logits` and
`model.generate(...)` or T5X's InteractiveModel give one: its tokenizer, logits, per-token log-probabilities and
generation. `python -m t5x_like.generate` is built on it (the same decoding, records and checks).

    from t5x_like import load_model

    model = load_model("runs/gpt2")                  # a MODEL_DIR or one step's directory, any family
    logits = model.logits(np.array([model.encode("hangzhou is")]))
    [record] = model.generate(["hangzhou is"], max_new_tokens=16, temperature=0)

Mistakes (a path that is not a checkpoint, a damaged one, ids outside the vocabulary, rows longer than the
model takes, out-of-range options) raise a UserError naming the value and the fix, in the generate command's
flag names (`--top_k=-1`: the argument top_k)."""
from __future__ import annotations

import argparse
import os
from typing import Any, Callable, Sequence

import jax
import numpy as np

from t5x_like import checks
from t5x_like.errors import UserError
from t5x_like.features import (DECODER_INPUT_TOKENS, DECODER_LOSS_WEIGHTS, DECODER_TARGET_TOKENS,
                               ENCODER_INPUT_TOKENS)
from t5x_like.inference import loading
from t5x_like.inference.decoding import DEFAULTS, GenerationOptions, Generator, check_model_fits
from t5x_like.inference.prompts import records
from t5x_like.lm import make_lm

INPUT_FEATURES = {"inputs": ENCODER_INPUT_TOKENS, "targets": DECODER_INPUT_TOKENS}
"""The feature each of a model's lengths feeds (LanguageModel.required_lengths: a decoder's 'targets', an
encoder's 'inputs', both for an encoder-decoder, in the order `logits` takes them)."""


def load_model(checkpoint: str | os.PathLike, *, tokenizer: str | None = None, data_parallel: int = -1, fsdp_parallel: int = 1,
               tensor_parallel: int = 1, rules: str = "fsdp_tensor", dtype: str | None = None) -> LoadedModel:
    """The checkpoint (a MODEL_DIR: its latest step; or one step's directory) on a mesh of this process's devices,
    with the tokenizer it records (or `tokenizer`, any form training takes, checked against the recorded one), as
    the generate command's flags of the same names choose: the mesh sizes (-1 fills the devices), the rule set,
    the compute dtype (default: the checkpoint's; on CPU float32 for a float16/bfloat16 one)."""
    checkpoint = os.fspath(checkpoint)
    flags = argparse.Namespace(checkpoint=checkpoint, tokenizer=tokenizer, data_parallel=data_parallel,
                               fsdp_parallel=fsdp_parallel, tensor_parallel=tensor_parallel, rules=rules, dtype=dtype)
    loading.check_mesh_flags(flags)
    return LoadedModel.from_flags(flags, with_tokenizer=loading.read_config(checkpoint)[1] is not None)


class LoadedModel:
    """A checkpoint's model on a mesh: `config`, `params` (sharded by `partitioner`), `tokenizer` (None when the
    checkpoint records none and none was given: then ids only). Token ids are numpy arrays in and out."""

    def __init__(self, checkpoint: str, config, params: Any, tokenizer, partitioner):
        self.checkpoint, self.config, self.params = checkpoint, config, params
        self.tokenizer, self.partitioner = tokenizer, partitioner
        self.lm = make_lm(config)
        self._compiled: dict[str, Callable] = {}
        self._generators: dict[GenerationOptions, Generator] = {}

    @classmethod
    def from_flags(cls, args: argparse.Namespace, *, with_tokenizer: bool = True) -> LoadedModel:
        """The model of the --checkpoint / --tokenizer / mesh flags (loading.load_for_inference)."""
        config, params, tokenizer, partitioner = loading.load_for_inference(args, with_tokenizer=with_tokenizer)
        return cls(args.checkpoint, config, params, tokenizer, partitioner)

    @property
    def kind(self) -> str:
        """'decoder_only', 'encoder_decoder' or 'encoder_only'."""
        return self.lm.KIND

    @property
    def vocab_size(self) -> int:
        """The real vocabulary (logits' last axis; the embedding's padding rows are never shown)."""
        return self.config.vocab_size

    # -- text
    def encode(self, text: str) -> list[int]:
        """A prompt's ids as the generate command encodes it: a decoder-only model's as the tokenizer's own users
        do (a Llama tokenizer's BOS first, as transformers'), an encoder's input as training does (without the
        EOS T5's model adds when it generates: `encode(text) + [eod_id]` is transformers' T5 input)."""
        tokenizer = self._tokenizer()
        return tokenizer.encode_prompt(text) if self.kind == "decoder_only" else tokenizer.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer().decode([int(i) for i in ids])

    @property
    def eod_id(self) -> int:
        """The tokenizer's end-of-document id, where generation stops."""
        return self._tokenizer().eod_id

    def _tokenizer(self):
        if self.tokenizer is None:
            raise UserError(f"checkpoint {self.checkpoint} records no tokenizer, so text and generation need one: "
                            f"load_model({self.checkpoint!r}, tokenizer=PATH) (token ids work without).")
        return self.tokenizer

    # -- scores
    def logits(self, ids: Any, decoder_ids: Any = None) -> np.ndarray:
        """fp32 logits over the real vocabulary: a decoder-only model's [batch, length, vocab] for its tokens
        `ids`; an encoder-decoder's [batch, decoder length, vocab] for the encoder's `ids` and the decoder's
        input `decoder_ids` (its start id first: T5's 0), as transformers' `decoder_input_ids`; an encoder-only
        model's masked-LM logits for `ids` (a classification head: [batch, labels]). Rows of one length, no
        padding mask."""
        return self._run("logits", self.lm.logits, self._inputs(ids, decoder_ids))

    def log_probs(self, ids: Any, decoder_ids: Any = None) -> np.ndarray:
        """[batch, length - 1]: the log-probability of each decoder token after the first given those before it
        (a decoder-only model's `ids`; an encoder-decoder's `decoder_ids` given the encoder's `ids`), from the
        scoring code eval uses (the full logits never held at once). Their sum scores a text."""
        if self.kind == "encoder_only":
            raise UserError(f"checkpoint {self.checkpoint} holds an encoder-only model, which predicts masked "
                            "tokens, not the next one: use logits(ids).")
        batch = self._inputs(ids, decoder_ids)
        tokens = batch[DECODER_INPUT_TOKENS]
        if tokens.shape[1] < 2:
            raise UserError(f"{'decoder_ids' if decoder_ids is not None else 'ids'} has 1 token per row: "
                            "log-probabilities score the tokens after the first, so give at least 2.")
        batch.update({DECODER_INPUT_TOKENS: tokens[:, :-1], DECODER_TARGET_TOKENS: tokens[:, 1:],
                      DECODER_LOSS_WEIGHTS: np.ones(tokens[:, 1:].shape, np.float32)})
        return self._run("log_probs", lambda params, rows: self.lm.score(params, rows)["log_prob"], batch)

    def _inputs(self, ids: Any, decoder_ids: Any) -> dict[str, np.ndarray]:
        """The module's input features from the arrays given, checked (ids in the vocabulary, lengths)."""
        lengths = self.lm.required_lengths()
        given = {"ids": ids} if decoder_ids is None else {"ids": ids, "decoder_ids": decoder_ids}
        if len(given) != len(lengths):
            need = "its encoder-decoder model takes the encoder's ids and the decoder's decoder_ids" \
                if len(lengths) == 2 else f"its {self.kind.replace('_', '-')} model takes ids alone, no decoder_ids"
            raise UserError(f"checkpoint {self.checkpoint}: {need}.")
        limits = self.lm.max_lengths()
        return {INPUT_FEATURES[length]: checks.token_ids(name, value, self.vocab_size, limits.get(length))
                for (name, value), length in zip(given.items(), lengths)}

    def _run(self, name: str, fn: Callable[[Any, dict], jax.Array], batch: dict[str, np.ndarray]) -> np.ndarray:
        """fn(params, batch) under jit on the mesh, the rows padded to a multiple of the batch's shards."""
        if name not in self._compiled:
            with self.partitioner.activate():
                self._compiled[name] = jax.jit(fn, out_shardings=self.partitioner.replicated)
        rows = len(next(iter(batch.values())))
        padding = -rows % self.partitioner.batch_shards
        sharding = self.partitioner.batch_sharding()
        arrays = {k: loading.global_array(np.pad(v, [(0, padding), (0, 0)]), sharding) for k, v in batch.items()}
        with self.partitioner.activate():
            return np.asarray(jax.device_get(self._compiled[name](self.params, arrays)))[:rows]

    # -- generation
    def generate(self, prompts: Sequence[str | Sequence[int]], *, seed: int = 0,
                 max_new_tokens: int = DEFAULTS.max_new_tokens, temperature: float = DEFAULTS.temperature,
                 top_k: int = DEFAULTS.top_k, top_p: float = DEFAULTS.top_p,
                 repetition_penalty: float = DEFAULTS.repetition_penalty, num_beams: int = DEFAULTS.num_beams,
                 length_penalty: float = DEFAULTS.length_penalty, num_samples: int = DEFAULTS.num_samples,
                 batch_size: int = DEFAULTS.batch_size) -> list[dict]:
        """The generate command's records for these prompts (texts, or token ids as `encode` gives them), each
        a dict: `prompt` (as given), `prompt_tokens`, `completion` (text), `tokens` (the generated ids, without
        the end id), `finish_reason` ('eod' or 'length'), and `sample` (1, 2, ...) with num_samples > 1; a
        prompt's samples follow it. The arguments are the command's flags (GenerationOptions): temperature 0 is
        greedy, num_beams > 1 beam search; the same seed gives the same samples. A prompt longer than a
        decoder-only model leaves room for keeps its last tokens, with a warning, as the command does."""
        options = GenerationOptions(
            max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
            repetition_penalty=repetition_penalty, num_beams=num_beams, length_penalty=length_penalty,
            num_samples=num_samples, batch_size=batch_size)
        if isinstance(prompts, str):
            raise UserError(f"prompts {prompts!r} is one text: give a list of prompts, e.g. [{prompts!r}].")
        encoded = [self._prompt_ids(number, prompt) for number, prompt in enumerate(prompts)]
        given = [prompt if isinstance(prompt, str) else ids for prompt, ids in zip(prompts, encoded)]
        generated = self._generator(options).generate(encoded, seed=seed, num_samples=num_samples)
        return records(given, encoded, generated, self.decode, max_new_tokens, num_samples)

    def _prompt_ids(self, number: int, prompt: str | Sequence[int]) -> list[int]:
        if isinstance(prompt, str):
            return self.encode(prompt)
        if np.ndim(prompt) != 1:
            raise UserError(f"prompts[{number}] is {prompt!r}: each prompt is a text or a list of token ids "
                            "(one prompt of ids: [[id, id, ...]]).")
        return checks.token_ids(f"prompts[{number}]", [prompt], self.vocab_size)[0].tolist() if len(prompt) else []

    def _generator(self, options: GenerationOptions) -> Generator:
        """One Generator per set of options (each compiles once per padded prompt length)."""
        if options not in self._generators:
            check_model_fits(self.config, options)
            tokenizer = self._tokenizer()
            self._generators[options] = Generator(
                self.config, self.params, self.partitioner, eod_id=tokenizer.eod_id,
                max_new_tokens=options.max_new_tokens, settings=options.sampling, batch_size=options.batch_size,
                num_beams=options.num_beams, length_penalty=options.length_penalty,
                start_id=getattr(tokenizer, "document_start_id", None))
        return self._generators[options]
