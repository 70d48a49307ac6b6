"""What the migration tests share (tests/t5x_like/migration/): reading what `--print_config` shows."""
import ast
import re


def printed_config(text: str) -> dict:
    """--print_config's values: macros, `configurable.parameter`s (macro references resolved) and the resolved
    model config's fields as `model.<field>`."""
    values = {}
    for line in text.splitlines():
        model = re.match(r"^#     (\w+) = (.*)$", line)
        binding = re.match(r"^([\w.]+) = (.*)$", line)
        if model:
            values[f"model.{model[1]}"] = model[2]
        elif binding:
            values[binding[1]] = binding[2]
    resolved = {}
    for name, raw in values.items():
        raw = values.get(raw[1:], raw) if raw.startswith("%") else raw
        try:
            resolved[name] = ast.literal_eval(raw)
        except (ValueError, SyntaxError):
            resolved[name] = raw
    return resolved
