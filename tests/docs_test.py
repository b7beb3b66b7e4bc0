"""The docs run: every docstring example prints what it shows, and the README's
Python blocks run, on every backend."""

import doctest
import importlib
import pathlib
import pkgutil
import re

import keras
import numpy as np
import pytest

import kerasformer

README = pathlib.Path(__file__).resolve().parent.parent / "README.md"
MODULES = sorted(info.name for info in pkgutil.walk_packages(kerasformer.__path__, "kerasformer."))


class ShapeChecker(doctest.OutputChecker):
    """Reads a backend's shape object as the tuple the docs show.

    `.shape` is a tuple on JAX, but `TensorShape([2, 10, 64])` on TF and
    `torch.Size([2, 10, 64])` on torch.
    """

    SHAPE = re.compile(r"(?:TensorShape|torch\.Size)\(\[([0-9, ]*)\]\)")

    def check_output(self, want, got, optionflags):
        got = self.SHAPE.sub(lambda m: repr(tuple(int(n) for n in m.group(1).split(",") if n.strip())), got)
        return super().check_output(want, got, optionflags)


def docstring_examples(module_name):
    module = importlib.import_module(module_name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    return [test for test in finder.find(module, globs={"np": np, "keras": keras, **vars(module)}) if test.examples]


def test_the_docstrings_have_examples_to_run():
    """Guards the test below against finding nothing (a renamed package, a broken finder)."""
    with_examples = [name for name in MODULES if docstring_examples(name)]
    for name in ("kerasformer.layers.attention", "kerasformer.models.gpt", "kerasformer.losses", "kerasformer.optimizers"):
        assert name in with_examples


@pytest.mark.parametrize("module_name", MODULES)
def test_docstring_examples_print_what_they_show(module_name):
    runner = doctest.DocTestRunner(checker=ShapeChecker(), optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    for test in docstring_examples(module_name):
        keras.utils.set_random_seed(0)
        runner.run(test)
    results = runner.summarize(verbose=False)
    assert results.failed == 0, f"{results.failed} of {results.attempted} examples in {module_name} failed (see the output above)"


def readme_python_blocks():
    """The README's ```python blocks, but those that name a placeholder path
    ("path/to/gpt2": a Hugging Face checkpoint the reader has, which
    tests/models/convert_test.py makes and converts)."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    return [block for block in blocks if "path/to/" not in block]


def test_readme_python_blocks_run():
    blocks = readme_python_blocks()
    assert len(blocks) >= 2, "the README's Python blocks were not found"
    for block in blocks:
        namespace = {}
        exec(compile(block, str(README), "exec"), namespace)
        if isinstance(namespace.get("model"), keras.Model):
            assert namespace["model"].count_params() > 0
