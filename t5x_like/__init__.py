"""t5x_like: a JAX/Flax SPMD pretraining stack (docs/design.md maps its rooms).

`from t5x_like import load_model` gives a checkpoint's tokenizer, logits and generation in Python
(t5x_like/inference/model.py; docs/generation.md, "From Python"). It is imported on first use, so that
`import t5x_like` stays cheap."""


def __getattr__(name: str):
    if name in ("load_model", "LoadedModel"):
        from t5x_like.inference import model

        return getattr(model, name)
    raise AttributeError(f"module 't5x_like' has no attribute {name!r}")
