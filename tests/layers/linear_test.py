"""`linear`, the projections' matmul (oneDNN on torch CPU), against numpy written here."""

import keras
import numpy as np
import pytest

from kerasformer.layers import linear as linear_module
from kerasformer.layers.linear import dense_linear, linear, pads_for_tensor_cores, uses_onednn
from tests.conftest import BACKEND, random_inputs, to_numpy, value_and_gradients


# On torch both CPU paths run whatever this machine's CPU would pick.
PRODUCTS = ["onednn", "matmul"] if BACKEND == "torch" else ["backend"]


@pytest.fixture(params=PRODUCTS)
def product(request, monkeypatch):
    """The product `linear` takes on torch's CPU build: oneDNN or `torch.matmul` (MKL)."""
    if request.param == "onednn":
        import torch

        if not torch.backends.mkldnn.is_available():
            pytest.skip("this torch build has no oneDNN")
    monkeypatch.setattr(linear_module, "onednn_is_faster", lambda: request.param == "onednn")
    return request.param


@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "compiled"])
@pytest.mark.parametrize("widths", [(5, 3), (3, 5)], ids=["narrowing", "widening"])
def test_value_and_gradients_match_numpy(with_bias, compiled, widths, product):
    """Both orders of the kernel gradient's product: the narrower operand is transposed."""
    c_in, c_out = widths
    x, kernel, bias = random_inputs(7, c_in, seed=1), random_inputs(c_in, c_out, seed=2), random_inputs(c_out, seed=3)
    upstream = random_inputs(7, c_out, seed=4)

    inputs = (x, kernel, bias) if with_bias else (x, kernel)

    def weighted_sum(*tensors):
        return keras.ops.sum(keras.ops.multiply(linear(*tensors), upstream))

    value, gradients = value_and_gradients(weighted_sum, *inputs, compiled=compiled)
    expected = x @ kernel + (bias if with_bias else 0)
    np.testing.assert_allclose(value, np.sum(expected * upstream), rtol=1e-5)
    np.testing.assert_allclose(gradients[0], upstream @ kernel.T, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gradients[1], x.T @ upstream, rtol=1e-5, atol=1e-6)
    if with_bias:
        np.testing.assert_allclose(gradients[2], upstream.sum(0), rtol=1e-5, atol=1e-6)


def test_transposed_kernel_view_matches_numpy(product):
    """The tied LM head passes `table^T`, a transposed view on torch."""
    hidden, table, upstream = random_inputs(6, 4, seed=1), random_inputs(9, 4, seed=2), random_inputs(6, 9, seed=3)
    value, (hidden_gradient, table_gradient) = value_and_gradients(
        lambda h, t: keras.ops.sum(keras.ops.multiply(linear(h, keras.ops.transpose(t)), upstream)), hidden, table
    )
    np.testing.assert_allclose(value, np.sum(hidden @ table.T * upstream), rtol=1e-5)
    np.testing.assert_allclose(hidden_gradient, upstream @ table, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(table_gradient, upstream.T @ hidden, rtol=1e-5, atol=1e-6)


def test_dense_linear_matches_the_dense_layer_on_3d_inputs():
    dense = keras.layers.Dense(4)
    dense.build((None, None, 5))
    x = random_inputs(2, 3, 5)
    expected = x @ to_numpy(dense.kernel) + to_numpy(dense.bias)
    np.testing.assert_allclose(to_numpy(dense_linear(dense, x)), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("variant", ["lora", "int8", "activation"])
def test_dense_linear_keeps_lora_quantization_and_activation(variant):
    """A user's `enable_lora`, `quantize` or activation on a Dense is not dropped."""
    x = random_inputs(6, 5, seed=1)
    dense = keras.layers.Dense(4, activation="relu" if variant == "activation" else None)
    dense.build((None, 5))
    if variant == "lora":
        dense.enable_lora(2)
        dense.lora_kernel_b.assign(random_inputs(2, 4, seed=2))  # Zero-initialized: make LoRA count.
        kernel = to_numpy(dense._kernel) + to_numpy(dense.lora_kernel_a) @ to_numpy(dense.lora_kernel_b)  # alpha = rank
        expected = x @ kernel + to_numpy(dense.bias)
    elif variant == "int8":
        dense.quantize("int8")
        expected = to_numpy(dense(x))
    else:
        expected = np.maximum(x @ to_numpy(dense.kernel) + to_numpy(dense.bias), 0)
    np.testing.assert_allclose(to_numpy(dense_linear(dense, x)), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(BACKEND != "torch", reason="oneDNN is the path of torch's CPU build only")
def test_torch_takes_onednn_for_2d_float32_on_cpu_only(monkeypatch):
    import torch

    if not torch.backends.mkldnn.is_available():
        pytest.skip("this torch build has no oneDNN")
    x, kernel = torch.ones(4, 3), torch.ones(3, 2)
    monkeypatch.setattr(linear_module, "onednn_is_faster", lambda: True)
    assert uses_onednn(x, kernel, torch.ones(2))
    assert not uses_onednn(x.double(), kernel.double())  # float64: torch.matmul
    assert not uses_onednn(torch.ones(2, 4, 3), kernel)  # 3-D: callers flatten first
    assert not uses_onednn(torch.ones(0, 3), kernel)  # empty batch
    monkeypatch.setattr(linear_module, "onednn_is_faster", lambda: False)
    assert not uses_onednn(x, kernel, torch.ones(2))  # an AVX2 CPU: MKL


@pytest.mark.skipif(BACKEND != "torch", reason="oneDNN is the path of torch's CPU build only")
@pytest.mark.parametrize("capability, faster", [("AVX2", False), ("AVX512", True)])
def test_onednn_is_taken_where_it_is_faster_than_mkl(capability, faster, monkeypatch):
    """oneDNN beat MKL with AVX-512 (Zen 4, Zen 5) and lost with AVX2 only (Zen 3)."""
    import torch

    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    linear_module.onednn_is_faster.cache_clear()
    try:
        assert linear_module.onednn_is_faster() is faster
    finally:
        linear_module.onednn_is_faster.cache_clear()  # This machine's answer again.


@pytest.mark.skipif(BACKEND != "torch", reason="XLA (TF, JAX) pads 16-bit GEMMs for the GPU itself")
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
def test_torch_pads_odd_output_widths_for_tensor_cores(with_bias, monkeypatch):
    """The padded product (taken on a GPU in 16 bits) is exact, with its gradients; here forced on CPU."""
    import torch

    assert not pads_for_tensor_cores(torch.ones(4, 3, dtype=torch.bfloat16), torch.ones(3, 5, dtype=torch.bfloat16))
    if torch.cuda.is_available():
        half = {"device": "cuda", "dtype": torch.bfloat16}
        assert pads_for_tensor_cores(torch.ones(4, 3, **half), torch.ones(3, 50257, **half))
        assert not pads_for_tensor_cores(torch.ones(4, 3, **half), torch.ones(3, 50304, **half))
        assert not pads_for_tensor_cores(torch.ones(4, 3, device="cuda"), torch.ones(3, 50257, device="cuda"))
    monkeypatch.setattr(linear_module, "uses_onednn", lambda *tensors: False)
    monkeypatch.setattr(linear_module, "pads_for_tensor_cores", lambda x, kernel: True)
    x, kernel, bias = random_inputs(7, 3, seed=1), random_inputs(3, 5, seed=2), random_inputs(5, seed=3)
    upstream = random_inputs(7, 5, seed=4)
    inputs = (x, kernel, bias) if with_bias else (x, kernel)

    def weighted_sum(*tensors):
        y = linear(*tensors)
        assert tuple(y.shape) == (7, 5)
        return keras.ops.sum(keras.ops.multiply(y, upstream))

    value, gradients = value_and_gradients(weighted_sum, *inputs)
    np.testing.assert_allclose(value, np.sum((x @ kernel + (bias if with_bias else 0)) * upstream), rtol=1e-5)
    np.testing.assert_allclose(gradients[0], upstream @ kernel.T, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gradients[1], x.T @ upstream, rtol=1e-5, atol=1e-6)
    if with_bias:
        np.testing.assert_allclose(gradients[2], upstream.sum(0), rtol=1e-5, atol=1e-6)


@pytest.mark.skipif(BACKEND != "torch", reason="torch.jit.trace is torch's (generation traces its loop body)")
def test_traces_under_torch_jit():
    import torch

    x, kernel, bias = (torch.tensor(random_inputs(*shape, seed=i)) for i, shape in enumerate([(4, 3), (3, 2), (2,)]))
    traced = torch.jit.trace(lambda x, k, b: linear(x, k, b), (x, kernel, bias))
    np.testing.assert_allclose(to_numpy(traced(x, kernel, bias)), x.numpy() @ kernel.numpy() + bias.numpy(), rtol=1e-5)
