"""``python -m tf_mixed``: the command line lives in `tf_mixed.cli.main`.

`tf_mixed/__init__.py` imports nothing heavy, so the CLI can set TensorFlow's
log level before TensorFlow is first imported.
"""

from tf_mixed.cli.main import main, run

__all__ = ["main", "run"]

if __name__ == "__main__":
    run()
