"""A small GPT-2 checkpoint for the lm-eval tests, trained briefly (torch) on the texts of the local test tasks
(tests/data/lm_eval) so that its greedy answers hit stop sequences and some continuations are its argmax; ours
is imported with `convert from-hf`, and the Hugging Face folder lm-eval's own backend reads is written back from
ours with `convert to-hf`, as a user would."""
import json
import shutil

import pytest

from tests.support.harness import TASKS

MAX_LEN = 128


def task_texts() -> list[str]:
    """The local tasks' texts as their prompts present them, each a document."""
    rows = {name: [json.loads(line) for line in (TASKS / name).read_text().splitlines()]
            for name in ("choices_train.jsonl", "choices_test.jsonl", "answers.jsonl", "documents.jsonl")}
    choices = [f"Question: {d['question']}\nAnswer: {d['choices'][d['answer']]}"
               for d in rows["choices_train.jsonl"] + rows["choices_test.jsonl"]]
    answers = [f"Q: {d['question']}\nA: {d['answer']}.\n" for d in rows["answers.jsonl"]]
    return choices + answers + [d["text"] for d in rows["documents.jsonl"]]


def train_briefly(model, tokenizer, texts: list[str], steps: int = 80) -> None:
    """Next-token training of the torch model on the texts back to back (end-of-document between them), on one
    thread (the suite runs a worker per core)."""
    import torch

    stream = [i for text in texts for i in tokenizer.encode(text).ids + [0]]
    windows = torch.tensor([stream[s:s + MAX_LEN] for s in range(0, len(stream) - MAX_LEN, MAX_LEN // 4)])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    model.train()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    for _ in range(steps):
        batch = windows[torch.randint(len(windows), (8,), generator=generator)]
        loss = model(batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    torch.set_num_threads(threads)
    model.eval()


@pytest.fixture(scope="session")
def causal_checkpoint(tmp_path_factory):
    """A folder holding ours/ (our checkpoint), hf/ (`convert to-hf` of it) and lm_eval_tasks/ (the local tasks,
    whose data_files are relative to this folder: run from it)."""
    torch = pytest.importorskip("torch", reason="needs the torch extra (torch, transformers)")
    transformers = pytest.importorskip("transformers", reason="needs the torch extra (torch, transformers)")
    pytest.importorskip("lm_eval", reason="needs the lm_eval extra")
    from t5x_like.convert import hf
    from t5x_like.data.train_tokenizer import train_byte_level_bpe

    root = tmp_path_factory.mktemp("lm_eval")
    shutil.copytree(TASKS, root / "lm_eval_tasks")
    texts = task_texts()
    tokenizer = train_byte_level_bpe(texts, 400)
    (root / "trained").mkdir()
    tokenizer.save(str(root / "trained" / "tokenizer.json"))
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=tokenizer.get_vocab_size(), n_positions=MAX_LEN, n_embd=32, n_layer=2, n_head=4, n_inner=64,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0))
    train_briefly(model, tokenizer, texts)
    model.save_pretrained(root / "trained")
    hf.from_hf(str(root / "trained"), str(root / "ours"), scan_layers=False)
    hf.to_hf(str(root / "ours"), str(root / "hf"))
    return root
