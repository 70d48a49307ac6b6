"""CPM-2's references for the tests: ModelCenter's CPM2Tokenizer transcribed, and a tiny CPM-2 in ModelCenter's
layout built from transformers' T5 with the exact GELU (the reference model).

`ModelCenterCPM2Tokenizer` is a transcription of OpenBMB/ModelCenter's
`model_center/tokenizer/cpm2_tokenizer.py` (ModelCenter 1.0.2, the `CPM2Tokenizer` and `WordpieceTokenizer`
classes and `load_vocab`), with `from_pretrained`'s space and line tokens (`▂`, `▃`), q2b off, and python 2's
branches and the web download left out. model_center itself needs bmtrain and CUDA, so it is not installed.
`MODELCENTER_NAMES` is ModelCenter's `transfer/hugFLANT5_bmtrainFLANT5.py`: transformers' T5 names -> ModelCenter's.
"""
from __future__ import annotations

import collections
import json
from pathlib import Path

import jieba
import numpy as np


def load_vocab(vocab_file):
    vocab = collections.OrderedDict()
    index = 0
    with open(vocab_file, "r", encoding="utf-8") as reader:
        while True:
            token = reader.readline()
            if not token:
                break
            token = token.strip()
            vocab[token] = index
            index += 1
    return vocab


def is_contain_chinese(check_str):
    return any(u'\u4e00' <= ch <= u'\u9fff' for ch in check_str)


def is_contain_point(check_str):
    return any(u'0' <= ch <= u'9' for ch in check_str)


class WordpieceTokenizer:
    def __init__(self, vocab, unk_token="<unk>", max_input_chars_per_word=200):
        self.vocab, self.unk_token, self.max_input_chars_per_word = vocab, unk_token, max_input_chars_per_word

    def tokenize(self, token):
        chars = list(token)
        if len(chars) > self.max_input_chars_per_word:
            return [self.unk_token]
        start = 0
        sub_tokens = []
        while start < len(chars):
            end = len(chars)
            cur_substr = None
            while start < end:
                substr = "".join(chars[start:end])
                if is_contain_chinese(substr) or is_contain_point(substr):
                    if substr in self.vocab:
                        cur_substr = substr
                        break
                else:
                    if substr in self.vocab:
                        cur_substr = substr
                        break
                end -= 1
            if cur_substr is None:
                sub_tokens.append(self.unk_token)
                start += 1
                continue
            sub_tokens.append(cur_substr)
            start = end
        return sub_tokens


class ModelCenterCPM2Tokenizer:
    """CPM2Tokenizer.from_pretrained(folder): __init__(vocab, space_token='▂', line_token='▃'), encode, decode."""

    def __init__(self, vocab_file, max_sentinels=190, unk_token='<unk>', line_token='\u2583', space_token='\u2582'):
        self.unk_token, self.line_token, self.space_token = unk_token, line_token, space_token
        self.encoder = load_vocab(vocab_file)
        self.encoder[self._space_token] = len(self.encoder)
        self.encoder[self._line_token] = len(self.encoder)
        self.decoder = {v: k for k, v in self.encoder.items()}
        self.wordpiece_tokenizer = WordpieceTokenizer(vocab=self.encoder, unk_token=self.unk_token)
        self.trans_common = str.maketrans(" \n", "\u2582\u2583")
        self.sentinel_list = [self.encoder['<s_{}>'.format(i)] for i in range(max_sentinels)]
        self._space_id = self.encoder[self._space_token]
        self._line_id = self.encoder[self._line_token]
        self.space_id = self.encoder[self.space_token]
        self.line_id = self.encoder[self.line_token]

    _space_token = '\uFFF2'
    _line_token = '\uFFF3'

    @property
    def vocab_size(self):
        return len(self.encoder) - 2

    def get_sentinel_id(self, idx):
        return self.sentinel_list[idx]

    def tokenize(self, text):
        output_tokens = []
        for x in jieba.cut(text, cut_all=False):
            output_tokens.extend(self.wordpiece_tokenizer.tokenize(x.translate(self.trans_common)))
        return output_tokens

    def encode(self, text):
        text = text.replace("\n", self._line_token).replace(self.line_token, self._line_token) \
                   .replace(" ", self._space_token).replace(self.space_token, self._space_token)
        new_output_tokens = []
        for x in self.tokenize(text):
            x = self.encoder[x]
            if x == self._space_id:
                new_output_tokens.append(self.space_id)
            elif x == self._line_id:
                new_output_tokens.append(self.line_id)
            else:
                new_output_tokens.append(x)
        return new_output_tokens

    def decode(self, tokens):
        text = ''.join([self.decoder[x] for x in tokens])
        return text.replace(self._space_token, ' ').replace(self._line_token, '\n') \
                   .replace(self.space_token, ' ').replace(self.line_token, '\n')


def modelcenter_names(num_layers: int, num_decoder_layers: int) -> dict[str, str]:
    """transformers' T5 name -> ModelCenter's (hugFLANT5_bmtrainFLANT5.py)."""
    names = {"lm_head.weight": "output_projection.weight", "encoder.embed_tokens.weight": "input_embedding.weight",
             "encoder.final_layer_norm.weight": "encoder.output_layernorm.weight",
             "encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight":
                 "position_bias_enc.relative_attention_bias",
             "decoder.final_layer_norm.weight": "decoder.output_layernorm.weight",
             "decoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight":
                 "position_bias_dec.relative_attention_bias"}
    attention = {"q": "project_q", "k": "project_k", "v": "project_v", "o": "attention_out"}
    for stack, layers, ffn in (("encoder", num_layers, 1), ("decoder", num_decoder_layers, 2)):
        for i in range(layers):
            new, old = f"{stack}.layers.{i}", f"{stack}.block.{i}"
            names[f"{old}.layer.0.layer_norm.weight"] = f"{new}.self_att.layernorm_before_attention.weight"
            for h, m in attention.items():
                names[f"{old}.layer.0.SelfAttention.{h}.weight"] = f"{new}.self_att.self_attention.{m}.weight"
                if stack == "decoder":
                    names[f"{old}.layer.1.EncDecAttention.{h}.weight"] = f"{new}.cross_att.self_attention.{m}.weight"
            if stack == "decoder":
                names[f"{old}.layer.1.layer_norm.weight"] = f"{new}.cross_att.layernorm_before_attention.weight"
            names[f"{old}.layer.{ffn}.layer_norm.weight"] = f"{new}.ffn.layernorm_before_ffn.weight"
            for h, m in (("wi_0", "w_in.w_0"), ("wi_1", "w_in.w_1"), ("wo", "w_out")):
                names[f"{old}.layer.{ffn}.DenseReluDense.{h}.weight"] = f"{new}.ffn.ffn.{m}.weight"
    return names


SIZES = dict(d_model=32, d_kv=16, d_ff=48, num_layers=2, num_decoder_layers=2, num_heads=2)


def reference_t5(vocab_size: int, seed: int = 0, **sizes):
    """transformers' T5 v1.1 layout with the exact GELU ('gated-gelu_python'), untied and unscaled, its weights
    random (std 0.5, rounded to float16 as ModelCenter stores them); `sizes` replace SIZES' entries."""
    import torch
    import transformers

    config = transformers.T5Config(vocab_size=vocab_size, feed_forward_proj="gated-gelu_python",
                                   tie_word_embeddings=False, scale_decoder_outputs=False, dropout_rate=0.0,
                                   **(SIZES | sizes))
    torch.manual_seed(seed)
    model = transformers.T5ForConditionalGeneration(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_((torch.randn_like(p) * 0.5).half().float())
    assert model.config.dense_act_fn == "gelu_python" and model.config.is_gated_act
    return model


def write_modelcenter_folder(model, folder: Path, vocab: Path | None) -> dict[str, np.ndarray]:
    """config.json (CPM2Config's fields), pytorch_model.pt (float16, ModelCenter's names) and vocab.txt; returns
    the float16 tensors written."""
    import torch

    c = model.config
    names = modelcenter_names(c.num_layers, c.num_decoder_layers)
    state = {names[n]: t.detach().half().contiguous() for n, t in model.state_dict().items() if n in names}
    folder.mkdir(parents=True, exist_ok=True)
    torch.save(state, folder / "pytorch_model.pt")
    (folder / "config.json").write_text(json.dumps(dict(
        vocab_size=c.vocab_size, dim_model=c.d_model, num_heads=c.num_heads, dim_head=c.d_kv, dim_ff=c.d_ff,
        num_encoder_layers=c.num_layers, num_decoder_layers=c.num_decoder_layers, dropout_p=0.0,
        ffn_activate_fn="gated_gelu", tied=False, half=True, norm_eps=c.layer_norm_epsilon)))
    if vocab is not None:
        (folder / "vocab.txt").write_bytes(vocab.read_bytes())
    return {n: t.numpy() for n, t in state.items()}


def greedy(model, encoder_ids: list[int], start: list[int], steps: int, stop: int) -> list[int]:
    """transformers' model decoding greedily after `start`, recomputing every step (no cache)."""
    import torch

    decoder, out = list(start), []
    with torch.no_grad():
        for _ in range(steps):
            logits = model(input_ids=torch.tensor([encoder_ids]), decoder_input_ids=torch.tensor([decoder])).logits
            token = int(logits[0, -1].argmax())
            if token == stop:
                break
            out.append(token)
            decoder.append(token)
    return out


def cpm2_datasets_rows(tokenizer, path: Path) -> dict[str, np.ndarray]:
    """CPM-2-Finetune's CPM2Datasets.py for a file of its LCSTS layout (one `{"text", "summary"}` a line):
    LCSTSDataset.process_data (no prompt config, not do_infer, add_target_post=True) and CPM2Dataset.collate,
    transcribed; `tokenizer` is ModelCenterCPM2Tokenizer (its encode, get_sentinel_id and `<pad>`)."""
    pad_id = tokenizer.encoder["<pad>"]
    data, enc_sizes, dec_sizes = [], [], []
    for line in path.read_text(encoding="utf-8").splitlines(keepends=True):
        obj = json.loads(line)
        enc_input_ids = tokenizer.encode(obj["text"])
        target = [1, tokenizer.get_sentinel_id(0)] + tokenizer.encode(obj["summary"])
        target += [tokenizer.get_sentinel_id(1)]
        enc_sizes.append(len(enc_input_ids))
        dec_sizes.append(len(target) - 1)
        data.append({"enc_input_ids": enc_input_ids, "dec_input_ids": target[:-1], "label_ids": target[1:]})
    max_enc_len, max_dec_len, bs = max(enc_sizes), max(dec_sizes), len(data)
    rows = {"enc_input_ids": np.full((bs, max_enc_len), pad_id), "enc_mask": np.zeros((bs, max_enc_len)),
            "dec_input_ids": np.full((bs, max_dec_len), pad_id), "labels": np.full((bs, max_dec_len), pad_id),
            "loss_mask": np.zeros((bs, max_dec_len))}
    for i, samp in enumerate(data):
        enc_len, dec_len = len(samp["enc_input_ids"]), len(samp["dec_input_ids"])
        rows["enc_input_ids"][i][:enc_len] = samp["enc_input_ids"]
        rows["enc_mask"][i][:enc_len] = 1.0  # enc_attention_mask[i][0, :enc_len, :enc_len] = 1.0
        rows["dec_input_ids"][i][:dec_len] = samp["dec_input_ids"]
        rows["labels"][i][:len(samp["label_ids"])] = samp["label_ids"]
        rows["loss_mask"][i][:len(samp["label_ids"])] = 1.0
    return rows


LCQMC_RECORDS = [("喜欢打篮球的男生喜欢什么样的女生", "爱打篮球的男生喜欢什么样的女生", 1),
                 ("我手机丢了，我想换个手机", "我想买个新手机，求推荐", 1),
                 ("大家觉得她好看吗", "大家觉得跑男好看吗？", 0),
                 ("求秋色之空漫画全集", "求秋色之空全集漫画", 1),
                 ("晚上睡觉带着耳机听音乐有什么害处吗？", "孕妇可以戴耳机听音乐吗?", 0),
                 ("学日语软件手机上的", "手机学日语的软件", 1)]
"""LCQMC's records (sentence1, sentence2, label), as CPM-2-Finetune reads them from {"sentence1", "sentence2",
"label"} lines."""


def lcqmc_dataset_ids(tokenizer, records) -> list[dict[str, list[int]]]:
    """CPM-2-Finetune's CPM2Datasets.py LCQMCDataset.process_data (no prompt config, not do_infer,
    add_target_post=False), transcribed: each record's enc_input_ids, dec_input_ids and label_ids; `tokenizer` is
    ModelCenterCPM2Tokenizer (ids 39, 41, 62, 11, 1348 are “ ” 与 的 意思)."""
    label_word_map = ["矛盾", "相似"]
    data = []
    for sentence1, sentence2, label in records:
        context = [39] + tokenizer.encode(sentence1) + [41, 62, 39] + tokenizer.encode(sentence2) + \
            [41, 11, 1348, tokenizer.get_sentinel_id(0)]
        target = [1, tokenizer.get_sentinel_id(0)] + tokenizer.encode(label_word_map[label])
        data.append({"enc_input_ids": context, "dec_input_ids": target[:-1], "label_ids": target[1:]})
    return data


def write_lcqmc(folder: Path) -> Path:
    """CPM-2-Finetune's LCQMC layout: DATA_PATH/{train,dev}.jsonl, one {"sentence1", "sentence2", "label"} a line."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, records in (("train", LCQMC_RECORDS), ("dev", LCQMC_RECORDS[:2])):
        (folder / f"{name}.jsonl").write_text("".join(
            json.dumps({"sentence1": a, "sentence2": b, "label": label}, ensure_ascii=False) + "\n"
            for a, b, label in records), encoding="utf-8")
    return folder


LCSTS_PAIRS = [("清华大学的研究者发布了 CPM-2 模型，它有一百一十亿个参数。", "清华发布 CPM-2"),
               ("北京今天天气晴朗，气温二十度，适合出行。\n明天有雨。", "北京天气晴"),
               ("这家公司第三季度的收入增长了百分之十五，利润创下新高。", "公司收入增长"),
               ("研究人员在实验中发现了一种新的材料，可以用来制造更轻的电池。", "新材料可造轻电池"),
               ("足球比赛中主队以二比一战胜了客队，球迷们非常高兴。", "主队获胜"),
               ("图书馆将在下个月延长开放时间，方便学生晚上学习。", "图书馆延长开放")]


def write_lcsts(folder: Path) -> Path:
    """CPM-2-Finetune's LCSTS layout: DATA_PATH/{train,dev}.jsonl, one {"text", "summary"} a line."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, pairs in (("train", LCSTS_PAIRS), ("dev", LCSTS_PAIRS[:2])):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps({"text": t, "summary": s}, ensure_ascii=False) + "\n"
                                                      for t, s in pairs), encoding="utf-8")
    return folder
