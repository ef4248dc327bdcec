"""The docs' Python examples (README.md, docs/python.md) run as a user runs them, and print what the docs say."""

import pathlib
import subprocess
import sys

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "examples"


def run(name):
    result = subprocess.run([sys.executable, str(EXAMPLES / name)], capture_output=True, text=True,
                            cwd=EXAMPLES.parent / "tests" / "pypackage")
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_usage_example():
    assert run("usage.py") == "(2, 4, 768) [[1, 1, 0, 1], [0, 1, 2, 3]]\n"


def test_huggingface_example():
    assert run("huggingface.py") == "same as GPT-2's embedding path: True\n"


def test_huggingface_training_example():
    assert run("hf_training.py") == (
        "lm_head tied: True\n"
        "stock transformers reloads it and generates the same tokens: True\n")
