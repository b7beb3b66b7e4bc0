"""Shared test helpers: backend-independent conversion, seeding, precision."""

import gc
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# The suites compile thousands of small XLA programs (JAX's eager ops, TF and
# JAX train steps and loops) that then run a few times on tiny tensors, so
# compiling is most of their time. Without LLVM's optimization, JAX's generate
# and train tests ran 16-17% faster and TF's generate tests 11%; the arithmetic
# is the same (no fast-math either way). Large eager ops pay for it (JAX built
# gpt2-medium in 52 s instead of 22 s), but side by side as `.ci/run` runs
# them the JAX suite took 4520 s instead of 4865 s. Set before TF or JAX load,
# it reaches the tests' `kerasformer` subprocesses too.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_backend_optimization_level=0").strip()

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

BACKEND = keras.backend.backend()


def to_numpy(x):
    """Any backend's tensor (or a nested tuple of them) as float64-safe numpy."""
    if isinstance(x, (tuple, list)):
        return type(x)(to_numpy(v) for v in x)
    return np.asarray(keras.ops.convert_to_numpy(x))


def random_inputs(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


@pytest.fixture(autouse=True)
def _float32_seeded_and_collected():
    """Every test starts in float32 with fixed seeds, and restores the policy.

    Afterwards it collects the test's garbage: Keras models hold reference
    cycles, so a model's weights (1.3 GB for bert-large) outlive the test until
    Python's rare full collection, and a suite's memory grew past 10 GB.

    What survives is then frozen (`gc.freeze`), out of reach of the next
    test's collections: Keras runs a full `gc.collect()` each time a layer
    deletes a variable (`quantize` deletes every float kernel), and late in a
    suite each walked 1.4M objects (JAX: 62 of a quantized T5 test's 69 s).
    """
    policy = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float32")
    keras.utils.set_random_seed(1234)
    yield
    keras.config.set_dtype_policy(policy)
    gc.unfreeze()  # Objects of earlier tests that died since are collected too.
    gc.collect()
    gc.freeze()


def save_and_reload(model, tmp_path):
    path = tmp_path / "model.keras"
    model.save(path)
    return keras.saving.load_model(path)


def class_name_after_fresh_load(model, tmp_path, attribute, imports="kerasformer"):
    """Saves `model`, loads it in a new Python process that imports only `imports`,
    and returns the class name of the loaded model's `attribute` (e.g. "loss")."""
    import subprocess
    import sys

    path = str(tmp_path / "model.keras")
    model.save(path)
    code = f"import keras, {imports}; print(type(keras.saving.load_model({path!r}).{attribute}).__name__)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.strip().splitlines()[-1]


def value_and_gradients(function, *inputs, compiled=False):
    """`function(*inputs)` (a scalar) and its gradients with respect to each input, as numpy.

    `compiled` runs it under `jax.jit`, `tf.function(jit_compile=True)` (XLA,
    where kerasformer has code paths of its own) or `torch.compile` (what
    `jit_compile=True` means on torch).
    """
    if BACKEND == "jax":
        import jax

        step = jax.value_and_grad(function, argnums=tuple(range(len(inputs))))
        value, gradients = (jax.jit(step) if compiled else step)(*inputs)
    elif BACKEND == "tensorflow":
        import tensorflow as tf

        def step(*tensors):
            with tf.GradientTape() as tape:
                tape.watch(tensors)
                value = function(*tensors)
            return value, tape.gradient(value, tensors)

        tensors = [tf.constant(x) for x in inputs]
        value, gradients = tf.function(step, jit_compile=True)(*tensors) if compiled else step(*tensors)
    else:
        import torch

        leaves = [torch.tensor(x, requires_grad=True) for x in inputs]
        value = (torch.compile(function) if compiled else function)(*leaves)
        value.backward()
        value, gradients = value.detach(), [leaf.grad for leaf in leaves]
    return to_numpy(value), [to_numpy(g) for g in gradients]
