"""`python -m t5x_like.migrate`'s machinery: reading upstream configurations (upstream.py, shell.py,
variables.py), translating them (model.py, batch.py, recipe.py, run.py; ignored.py lists what has no equivalent)
into a gin file (translate.py), and the rows that document each setting (rows.py, rendered into docs/migrating.md)."""
