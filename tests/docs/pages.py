"""Which doc-command test module follows which page, and how (tests/docs/doc_commands.py's Page): each of
README.md and docs/*.md belongs to exactly one of the two (tests/docs/test_docs_site.py checks it). Two modules,
so `make test`'s two workers share the work."""
from tests.docs.doc_commands import Page

# test_docs_models.py: the model-family, data and configuration pages
MODEL_PAGES = {
    "docs/configure.md": Page(),
    "docs/neox.md": Page(("pile", "20B_tokenizer.json")),
    "docs/llama.md": Page(("wikitext-103", "lambada_test.jsonl", "my-llama", "openwebtext")),
    "docs/moe.md": Page(("my-qwen2-moe", "my-corpus")),
    "docs/cpm.md": Page(("cpm-generate", "zh", "cpm2-modelcenter", "lcsts", "lcqmc", "CPM-2-Finetune")),
    "docs/t5.md": Page(("t5-v1_1-base", "c4", "train.jsonl", "dev.jsonl")),
    "docs/bert.md": Page(("bert-base-uncased", "wiki", "BoolQ")),
    "docs/data.md": Page(("openwebtext", "wiki", "pairs.jsonl", "t5-v1_1-base")),
}

# test_docs_tools.py: the GPT-2 page and the pages that continue it (evaluation, generation, conversion, outputs),
# parallelism and migrating, and README.md
GPT2 = "docs/gpt2.md"
TOOL_PAGES = {
    "README.md": Page(),
    "docs/index.md": Page(),
    GPT2: Page(("openwebtext", "gpt2-bpe")),
    "docs/evaluation.md": Page(("wikitext-103", "lambada_test.jsonl"), after=GPT2),
    "docs/generation.md": Page(after=GPT2),
    "docs/conversion.md": Page(("gpt2",), after=GPT2),
    "docs/outputs.md": Page(after=GPT2),
    "docs/parallelism.md": Page(),
    "docs/attention.md": Page(),
    "docs/clusters.md": Page(),
    "docs/migrating.md": Page(("megatron", "train.json")),
    "docs/troubleshooting.md": Page(),
    "docs/benchmarks.md": Page(),
    "docs/testing.md": Page(),
    "docs/design.md": Page(),
    "docs/add_a_family.md": Page(),
    "docs/add_an_objective.md": Page(),
}
