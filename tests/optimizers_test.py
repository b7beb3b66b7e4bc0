"""`kerasformer.optimizers.AdamW` against AdamW written in numpy, and Keras's."""

import keras
import numpy as np
import pytest

from kerasformer import optimizers
from kerasformer.optimizers import AdamW
from tests.conftest import class_name_after_fresh_load, to_numpy

SHAPES = [(6, 5), (5,), (3, 2, 4)]


def numpy_adamw(
    weights, grads_per_step, rates, decayed, beta_1, beta_2, epsilon, weight_decay, clipnorm, step_numbers=None
):
    """Keras's AdamW: global norm clipping, decoupled decay, then Adam with
    epsilon outside the bias correction. `step_numbers`: each update's t, 1, 2, ... unless given."""
    weights = [w.astype("float64") for w in weights]
    m = [np.zeros_like(w) for w in weights]
    v = [np.zeros_like(w) for w in weights]
    for i, (t, rate) in enumerate(zip(step_numbers or range(1, len(rates) + 1), rates)):
        # A list of gradients per step, or a function of the current weights.
        grads = grads_per_step(weights) if callable(grads_per_step) else grads_per_step[i]
        if clipnorm:
            norm = np.sqrt(sum(np.sum(g.astype("float64") ** 2) for g in grads))
            grads = [g * min(1.0, clipnorm / norm) for g in grads]
        for i, g in enumerate(grads):
            if decayed[i]:
                weights[i] -= weights[i] * weight_decay * rate
            m[i] = beta_1 * m[i] + (1 - beta_1) * g
            v[i] = beta_2 * v[i] + (1 - beta_2) * g * g
            alpha = rate * np.sqrt(1 - beta_2**t) / (1 - beta_1**t)
            weights[i] -= alpha * m[i] / (np.sqrt(v[i]) + epsilon)
    return weights


@pytest.mark.parametrize("clipnorm", [None, 2.0], ids=["unclipped", "clipped"])
@pytest.mark.parametrize(
    "optimizer_class,kernel", [(AdamW, True), (AdamW, False), (keras.optimizers.AdamW, False)],
    ids=["kerasformer", "kerasformer_without_kernel", "keras"],
)
def test_adamw_matches_numpy_with_a_schedule_and_decay_exclusions(optimizer_class, kernel, clipnorm, monkeypatch):
    if not kernel:  # As with a torch whose fused kernel does not run on this device.
        monkeypatch.setattr(optimizers, "_fused_kernel_runs_on", lambda device_type: False)
    rng = np.random.default_rng(0)
    initial = [rng.normal(size=s).astype("float32") for s in SHAPES]
    steps = 6
    grads_per_step = [[rng.normal(size=s).astype("float32") for s in SHAPES] for _ in range(steps)]
    schedule = keras.optimizers.schedules.CosineDecay(0.0, 10, alpha=0.1, warmup_target=1e-2, warmup_steps=3)
    rates = [float(to_numpy(schedule(t))) for t in range(steps)]
    variables = [keras.Variable(w) for w in initial]
    optimizer = optimizer_class(
        learning_rate=schedule, weight_decay=0.1, beta_1=0.9, beta_2=0.99, epsilon=1e-3, global_clipnorm=clipnorm
    )
    optimizer.exclude_from_weight_decay(var_list=[variables[1]])  # A vector, as `make_optimizer` does.
    for grads in grads_per_step:
        optimizer.apply([keras.ops.convert_to_tensor(g) for g in grads], variables)
    # A large epsilon, so that where it is added (before or after the bias correction) shows.
    # The gradients' global norm is ~7: clipping at 2 scales them.
    expected = numpy_adamw(initial, grads_per_step, rates, [True, False, True], 0.9, 0.99, 1e-3, 0.1, clipnorm)
    for variable, want in zip(variables, expected):
        np.testing.assert_allclose(to_numpy(variable), want, rtol=2e-5, atol=2e-6)
    assert int(to_numpy(optimizer.iterations)) == steps


def test_a_restored_step_count_is_read_again():
    """The fused update counts its steps on the host after one read; an
    `iterations` set from outside (a restored checkpoint) is read again."""
    rng = np.random.default_rng(2)
    initial = [rng.normal(size=s).astype("float32") for s in SHAPES]
    grads_per_step = [[rng.normal(size=s).astype("float32") for s in SHAPES] for _ in range(5)]
    variables = [keras.Variable(w) for w in initial]
    optimizer = AdamW(learning_rate=1e-2, weight_decay=0.1, beta_2=0.9, epsilon=1e-3)
    for i, grads in enumerate(grads_per_step):
        if i == 2:
            optimizer.iterations.assign(10)  # The next updates are steps 11 and 12 of Adam's bias correction.
        optimizer.apply([keras.ops.convert_to_tensor(g) for g in grads], variables)
    expected = numpy_adamw(
        initial, grads_per_step, [1e-2] * 5, [True] * 3, 0.9, 0.9, 1e-3, 0.1, None, step_numbers=[1, 2, 11, 12, 13]
    )
    for variable, want in zip(variables, expected):
        np.testing.assert_allclose(to_numpy(variable), want, rtol=2e-5, atol=2e-6)


def test_the_fused_kernel_runs_on_torch():
    if keras.backend.backend() != "torch":
        pytest.skip("TensorFlow and JAX use keras.optimizers.AdamW's update unchanged (XLA fuses it).")
    import torch

    variables = [keras.Variable(np.ones((4, 3), "float32"))]
    optimizer = AdamW(learning_rate=1e-2)
    optimizer.build(variables)
    version = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    assert optimizer._use_fused_kernel(variables) == (version >= (2, 4))  # CPU kernel since torch 2.4.


def test_fit_with_jit_compile_matches_numpy():
    """Inside a compiled training step (XLA; `torch.compile` on torch, where
    the fused kernel gives way to Keras's update) the arithmetic is the same."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(8, 3)).astype("float32")
    target = rng.normal(size=(8, 2)).astype("float32")
    initial = rng.normal(size=(3, 2)).astype("float32")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2, use_bias=False)])
    model.layers[0].kernel.assign(initial)
    model.compile(optimizer=AdamW(1e-2, weight_decay=0.1, global_clipnorm=1.0), loss="mse", jit_compile=True)
    steps = 3
    model.fit(x, target, batch_size=8, epochs=steps, shuffle=False, verbose=0)

    def mse_gradient(weights):  # d/dW mean((x W - target)^2)
        return [2.0 / target.size * x.T.astype("float64") @ (x @ weights[0] - target)]

    expected = numpy_adamw([initial], mse_gradient, [1e-2] * steps, [True], 0.9, 0.999, 1e-7, 0.1, 1.0)
    np.testing.assert_allclose(to_numpy(model.layers[0].kernel), expected[0], rtol=1e-5, atol=1e-6)


def test_adamw_round_trips_its_config():
    optimizer = AdamW(learning_rate=3e-4, weight_decay=0.05, beta_2=0.95, epsilon=1e-8)
    restored = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(optimizer))
    assert isinstance(restored, AdamW)
    assert restored.get_config() == optimizer.get_config()


def test_a_model_compiled_with_it_loads_in_a_fresh_process(tmp_path):
    """`import kerasformer` alone registers the class, as `kerasformer export` needs."""
    from kerasformer.models import GPT

    model = GPT(vocab_size=20, num_layers=1, num_heads=2, hidden_dim=8)
    model.compile(optimizer=AdamW(1e-3, weight_decay=0.1), loss="sparse_categorical_crossentropy")
    assert class_name_after_fresh_load(model, tmp_path, "optimizer") == "AdamW"
