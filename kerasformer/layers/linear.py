"""`linear(x, kernel, bias)`: the 2-D matmul behind every projection and LM head.

On every backend it is `x @ kernel + bias`. Under XLA on TF, the kernel
gradient transposes the narrower operand before its product (see
`_tf_xla_product`; training step 1.035x and 1.072x, medians of 14 and 10
paired rounds, 2 cores of a Zen 3 EPYC). On PyTorch's CPU build the
product goes through oneDNN instead of `torch.matmul`, which calls MKL's
sgemm, on CPUs with AVX-512. oneDNN is PyTorch's own CPU kernel library,
the one `torch.compile` (Inductor) calls for linear layers on CPU. Measured
on 2 cores of AMD EPYC CPUs with AVX-512:
- one Zen 5 machine: MKL ~230 GFLOP/s and oneDNN ~510 (the rate TF and JAX
  reach there) on fp32 GEMMs; forward + backward of 2048x256 @ 256x768:
  10.9 -> 5.4 ms;
- a Zen 4 machine: 2048^2 GEMMs 172 vs 214 GFLOP/s; forward + backward
  0.74x the time for the tied LM head (2048x256 @ 256x8192) and 0.86-0.99x
  for the block projections; GPT training step of
  `benchmarks/train_throughput.py`, median of 8 paired rounds in one process:
  1.034x (best rounds 4282 -> 4460 tok/s).
On a CPU whose best instructions are AVX2 (torch's CPU capability "AVX2")
MKL is the faster one, so `torch.matmul` stays: on 2 cores of a Zen 3 EPYC,
forward + backward 1.16-1.23x the time through oneDNN for the block
projections, and that GPT's training step 1.14x faster with MKL (median of
12 paired rounds in one process: 598 vs 704 ms).
"""

import functools

import keras
from keras import ops

from kerasformer.tf_xla import compiling_with_xla, optimization_barrier


def linear(x, kernel, bias=None):
    """`x (N, C_in) @ kernel (C_in, C_out) [+ bias (C_out,)]`, shape `(N, C_out)`.

    Args:
        x: a 2-D tensor.
        kernel: a 2-D tensor or variable, input features first (Keras's
            `Dense` layout).
        bias: optional 1-D tensor or variable added to every row.

    Example:

    >>> linear(np.ones((2, 3), "float32"), np.ones((3, 4), "float32")).shape
    (2, 4)
    """
    if keras.backend.backend() == "torch":
        x, kernel = ops.convert_to_tensor(x), ops.convert_to_tensor(kernel)
        bias = None if bias is None else ops.convert_to_tensor(bias)
        if uses_onednn(x, kernel, bias):
            return _onednn_linear().apply(x, kernel, bias)  # (N, C_out)
        if pads_for_tensor_cores(x, kernel):
            return _padded_linear(x, kernel, bias)  # (N, C_out)
        if bias is not None and x.ndim == kernel.ndim == 2 and bias.ndim == 1 and x.dtype == kernel.dtype == bias.dtype:
            import torch

            # The GEMM adds the bias as it writes (one pass fewer than `+ bias`):
            # GPT training step 1.039x, median of 10 paired rounds, 2-core Zen 3.
            return torch.addmm(bias, x, kernel)  # (N, C_out)
    elif keras.backend.backend() == "tensorflow" and compiling_with_xla() and len(x.shape) == len(kernel.shape) == 2:
        y = _tf_xla_product(ops.convert_to_tensor(x), ops.convert_to_tensor(kernel))  # (N, C_out)
        return y if bias is None else y + bias
    y = ops.matmul(x, kernel)  # (N, C_out)
    return y if bias is None else y + bias


def dense_linear(dense, x):
    """`dense(x)` for a bias-and-kernel `keras.layers.Dense` on `x (..., C_in)`, through `linear`.

    Flattens `x` to 2-D: besides the oneDNN path, XLA on CPU runs 2-D
    matmuls and their kernel gradients faster than 3-D ones. The caller's
    layer call provides the dtype policy's casts. `dense.kernel` includes
    LoRA's update (`enable_lora`); a quantized kernel or an activation goes
    through the layer's own call.
    """
    if dense.quantization_mode is not None or dense.activation is not keras.activations.linear:
        return dense(x)
    lead = ops.shape(x)[:-1]
    flat = ops.reshape(x, (-1, x.shape[-1]))  # (N, C_in)
    y = linear(flat, dense.kernel, dense.bias)  # (N, C_out)
    return ops.reshape(y, (*lead, y.shape[-1]))  # (..., C_out)


def uses_onednn(x, kernel, bias=None):
    """Whether `linear` runs this product through oneDNN (torch, CPU, fp32, 2-D; not on AVX2-only CPUs)."""
    if keras.backend.backend() != "torch":
        return False
    import torch

    # Checked first: under `torch.compile` Inductor picks its own kernels, and
    # Dynamo cannot trace `torch.backends.mkldnn.is_available` (a graph break
    # in every projection).
    if torch.compiler.is_compiling() or not _onednn_available() or not onednn_is_faster():
        return False
    tensors = [x, kernel] + ([] if bias is None else [bias])
    return (
        not torch.jit.is_tracing()  # The tracer cannot record the op's `Scalar?[]` argument.
        and x.ndim == 2
        and kernel.ndim == 2
        and (bias is None or bias.ndim == 1)
        and x.shape[0] > 0  # First tested outside a trace, where it would warn of a constant.
        and all(t.device.type == "cpu" and t.dtype == torch.float32 for t in tensors)
    )


def pads_for_tensor_cores(x, kernel):
    """Whether `linear` pads the kernel's columns to a multiple of 64 (torch, GPU, 16-bit, C_out % 8 != 0).

    cuBLAS runs 16-bit GEMMs on tensor cores at full speed only when the
    dimensions are multiples of 8. GPT-2's 50257-token LM head missed that: on
    an H200 in bf16, torch took its three products (logits and both gradients)
    to old sm_75 kernels, 30 of the 81 ms of GPU time in a gpt2-small
    training step at batch 16 x 1024. nanoGPT pads the vocabulary to 50304 for
    the same reason; padding here keeps the model's shapes (and checkpoints)
    as they are. XLA (TF, JAX) pads such GEMMs itself.
    """
    import torch

    return (
        x.ndim == 2
        and kernel.ndim == 2
        and x.is_cuda
        and x.dtype in (torch.bfloat16, torch.float16)
        and kernel.dtype == x.dtype
        and kernel.shape[1] % 8 != 0
    )


def _padded_linear(x, kernel, bias=None):
    """`x @ kernel + bias` with the kernel's columns zero-padded to a multiple of 64, then sliced off."""
    import torch

    columns = kernel.shape[1]
    padded = torch.nn.functional.pad(kernel, (0, -columns % 64))  # (C_in, C_out rounded up)
    y = torch.matmul(x, padded)[:, :columns]  # (N, C_out); the gradient pads the upstream back
    return y if bias is None else y + bias


def _tf_xla_product(x, kernel):
    """`x @ kernel` under XLA (TF), its kernel gradient with the narrower operand transposed first.

    XLA on CPU runs `x^T @ upstream`, which contracts the token axis of both
    operands, slower than the same product of a materialized transpose; the
    barriers keep XLA from folding it back (as in `embedding.tied_logits`).
    Kernel gradient alone, N=2048, median of 12 paired rounds, 2 cores of a
    Zen 3 EPYC: 1.06x (256 -> 768), 1.13x (256 -> 256), 0.99x (256 -> 1024),
    1.18x (1024 -> 256).
    """
    import tensorflow as tf

    @tf.autograph.experimental.do_not_convert  # Autograph would wrap `gradient`.
    @tf.custom_gradient
    def product(x, kernel):
        def gradient(upstream):  # upstream: (N, C_out)
            x_grad = tf.matmul(upstream, kernel, transpose_b=True)  # (N, C_in)
            if kernel.shape[0] <= kernel.shape[1]:  # x (N, C_in) is the narrower
                kernel_grad = tf.matmul(optimization_barrier(tf.transpose(x)), upstream)  # (C_in, C_out)
            else:
                kernel_grad_t = optimization_barrier(tf.matmul(optimization_barrier(tf.transpose(upstream)), x))
                kernel_grad = tf.transpose(kernel_grad_t)  # (C_out, C_in) -> (C_in, C_out)
            return x_grad, kernel_grad

        return tf.matmul(x, kernel), gradient  # (N, C_out)

    return product(x, kernel)


@functools.cache
def _onednn_available():
    import torch

    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_linear_pointwise")


@functools.cache
def onednn_is_faster():
    """Whether oneDNN's fp32 GEMMs beat MKL's on this CPU: all but AVX2-only x86 CPUs (see the module doc).

    Measured faster with AVX-512 (Zen 4, Zen 5) and slower with AVX2 (Zen 3).
    Elsewhere oneDNN is kept, as PyTorch's own compiled linear layers use it.
    """
    import torch

    return torch.backends.cpu.get_cpu_capability() != "AVX2"


@functools.cache
def _onednn_linear():
    """A `torch.autograd.Function`: `x @ kernel + bias` and its gradients, each one oneDNN GEMM."""
    import torch

    # y = x @ weight^T + bias, with weight (C_out, C_in): torch.nn.Linear's layout.
    def product(x, weight, bias=None):
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")

    class OneDNNLinear(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, kernel, bias):
            ctx.save_for_backward(x, kernel)
            ctx.has_bias = bias is not None
            return product(x, kernel.t(), bias)  # (N, C_out)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, upstream):  # upstream: (N, C_out)
            x, kernel = ctx.saved_tensors
            x_grad = kernel_grad = bias_grad = None
            if ctx.needs_input_grad[0]:
                x_grad = product(upstream, kernel)  # (N, C_in) = upstream @ kernel^T
            if ctx.needs_input_grad[1]:
                # x^T @ upstream. oneDNN copies a transposed first operand into
                # a contiguous one, so transpose the narrower of the two: for
                # the FFN's output projection (C_in 1024, C_out 256, N 2048) the
                # copy takes 0.6 instead of 3.3 ms, the product 6.4 vs 8.5 ms.
                if x.shape[1] <= upstream.shape[1]:
                    kernel_grad = product(x.t(), upstream.t())  # (C_in, C_out)
                else:
                    kernel_grad = product(upstream.t(), x.t()).t()  # (C_out, C_in) -> (C_in, C_out)
            if ctx.has_bias and ctx.needs_input_grad[2]:
                bias_grad = upstream.sum(0)  # (C_out,)
            return x_grad, kernel_grad, bias_grad

    return OneDNNLinear
