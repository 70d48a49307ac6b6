"""The error configs raises for a preset name or size it does not have; the CLIs print it as one line."""


class PresetError(ValueError):
    """An unknown model preset or size; the message lists the known ones."""
