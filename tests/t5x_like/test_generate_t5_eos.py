"""Encoder inputs get EOS at decoding as in training: `python -m t5x_like.generate` on converted tiny random
T5 v1.0 (tied, scaled) and v1.1 (untied) models with T5's spiece.model decodes text prompts, greedily and
with 3 beams, to the ids of transformers' generate fed by transformers' own T5 tokenizer (which appends
</s>). Where transformers cannot parse spiece.model here (sentencepiece's protobuf module against an older
protobuf runtime), its T5Tokenizer is built from the model's pieces and scores (read by sentencepiece):
still transformers' tokenizer and post-processor, checked to give sentencepiece's ids followed by EOS.
transformers' generate suppresses HF's 28 padding rows (ids 32100..32127), which our logits mask."""
from pathlib import Path

import pytest

from t5x_like import generate
from t5x_like.inference import decoding
from tests.support.shared_data import SHARED_DATA, needs_shared

torch = pytest.importorskip("torch", reason="needs the torch extra (torch, transformers)")
transformers = pytest.importorskip("transformers", reason="needs the torch extra (torch, transformers)")

SPIECE = SHARED_DATA / "t5-spiece" / "spiece.model"
pytestmark = needs_shared("t5-spiece", "spiece.model")

HF_SIZES = dict(vocab_size=32128, d_model=16, d_kv=8, d_ff=24, num_layers=2, num_decoder_layers=2, num_heads=2,
                relative_attention_num_buckets=8, relative_attention_max_distance=16, dropout_rate=0.0,
                decoder_start_token_id=0, pad_token_id=0, eos_token_id=1)
VERSIONS = {"v1.0": dict(feed_forward_proj="relu", tie_word_embeddings=True),
            "v1.1": dict(feed_forward_proj="gated-gelu", tie_word_embeddings=False)}
TEXTS = ["summarize: the quick brown fox jumps over the lazy dog", "translate English to German: The house is "
         "wonderful.", "question: what is two plus two?"]
NEW = 8
EOS = 1
REAL_IDS = 32100
"""spiece's 32000 pieces + 100 sentinels; HF's rows past them are padding, which our logits mask."""


def transformers_tokenizer(folder: Path):
    """transformers' T5 tokenizer of `folder` (AutoTokenizer), or, where it cannot read spiece.model, its
    T5Tokenizer over the pieces sentencepiece reads."""
    import sentencepiece

    try:
        from sentencepiece import sentencepiece_model_pb2  # noqa: F401 (what transformers parses spiece.model with)
        return transformers.AutoTokenizer.from_pretrained(folder)
    except Exception:  # noqa: BLE001 - a protobuf runtime older than sentencepiece's generated code
        sp = sentencepiece.SentencePieceProcessor(model_file=str(SPIECE))
        return transformers.T5Tokenizer(vocab=[(sp.id_to_piece(i), sp.get_score(i))
                                               for i in range(sp.get_piece_size())], extra_ids=100)


@pytest.fixture(scope="module", params=sorted(VERSIONS))
def converted(request, tmp_path_factory):
    """(our checkpoint directory, the HF model, transformers' tokenizer) for one T5 version."""
    from t5x_like.convert import hf

    path = tmp_path_factory.mktemp(f"t5eos_{request.param}")
    torch.manual_seed(0)
    model = transformers.T5ForConditionalGeneration(transformers.T5Config(**HF_SIZES, **VERSIONS[request.param]))
    if not VERSIONS[request.param]["tie_word_embeddings"]:
        model.lm_head.weight = torch.nn.Parameter(torch.empty_like(model.shared.weight))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    model.eval().save_pretrained(path / "hf")
    (path / "hf" / "spiece.model").write_bytes(SPIECE.read_bytes())
    hf.from_hf(str(path / "hf"), str(path / "ours"))
    return str(path / "ours"), model, transformers_tokenizer(path / "hf")


def theirs(model, input_ids: list[int], **beams) -> list[int]:
    with torch.no_grad():
        out = model.generate(input_ids=torch.tensor([input_ids]), max_new_tokens=NEW, do_sample=False,
                             eos_token_id=EOS, early_stopping=False, use_cache=False,
                             suppress_tokens=list(range(REAL_IDS, HF_SIZES["vocab_size"])), **beams)
    return decoding.cut_at(out[0, 1:].numpy(), EOS)


def test_transformers_tokenizer_appends_eos(converted):
    import sentencepiece

    _, _, tokenizer = converted
    sp = sentencepiece.SentencePieceProcessor(model_file=str(SPIECE))
    for text in TEXTS:
        assert tokenizer(text).input_ids == sp.encode(text) + [EOS]


@pytest.mark.parametrize("beams", [{}, {"num_beams": 3}], ids=["greedy", "beam3"])
def test_generate_equals_transformers_with_its_tokenizer(converted, beams):
    checkpoint, model, tokenizer = converted
    flags = [f"--num_beams={beams['num_beams']}"] if beams else ["--temperature=0"]
    records = generate.main([f"--checkpoint={checkpoint}", *(f"--prompt={t}" for t in TEXTS),
                             f"--max_new_tokens={NEW}", "--batch_size=4", *flags])
    want = [theirs(model, tokenizer(text).input_ids, **beams) for text in TEXTS]
    assert [r["tokens"] for r in records] == want
    without_eos = [theirs(model, tokenizer(text).input_ids[:-1], **beams) for text in TEXTS]
    assert without_eos != want  # the test tells the two conventions apart
