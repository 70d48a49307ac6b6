"""`CheckpointLM`: lm-evaluation-harness's `LM` over a causal-family checkpoint on any mesh.

    loglikelihood          each (context, continuation) tokenized as lm-eval's Hugging Face backend does
                           (trailing context spaces move to the continuation; the pair encoded whole, then
                           split), cut on the left to the model's length; the continuation scored in one pass,
                           many requests packed per row (harness/sequences.py), in fixed-size global batches
    loglikelihood_rolling  the document after the prefix id (end-of-document, or the tokenizer's beginning-of-text)
                           in windows of the model's length, each token scored once (`stride` new tokens per later
                           window; default the whole window, lm-eval's own disjoint windows), the window
                           log-likelihoods summed
    generate_until         t5x_like.generate's KV-cache decoding (greedy, or sampling with temperature / top_k /
                           top_p; num_beams > 1: beam search) of max_gen_toks new tokens, the context cut on the
                           left to leave room for them, the text cut at the first stop sequence (`until`, and
                           the end-of-document token's text)

A tokenizer with a beginning-of-text token (its post-processor puts a BOS such as <s> first: `Tokenizer.bos_id`) is used
as lm-eval's hf backend (0.4.9.2 and later) uses transformers' tokenizer: texts are encoded with it first unless
add_bos_token=False (--no_bos), and it is the prefix id. A rolling document is therefore encoded with it and gets
the prefix too: its first window reads BOS, BOS, text and scores BOS after BOS, as lm-eval's own code does.

Every process of a multi-host run builds the same requests (lm-eval sees one rank) and computes its devices'
share of each global batch; the results are replicated, so every process returns the same numbers.
"""
from __future__ import annotations

import json
import sys
from typing import Any, Iterable, Sequence

import jax
import numpy as np
from lm_eval.api.model import TemplateLM
from lm_eval.models.utils import handle_stop_sequences, normalize_gen_kwargs, postprocess_generated_text
from tqdm import tqdm

import models
from partitioning import Partitioner
from t5x_like.cluster import processes
from t5x_like.errors import UserError
from t5x_like.eval.harness import sequences as seqs
from t5x_like.inference import decoding, loading
from t5x_like.lm import make_lm

DEFAULT_MAX_GEN_TOKS = 256
"""New tokens a generate_until request gets when its task sets no max_gen_toks (lm-eval's default)."""
SAMPLING_KWARGS = ("do_sample", "temperature", "top_k", "top_p", "num_beams", "length_penalty")


class TokenScorer:
    """Scores `Scored` sequences packed into rows, `batch_size` rows (rounded up to the data-parallel shards) per
    jitted step: (Σ log p of each sequence's scored targets, whether each of them is the argmax)."""

    def __init__(self, lm, params: Any, partitioner: Partitioner, batch_size: int):
        shards = partitioner.batch_shards
        self.batch_size = -(-batch_size // shards) * shards
        self.params, self.partitioner, self.sharding = params, partitioner, partitioner.batch_sharding()
        with partitioner.activate():
            self._fn = jax.jit(lambda p, batch: lm.score(p, batch), out_shardings=partitioner.replicated)

    def score(self, sequences: Sequence[seqs.Scored], max_length: int, description: str) -> list[tuple[float, bool]]:
        if not sequences:
            return []
        length = seqs.row_length(sequences, max_length)
        rows = seqs.pack(sequences, length)
        results: list[tuple[float, bool] | None] = [None] * len(sequences)
        batches = range(0, len(rows), self.batch_size)
        for first in tqdm(batches, desc=description, unit="batch", file=sys.stderr,
                          disable=not processes.is_primary()):
            chunk = rows[first:first + self.batch_size]
            out = self._run(seqs.packed_rows(sequences, chunk, self.batch_size, length))
            for index, (row, span) in seqs.scored_spans(sequences, chunk).items():
                results[index] = (float(out["log_prob"][row, span].astype(np.float64).sum()),
                                  bool(out["correct"][row, span].all()))
        return results  # type: ignore[return-value]

    def _run(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with self.partitioner.activate():
            arrays = {k: loading.global_array(v, self.sharding) for k, v in batch.items()}
            return jax.device_get(self._fn(self.params, arrays))


class CheckpointLM(TemplateLM):
    """lm-eval's LM for a decoder-only checkpoint's parameters (placed by `partitioner`) and its tokenizer."""

    backend = "causal"

    def __init__(self, config, params: Any, partitioner: Partitioner, tokenizer, *, batch_size: int = 8,
                 stride: int | None = None, seed: int = 0, name: str = "", add_bos_token: bool | None = None):
        super().__init__()
        self.lm = make_lm(config)
        if self.lm.KIND != "decoder_only":
            raise UserError(refusal(name or config.family, self.lm.KIND))
        self.config, self.params, self.partitioner, self.text_tokenizer = config, params, partitioner, tokenizer
        self.batch_size, self.seed, self.name, self.add_bos_token = batch_size, seed, name, add_bos_token
        self.max_length = self.lm.max_length
        self.stride = stride or self.max_length
        if not 0 < self.stride <= self.max_length:
            raise UserError(f"--stride={stride} must be between 1 and the model's max_len {self.max_length}.")
        self.scorer = TokenScorer(self.lm, params, partitioner, batch_size)
        self._generators: dict[tuple, decoding.Generator] = {}

    def set_params(self, params: Any) -> None:
        """Evaluate these parameters from now on (training: the current state's), keeping what was compiled."""
        self.params = self.scorer.params = params
        for generator in self._generators.values():
            generator.params = params

    # -- tokenization (TemplateLM turns loglikelihood requests into token ids with these)
    @property
    def eot_token_id(self) -> int:
        return self.text_tokenizer.eod_id

    @property
    def prefix_token_id(self) -> int:
        """What an empty context and a document's first token are conditioned on: the tokenizer's beginning-of-text
        token where it has one, else end-of-document (lm-eval's hf backend)."""
        bos = self.text_tokenizer.bos_id
        return self.eot_token_id if bos is None else bos

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        """As lm-eval's hf backend encodes: the tokenizer's beginning-of-text first unless add_special_tokens (else
        add_bos_token) is False or the string already starts with its text."""
        ids = self.text_tokenizer.encode(string)
        bos = self.text_tokenizer.bos_id
        if bos is None:
            return ids
        if add_special_tokens is None:
            add_special_tokens = self.add_bos_token is not False and not string.startswith(self.tok_decode([bos]))
        return [bos, *ids] if add_special_tokens else ids

    def tok_decode(self, ids: Sequence[int]) -> str:
        return self.text_tokenizer.decode(list(ids))

    @property
    def tokenizer_name(self) -> str:
        return self.text_tokenizer.path

    def get_model_info(self) -> dict:
        """What lm-eval records of the model in the results' `config`."""
        bos = self.text_tokenizer.bos_id
        return {"checkpoint": self.name, "family": self.config.family, "model_num_parameters": self.lm.num_params(),
                "model_dtype": self.config.dtype, "max_length": self.max_length, "rolling_stride": self.stride,
                "bos_token": None if bos is None else self.text_tokenizer.id_to_token(bos),
                "add_bos_token": self.add_bos_token}

    # -- the three request types
    def _loglikelihood_tokens(self, requests: list[tuple[tuple[str, str], list[int], list[int]]],
                              disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        sequences = [seqs.continuation(context, continuation, self.max_length) for _, context, continuation in requests]
        results = self.scorer.score(sequences, self.max_length, "loglikelihood")
        for (strings, _, _), result in zip(requests, results):
            self.cache_hook.add_partial("loglikelihood", strings, result)
        return results

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        windows = [seqs.rolling(self.tok_encode(string), self.prefix_token_id, self.max_length, self.stride)
                   for (string,) in (request.args for request in requests)]
        scores = iter(self.scorer.score([w for ws in windows for w in ws], self.max_length, "loglikelihood_rolling"))
        totals = [sum(next(scores)[0] for _ in ws) for ws in windows]
        for request, total in zip(requests, totals):
            self.cache_hook.add_partial("loglikelihood_rolling", request.args, total)
        return totals

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        groups: dict[str, list[int]] = {}
        for number, request in enumerate(requests):
            groups.setdefault(json.dumps(request.args[1], sort_keys=True, default=str), []).append(number)
        results: list[str] = [""] * len(requests)
        for numbers in groups.values():
            texts = self._generate_group([requests[n] for n in numbers])
            for number, text in zip(numbers, texts):
                results[number] = text
                self.cache_hook.add_partial("generate_until", requests[number].args, text)
        return results

    def _generate_group(self, requests: Sequence) -> list[str]:
        """Completions of requests that share their generation settings (longest contexts first, so that
        batches hold prompts of similar lengths)."""
        kwargs = normalize_gen_kwargs(dict(requests[0].args[1]), DEFAULT_MAX_GEN_TOKS)
        eos = self.text_tokenizer.id_to_token(self.eot_token_id)
        until = handle_stop_sequences(kwargs.pop("until", None), eos=eos)
        generator = self._generator(kwargs, task_names(requests))
        prompts = [self.tok_encode(request.args[0]) for request in requests]
        order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
        generated = generator.generate([prompts[i] for i in order], seed=self.seed)
        texts: list[str] = [""] * len(prompts)
        for i, ids in zip(order, generated):
            texts[i] = postprocess_generated_text(self.tok_decode(ids), until, None)
        return texts

    def _generator(self, kwargs: dict, tasks: str) -> decoding.Generator:
        """The generator for normalized generation kwargs (one per setting, compiled once per prompt length)."""
        unknown = sorted(set(kwargs) - {"max_gen_toks", *SAMPLING_KWARGS})
        if unknown:
            raise UserError(f"task {tasks}: generation_kwargs {unknown} are not supported here (supported: until, "
                            f"max_gen_toks, {', '.join(SAMPLING_KWARGS)}); remove them from the task's YAML.")
        max_gen_toks = kwargs["max_gen_toks"]
        if not 0 < max_gen_toks < self.max_length:
            raise UserError(f"task {tasks}: max_gen_toks={max_gen_toks} leaves no room for a context in the model's "
                            f"max_len {self.max_length}; set generation_kwargs.max_gen_toks below it in the task's "
                            "YAML.")
        settings = sampling(kwargs)
        num_beams = int(kwargs.get("num_beams") or 1)
        key = (max_gen_toks, settings, num_beams, float(kwargs.get("length_penalty", 1.0)))
        if key not in self._generators:
            self._generators[key] = decoding.Generator(
                self.config, self.params, self.partitioner, eod_id=self.eot_token_id, max_new_tokens=max_gen_toks,
                settings=settings, batch_size=self.batch_size, num_beams=num_beams, length_penalty=key[3])
        return self._generators[key]


def sampling(kwargs: dict) -> decoding.Sampling:
    """Greedy unless do_sample with a positive temperature (lm-eval's normalized kwargs), as transformers does."""
    temperature = float(kwargs.get("temperature") or 0.0)
    if not kwargs.get("do_sample") or temperature == 0.0:
        return decoding.Sampling(temperature=0.0)
    return decoding.Sampling(temperature, int(kwargs.get("top_k") or 0), float(kwargs.get("top_p") or 1.0))


def task_names(requests: Iterable) -> str:
    return ", ".join(sorted({str(request.task_name) for request in requests}))


def refusal(checkpoint: str, kind: str) -> str:
    """The one line refusing an encoder-decoder or encoder-only checkpoint, naming what it supports."""
    instead = {"encoder_decoder": "--task=seq2seq (and t5x_like.generate)",
               "encoder_only": "--task=classification (with a classification head)"}.get(kind, "the other --task values")
    causal = ", ".join(name for name, family in models.FAMILIES.items() if family.kind == "decoder_only")
    return (f"--task=lm_eval evaluates decoder-only (causal) checkpoints (families {causal}); "
            f"{checkpoint} is an {kind.replace('_', '-')} model, which lm-eval's requests do not fit: evaluate it "
            f"with {instead}.")
