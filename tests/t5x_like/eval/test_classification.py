"""Classification fine-tuning of encoder-only models (CPU): JSONL / TSV / BoolQ examples become [CLS] text
[SEP] pair [SEP] rows with token types and label indices (bad labels and fields refused), a tiny BERT
trained with OBJECTIVE='classification' on a small separable synthetic set reaches >= 95 % dev accuracy,
`eval --task=classification` reports it with each prediction, and transformers' BertForSequenceClassification
of the converted checkpoint predicts the same labels on the same rows."""
import dataclasses
import functools
import json

import flax.linen as nn
import jax
import numpy as np
import pytest

from models.bert import BertConfig
from partitioning import make_mesh
from t5x_like import optim
from t5x_like.checkpoint import store
from t5x_like.data import SourceSettings, load_tokenizer, make_source
from t5x_like.data.objectives.classification import classification_examples, encode_pair, read_labelled
from t5x_like.data.objectives.mlm import mlm_vocabulary
from t5x_like.errors import UserError
from t5x_like.eval import cli as eval_cli
from t5x_like.experiment import ExperimentSettings
from t5x_like.features import CLASSIFICATION_LABELS, ENCODER_INPUT_TOKENS, ENCODER_SEGMENT_IDS, ENCODER_TOKEN_TYPES
from t5x_like.lm import make_lm
from t5x_like.run import loop
from t5x_like.run.settings import LoopSettings, RunSettings

WORDS = ["the", "a", "cat", "dog", "sat", "on", "mat", "ran", "far", "away", "it", "was", "red", "blue", "big",
         "small", "tree", "house", "river", "stone", "alpha", "omega"]
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
LENGTHS = {"inputs": 24}


@pytest.fixture(scope="module")
def tokenizer_path(tmp_path_factory):
    """A WordPiece tokenizer.json (BERT's normaliser and pre-tokeniser) over WORDS, built with `tokenizers`."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

    vocab = {piece: i for i, piece in enumerate(SPECIALS + WORDS)}
    tokenizer = Tokenizer(models.WordPiece(vocab, unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    path = tmp_path_factory.mktemp("tokenizer") / "tokenizer.json"
    tokenizer.save(str(path))
    return str(path)


def synthetic(path, count, seed):
    """Separable examples: the label is 'pos' when the text holds 'alpha', 'neg' when it holds 'omega'; a
    random second segment (text_pair) carries no signal."""
    rng = np.random.default_rng(seed)
    fillers = WORDS[:-2]
    with open(path, "w") as f:
        for _ in range(count):
            positive = bool(rng.integers(2))
            words = list(rng.choice(fillers, 6))
            words.insert(int(rng.integers(7)), "alpha" if positive else "omega")
            pair = " ".join(rng.choice(fillers, 5))
            example = {"text": " ".join(words), "text_pair": pair, "label": "pos" if positive else "neg"}
            f.write(json.dumps(example) + "\n")
    return str(path)


CONFIG = BertConfig(vocab_size=len(SPECIALS) + len(WORDS), max_len=32, num_layers=2, num_heads=4, embed_dim=32,
                    mlp_dim=64, dropout_rate=0.0, attention_dropout_rate=0.0, head="classification", num_labels=2,
                    labels=("neg", "pos"), dtype="float32")


def test_rows_are_cls_text_sep_pair_sep_with_token_types(tokenizer_path, tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps({"text": "the cat", "text_pair": "a dog ran", "label": "pos"}) + "\n"
                    + json.dumps({"text": "red tree", "label": "neg"}) + "\n")
    source = make_source("train",
                         SourceSettings(objective="classification", data_path={"train": str(path)},
                                        tokenizer=tokenizer_path, labels=["neg", "pos"]),
                         batch_size=2, feature_lengths=LENGTHS, seed=0, shard_index=0, shard_count=1)
    batch = next(source)
    first = sorted(range(2), key=lambda r: -batch[ENCODER_SEGMENT_IDS][r].sum())[0]  # the pair (the order is shuffled)
    ids = {piece: i for i, piece in enumerate(SPECIALS + WORDS)}
    want = [ids[w] for w in ("[CLS]", "the", "cat", "[SEP]", "a", "dog", "ran", "[SEP]")]
    np.testing.assert_array_equal(batch[ENCODER_INPUT_TOKENS][first, :8], want)
    np.testing.assert_array_equal(batch[ENCODER_TOKEN_TYPES][first, :8], [0, 0, 0, 0, 1, 1, 1, 1])
    assert batch[ENCODER_SEGMENT_IDS][first].sum() == 8 and batch[CLASSIFICATION_LABELS][first, 0] == 1
    assert (batch[ENCODER_INPUT_TOKENS][first, 8:] == ids["[PAD]"]).all()


class FakeTokenizer:
    def __init__(self, specials):
        self.specials, self.vocab_size, self.eod_id, self.path = specials, 30, 3, "fake"

    def token_to_id(self, token):
        return self.specials.get(token)


def test_pairs_are_cut_longest_first_bert_and_roberta_style():
    bert = mlm_vocabulary(FakeTokenizer({"[CLS]": 2, "[SEP]": 3, "[MASK]": 4, "[PAD]": 0}))
    ids, types = encode_pair(np.arange(10, 20), np.arange(20, 24), bert, False, 12)
    np.testing.assert_array_equal(ids, [2, 10, 11, 12, 13, 14, 3, 20, 21, 22, 23, 3])  # 10 + 4 cut to 5 + 4
    np.testing.assert_array_equal(types, [0] * 7 + [1] * 5)
    roberta = mlm_vocabulary(FakeTokenizer({"<s>": 0, "</s>": 2, "<mask>": 4, "<pad>": 1}))
    ids, types = encode_pair(np.arange(10, 13), np.arange(20, 22), roberta, True, 12)
    np.testing.assert_array_equal(ids, [0, 10, 11, 12, 2, 2, 20, 21, 2])
    np.testing.assert_array_equal(types, [0] * 9)


def test_boolq_fields_and_tsv_are_read(tmp_path):
    boolq = tmp_path / "boolq.jsonl"
    boolq.write_text(json.dumps({"question": "is it red", "passage": "it was red", "label": True, "idx": 0}) + "\n")
    [example] = read_labelled(str(boolq))
    assert (example.text, example.text_pair, example.label) == ("is it red", "it was red", "True")
    tsv = tmp_path / "x.tsv"
    tsv.write_text("label\ttext\n1\tthe cat\n")
    [example] = read_labelled(str(tsv))
    assert (example.text, example.text_pair, example.label) == ("the cat", None, "1")


@pytest.mark.parametrize("line, message", [
    ({"text": "the cat", "label": "maybe"}, r"x.jsonl: label 'maybe' is not in the label list \['neg', 'pos'\]"),
    ({"label": "pos"}, r"x.jsonl:1: no field 'text'"),
    ({"text": 3, "label": "pos"}, r"x.jsonl:1: field 'text' is int"),
])
def test_bad_examples_are_refused(tokenizer_path, tmp_path, line, message):
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps(line) + "\n")
    with pytest.raises(UserError, match=message):
        classification_examples(str(path), load_tokenizer(tokenizer_path), ["neg", "pos"], 16)


@pytest.mark.integration
def test_fine_tuning_reaches_95_percent_and_eval_matches_transformers(tokenizer_path, tmp_path, caplog):
    """... and validation during training counts every dev example once: EVAL_STEPS x BATCH_SIZE = 96 rows over
    70 questions reads them once (said once), its loss is transformers' mean over the 70."""
    torch = pytest.importorskip("torch", reason="needs the torch extra (torch, transformers)")
    transformers = pytest.importorskip("transformers", reason="needs the torch extra (torch, transformers)")
    from t5x_like.convert import hf

    data = {"train": synthetic(tmp_path / "train.jsonl", 512, 0),
            "validation": synthetic(tmp_path / "dev.jsonl", 70, 1)}
    source = functools.partial(make_source, settings=SourceSettings(objective="classification", data_path=data,
                                                                    tokenizer=tokenizer_path, labels=["neg", "pos"]))
    experiment = ExperimentSettings(
        model=CONFIG, mesh=make_mesh(data=2, devices=jax.devices()[:2]), batch_size=16, feature_lengths=LENGTHS,
        optimizer=optim.OptimizerSettings(learning_rate=2e-3, warmup_steps=5, weight_decay=0.01))
    with caplog.at_level("WARNING"):
        loop.train(RunSettings(loop=LoopSettings(model_dir=str(tmp_path / "run"), train_steps=80, eval_every=40,
                                                 eval_steps=6, log_every=20, checkpoint_every=40),
                               experiment=experiment), data_source=source)
    said = [r.getMessage() for r in caplog.records if "EVAL_STEPS=6" in r.getMessage()]
    assert len(said) == 1 and "holds only 5 global batches" in said[0]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    halfway, validation = [r for r in rows if "eval_accuracy" in r]
    assert validation["eval_accuracy"] >= 0.95  # validation: label accuracy

    result = eval_cli.main(["--task=classification", f"--checkpoint={tmp_path / 'run'}", f"--data={data['validation']}",
                            f"--output={tmp_path / 'res.json'}", "--batch_size=16"])
    assert result["accuracy"] >= 0.95 and result["num_examples"] == 70 and "f1" in result
    assert validation["eval_accuracy"] == result["accuracy"]
    written = json.loads((tmp_path / "res.json").read_text())
    assert written["accuracy"] == result["accuracy"] and len(written["predictions"]) == 70
    assert {p["prediction"] for p in written["predictions"]} <= {"neg", "pos"}

    ids, gold, _ = classification_examples(data["validation"], load_tokenizer(tokenizer_path), ["neg", "pos"], 24)
    length = max(len(t) for t, _ in ids)
    tokens = np.zeros((len(ids), length), np.int64)
    types, mask = np.zeros_like(tokens), np.zeros_like(tokens)
    for i, (t, tt) in enumerate(ids):
        tokens[i, :len(t)], types[i, :len(t)], mask[i, :len(t)] = t, tt, 1

    def transformers_logits(checkpoint):
        hf.to_hf(checkpoint, str(tmp_path / "hf"))
        model = transformers.BertForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
        assert model.config.id2label == {0: "neg", 1: "pos"}
        with torch.no_grad():
            return model(torch.tensor(tokens), attention_mask=torch.tensor(mask),
                         token_type_ids=torch.tensor(types)).logits

    theirs = transformers_logits(str(tmp_path / "run")).argmax(-1).numpy()
    ours = [["neg", "pos"].index(p["prediction"]) for p in written["predictions"]]
    np.testing.assert_array_equal(ours, theirs)
    assert float((theirs == gold).mean()) == result["accuracy"]
    logits = transformers_logits(str(tmp_path / "run" / "checkpoints" / "40"))  # not yet sure of every answer
    mean_nll = float(torch.nn.functional.cross_entropy(logits, torch.tensor(gold, dtype=torch.long)))  # 70, once each
    assert halfway["eval_loss"] == pytest.approx(mean_nll, rel=1e-4)
    assert halfway["eval_accuracy"] == float((logits.argmax(-1).numpy() == gold).mean())


def restored_run(tmp_path, name, config, restore_from, tokenizer_path, labels):
    """A run of `config` from RESTORE_FROM with learning rate 0 (AdamW's decay scales with it): its
    checkpoint holds the parameters it started from."""
    data = {"train": synthetic(tmp_path / "train.jsonl", 64, 0)}
    source = functools.partial(make_source, settings=SourceSettings(objective="classification", data_path=data,
                                                                    tokenizer=tokenizer_path, labels=labels))
    experiment = ExperimentSettings(
        model=config, mesh=make_mesh(data=2, devices=jax.devices()[:2]), batch_size=8, feature_lengths=LENGTHS,
        optimizer=optim.OptimizerSettings(learning_rate=0.0, warmup_steps=0))
    loop.train(RunSettings(loop=LoopSettings(model_dir=str(tmp_path / name), train_steps=2, restore_from=restore_from,
                                             checkpoint_every=2, log_every=1), experiment=experiment),
               data_source=source)
    info = store.read_model_info(str(tmp_path / name))
    return store.restore_params(str(tmp_path / name), store.stored_param_shapes(str(tmp_path / name))), info


@pytest.mark.integration
def test_restore_from_a_masked_lm_checkpoint_keeps_the_encoder_and_starts_the_classifier_fresh(tokenizer_path,
                                                                                                  tmp_path):
    mlm = dataclasses.replace(CONFIG, head="mlm", num_labels=2, labels=())
    pretrained = nn.meta.unbox(make_lm(mlm).init(jax.random.key(7), LENGTHS))
    store.save_params(str(tmp_path / "mlm"), 0, pretrained, {"config": dataclasses.asdict(mlm),
                                                                     "tokenizer": tokenizer_path})
    params, info = restored_run(tmp_path, "cls", CONFIG, str(tmp_path / "mlm"), tokenizer_path, ["neg", "pos"])
    assert info["config"]["head"] == "classification" and info["config"]["labels"] == ["neg", "pos"]
    assert "mlm_head" not in params and set(params["classifier_head"]) == {"pooler", "classifier"}
    shared = {k: v for k, v in pretrained.items() if k != "mlm_head"}
    jax.tree.map(np.testing.assert_array_equal, {k: params[k] for k in shared}, shared)  # the encoder, exactly

    # another label count: the 2-label classifier cannot serve, so it starts fresh; the encoder is kept
    three = make_lm(dataclasses.replace(CONFIG, num_labels=3, labels=("neg", "pos", "odd")))
    abstract, _ = three.abstract_params()
    replicated = jax.sharding.NamedSharding(make_mesh(data=1, devices=jax.devices()[:1]), jax.sharding.PartitionSpec())
    restored, fresh = store.restore_pretrained(
        str(tmp_path / "cls"), jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicated),
                                            abstract), ("mlm_head", "classifier_head"))
    assert fresh == ["classifier_head"] and set(restored) == set(shared)
    jax.tree.map(np.testing.assert_array_equal, restored, shared)
