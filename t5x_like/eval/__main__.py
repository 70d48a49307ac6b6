"""`python -m t5x_like.eval`: see t5x_like/eval/cli.py."""
from t5x_like.eval.cli import main

if __name__ == "__main__":
    main()
