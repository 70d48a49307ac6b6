"""What a user has before following a page: corpora, tokenizer files, Hugging Face folders, evaluation sets.

Each input is a small stand-in with the name and layout a user's copy has (a folder of .txt documents, Pile
shards as .jsonl.zst, a WikiExtractor tree, a transformers folder saved by save_pretrained, ...), built from
WikiText-103's validation articles and the real tokenizer files in ../shared/data, or from a few Chinese
sentences. `build(name, dest)` writes one of them under dest (built once per session, then copied).
"""
from __future__ import annotations

import functools
import json
import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.doc_commands import REPO, copy_into
from tests.support.shared_data import shared_file


CHINESE = [
    "今天天气很好，我们去公园散步。", "北京是中国的首都，有很多名胜古迹，比如故宫和天坛。",
    "清华大学位于北京市海淀区，成立于1911年。", "人工智能是计算机科学的一个分支。",
    "它企图了解智能的实质，并生产出一种新的能以人类智能相似的方式做出反应的智能机器。",
    "床前明月光，疑是地上霜。举头望明月，低头思故乡。", "春眠不觉晓，处处闻啼鸟。夜来风雨声，花落知多少。",
    "白日依山尽，黄河入海流。欲穷千里目，更上一层楼。", "长江是中国最长的河流，全长约六千三百公里。",
    "上海是一座国际化的大都市，也是中国的经济中心之一。", "学而时习之，不亦说乎？有朋自远方来，不亦乐乎？",
    "杭州是一座美丽的城市，西湖的风景非常迷人。", "他每天早上六点起床，先跑步半小时，然后吃早饭。",
    "这本书讲述了一个普通家庭在三十年里的变化。", "数据越多，模型学到的规律就越可靠。",
]


@functools.cache
def articles() -> tuple[str, ...]:
    """WikiText-103's validation articles (60, about 3,600 words each), one string per article."""
    found: list[list[str]] = []
    for line in shared_file("wikitext", "wt103-tokenized", "wiki.valid.tokens").read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if stripped.startswith("= ") and not stripped.startswith("= ="):
            found.append([])
        if found and stripped:
            found[-1].append(stripped)
    return tuple("\n".join(lines) for lines in found)


def chinese_documents(count: int = 40, sentences: int = 60) -> list[str]:
    rng = random.Random(0)
    return ["".join(rng.choice(CHINESE) for _ in range(sentences)) for _ in range(count)]


def _text_folder(dest: Path) -> None:
    dest.mkdir(parents=True)
    for i, text in enumerate(articles()):
        (dest / f"{i:04d}.txt").write_text(text + "\n", encoding="utf-8")


def _pile(dest: Path) -> None:
    import zstandard

    (dest / "train").mkdir(parents=True)
    for shard in range(2):
        lines = "".join(json.dumps({"text": t, "meta": {"pile_set_name": "Wikipedia (en)"}}) + "\n"
                        for t in articles()[shard::2])
        (dest / "train" / f"{shard:02d}.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress(lines.encode()))


def _wikiextractor(dest: Path) -> None:
    folder = dest / "text" / "AA"
    folder.mkdir(parents=True)
    for shard in range(2):
        docs = [f'<doc id="{i}" url="https://en.wikipedia.org/wiki?curid={i}" title="{t.splitlines()[0].strip("= ")}">\n'
                f"{t}\n</doc>\n" for i, t in enumerate(articles()) if i % 2 == shard]
        (folder / f"wiki_{shard:02d}").write_text("".join(docs), encoding="utf-8")


def _c4(dest: Path) -> None:
    import gzip

    (dest / "en").mkdir(parents=True)
    for shard in range(2):
        lines = "".join(json.dumps({"text": t, "timestamp": "2019-04-25T12:57:54Z", "url": f"https://example.com/{i}"})
                        + "\n" for i, t in enumerate(articles()[shard::2]))
        (dest / "en" / f"c4-train.{shard:05d}-of-01024.json.gz").write_bytes(gzip.compress(lines.encode()))


def _wikitext_test(dest: Path) -> None:
    dest.mkdir(parents=True)
    lines = shared_file("wikitext", "wt103-tokenized", "wiki.test.tokens").read_text(encoding="utf-8").splitlines()
    kept, words = [], 0
    while words < 850:  # about 1,100 GPT-2 tokens: one 1024-token window and a few 32-token strides
        kept.append(lines[len(kept)])
        words += len(kept[-1].split())
    (dest / "wiki.test.tokens").write_text("\n".join(kept) + "\n", encoding="utf-8")


def _lambada(dest: Path) -> None:
    lines = shared_file("lambada", "lambada_test.jsonl").read_text(encoding="utf-8").splitlines()
    dest.write_text("\n".join(lines[:8]) + "\n", encoding="utf-8")


def _pairs(split: int, count: int):
    def build(dest: Path) -> None:
        rows = []
        for text in articles()[split::2]:
            for sentence in text.split(" . ")[1:9]:
                words = sentence.split()
                if len(words) > 8:
                    rows.append({"inputs": "summarize: " + " ".join(words), "targets": " ".join(words[:6])})
        dest.write_text("".join(json.dumps(r) + "\n" for r in rows[:count]), encoding="utf-8")
    return build


def _boolq(dest: Path) -> None:
    dest.mkdir(parents=True)
    for name, part in (("train.jsonl", 0), ("val.jsonl", 1)):
        rows = []
        for i, text in enumerate(articles()[part::2]):
            title = text.splitlines()[0].strip("= ")
            passage = " ".join(text.split()[:80])
            rows.append({"question": f"is {title.lower()} in the passage", "passage": passage, "idx": i,
                         "label": i % 3 != 0})
        (dest / name).write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")


def _gpt2_hf(dest: Path) -> None:
    import transformers

    bpe = shared_file("gpt2-bpe")
    transformers.set_seed(0)
    model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=50257, n_positions=1024, n_embd=32, n_layer=2, n_head=4))
    model.save_pretrained(dest)
    shutil.copy(bpe / "encoder.json", dest / "vocab.json")
    shutil.copy(bpe / "vocab.bpe", dest / "merges.txt")
    transformers.AutoTokenizer.from_pretrained(dest).save_pretrained(dest)  # + tokenizer.json, as the Hub's folder


def _llama_hf(dest: Path) -> None:
    """A Llama-2-style folder: a tiny random LlamaForCausalLM and a tokenizer.json whose post-processor puts `<s>`
    first (GPT-NeoX's 20B vocabulary with `<s>` added: tests/support/hf_models.bos_tokenizer)."""
    import transformers

    from tests.support import hf_models

    tokenizer = hf_models.bos_tokenizer(dest)
    transformers.set_seed(0)
    transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id)).save_pretrained(dest)



def _qwen2_moe_hf(dest: Path) -> None:
    """A Qwen1.5-MoE-style folder: a tiny random Qwen2MoeForCausalLM (4 experts, top-2, a shared expert), as
    save_pretrained writes it (one tensor per expert), with a byte-level BPE of 1000 ids (`<|endoftext|>` its end of
    text, as Qwen's) trained on the builtin corpus's first documents."""
    import tokenizers
    import transformers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    from t5x_like.data.builtin import builtin_documents

    bpe = tokenizers.Tokenizer(models.BPE())
    bpe.pre_tokenizer, bpe.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    bpe.train_from_iterator(builtin_documents()[:200], trainers.BpeTrainer(
        vocab_size=1000, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>")
    transformers.set_seed(0)
    transformers.Qwen2MoeForCausalLM(transformers.Qwen2MoeConfig(
        vocab_size=1000, hidden_size=32, intermediate_size=64, moe_intermediate_size=16,
        shared_expert_intermediate_size=32, num_experts=4, num_experts_per_tok=2, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
        eos_token_id=tokenizer.eos_token_id)).save_pretrained(dest)
    tokenizer.save_pretrained(dest)


def _my_corpus(dest: Path) -> None:
    """A user's own corpus: a folder of .txt documents (the builtin corpus's, which needs nothing beside the
    checkout)."""
    from t5x_like.data.builtin import builtin_documents

    dest.mkdir(parents=True)
    for i, text in enumerate(builtin_documents()[:120]):
        (dest / f"{i:04d}.txt").write_text(text + "\n", encoding="utf-8")

def _t5_hf(dest: Path) -> None:
    import transformers

    transformers.set_seed(0)
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(
        vocab_size=32128, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, feed_forward_proj="gated-gelu",
        tie_word_embeddings=False, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1))
    model.save_pretrained(dest)
    shutil.copy(shared_file("t5-spiece", "spiece.model"), dest / "spiece.model")


def _bert_hf(dest: Path) -> None:
    import transformers

    from t5x_like.data.train_tokenizer import train_wordpiece, write_vocab_txt

    dest.mkdir(parents=True)
    vocab = train_wordpiece(articles(), 2000, lowercase=True)
    write_vocab_txt(vocab, str(dest / "vocab.txt"), lowercase=True)
    transformers.set_seed(0)
    transformers.BertForMaskedLM(transformers.BertConfig(
        vocab_size=len(vocab), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=512)).save_pretrained(dest)


def _zh(dest: Path) -> None:
    dest.mkdir(parents=True)
    for i, text in enumerate(chinese_documents()):
        (dest / f"{i:03d}.txt").write_text(text + "\n", encoding="utf-8")


def _cpm_generate(dest: Path) -> None:
    import sentencepiece
    import transformers

    from t5x_like.data.train_tokenizer import train

    dest.mkdir(parents=True)
    train(chinese_documents(), "cpm", 500, str(dest / "spiece.model"))  # the corpus allows 475..517
    pieces = sentencepiece.SentencePieceProcessor(model_file=str(dest / "spiece.model")).get_piece_size()
    transformers.set_seed(0)
    transformers.GPT2LMHeadModel(transformers.GPT2Config(
        vocab_size=pieces, n_positions=1024, n_embd=32, n_layer=2, n_head=4)).save_pretrained(dest)


def _cpm2_modelcenter(dest: Path) -> None:
    """A tiny CPM-2 in ModelCenter's layout (config.json, pytorch_model.pt, CPM-2's real vocab.txt); 4 heads, so
    the migrated CPM-2-Finetune run's TENSOR_PARALLEL=4 divides them."""
    from tests.support import cpm2

    cpm2.write_modelcenter_folder(cpm2.reference_t5(vocab_size=26240, num_heads=4, d_kv=8), dest,
                                  shared_file("cpm2", "vocab.txt"))


def _lcsts(dest: Path) -> None:
    """CPM-2-Finetune's LCSTS layout: lcsts/{train,dev}.jsonl of {"text", "summary"} (Chinese)."""
    from tests.support import cpm2

    cpm2.write_lcsts(dest)


def _lcqmc(dest: Path) -> None:
    """CPM-2-Finetune's LCQMC layout: lcqmc/{train,dev}.jsonl of {"sentence1", "sentence2", "label"}."""
    from tests.support import cpm2

    cpm2.write_lcqmc(dest)


def _cpm2_finetune(dest: Path) -> None:
    """The parts of a CPM-2-Finetune clone its full_model scripts read (tests/data/upstream/cpm2_finetune, as
    upstream wrote them), the LCSTS script with the three lines its README has users set (WORKING_DIR, DATA_PATH,
    CKPT_PATH) set to this folder, lcsts/ and the checkpoint docs/cpm.md converts."""
    upstream = REPO / "tests" / "data" / "upstream" / "cpm2_finetune"
    for folder, name in (("configs/model", "cpm2_config.json"), ("configs/deepspeed", "ds_full_model.json")):
        (dest / folder).mkdir(parents=True, exist_ok=True)
        (dest / folder / name).write_bytes((upstream / name).read_bytes())
    (dest / "bpe_cn").mkdir()
    (dest / "bpe_cn" / "vocab.txt").write_bytes(shared_file("cpm2", "vocab.txt").read_bytes())
    script = (upstream / "finetune_cpm2_lcsts.sh").read_text()
    for name, value in (("WORKING_DIR", "CPM-2-Finetune"), ("DATA_PATH", '"lcsts"'), ("CKPT_PATH", '"runs/cpm2"')):
        script = re.sub(rf"^{name}=.*$", f"{name}={value}", script, count=1, flags=re.M)
    (dest / "scripts" / "full_model").mkdir(parents=True)
    (dest / "scripts" / "full_model" / "finetune_cpm2_lcsts.sh").write_text(script)


def _gpt2_chinese(dest: Path) -> None:
    dest.write_text(json.dumps(chinese_documents(), ensure_ascii=False), encoding="utf-8")


def _megatron(dest: Path) -> None:
    """Megatron-LM's GPT-2 tutorial files: gpt2-vocab.json, gpt2-merges.txt and the token file its
    preprocess_data.py writes (my-gpt2_text_document.bin + .idx, no metadata)."""
    bpe = shared_file("gpt2-bpe")
    dest.mkdir(parents=True)
    shutil.copy(bpe / "encoder.json", dest / "gpt2-vocab.json")
    shutil.copy(bpe / "vocab.bpe", dest / "gpt2-merges.txt")
    corpus = dest / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": t}) + "\n" for t in articles()), encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "t5x_like.data.preprocess", f"--input={corpus}",
                           f"--output_prefix={dest / 'my-gpt2_text_document'}", f"--tokenizer={bpe}"],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    corpus.unlink()
    (dest / "my-gpt2_text_document.json").unlink()


BUILDERS = {
    "gpt2-bpe": lambda dest: copy_into(shared_file("gpt2-bpe"), dest),
    "20B_tokenizer.json": lambda dest: copy_into(shared_file("gpt-neox-20b-tokenizer", "20B_tokenizer.json"), dest),
    "openwebtext": _text_folder,
    "pile": _pile,
    "wiki": _wikiextractor,
    "wikitext-103": _wikitext_test,
    "lambada_test.jsonl": _lambada,
    "c4": _c4,
    "pairs.jsonl": _pairs(0, 64),
    "train.jsonl": _pairs(0, 64),
    "dev.jsonl": _pairs(1, 16),
    "BoolQ": _boolq,
    "gpt2": _gpt2_hf,
    "t5-v1_1-base": _t5_hf,
    "my-llama": _llama_hf,
    "my-qwen2-moe": _qwen2_moe_hf,
    "my-corpus": _my_corpus,
    "bert-base-uncased": _bert_hf,
    "zh": _zh,
    "cpm-generate": _cpm_generate,
    "cpm2-modelcenter": _cpm2_modelcenter,
    "lcsts": _lcsts,
    "lcqmc": _lcqmc,
    "CPM-2-Finetune": _cpm2_finetune,
    "train.json": _gpt2_chinese,
    "megatron": _megatron,
}
"""Input name (its path in a page's working directory) -> builder; 'megatron' is a folder of several files
that are copied to the top of the working directory."""


class Inputs:
    """Builds each input once in `store` and copies it into working directories."""

    def __init__(self, store: Path):
        self.store = store

    def path(self, name: str) -> Path:
        built = self.store / name
        if not built.exists():
            partial = self.store / f"{name}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            BUILDERS[name](partial)
            partial.rename(built)
        return built

    def copy(self, names: list[str], workdir: Path) -> None:
        for name in names:
            built = self.path(name)
            if name == "megatron":
                for item in built.iterdir():
                    copy_into(item, workdir / item.name)
            else:
                copy_into(built, workdir / name)
