"""`python -m t5x_like.eval`: see t5x_like/eval/cli.py."""
from t5x_like.errors import exit_on_user_error
from t5x_like.eval.cli import main

if __name__ == "__main__":
    exit_on_user_error(main)()
