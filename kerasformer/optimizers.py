"""`AdamW`: Keras's AdamW, whose update is one fused kernel on torch.

Keras's torch AdamW updates the variables with about ten `torch._foreach_*`
passes over all parameters, several of which allocate a new copy of them; at
5.3M parameters on 2 CPU cores, with global norm clipping, an update took
25.6 and 75.6 ms in two runs, against 8.1 and 16.6 ms with torch's own fused
AdamW kernel (`benchmarks/optimizer_step.py`). This class keeps Keras's optimizer (its
schedule, weight-decay exclusions, checkpoints, gradient accumulation) and
swaps only the update for that kernel where torch has it, and global norm
clipping for two `foreach` calls. The arithmetic is Keras's AdamW, not
torch's: Keras adds epsilon to `sqrt(v)` before the bias correction of `v`,
so the kernel gets `epsilon / sqrt(1 - beta_2^t)` (tested against AdamW
written in numpy).

On TensorFlow and JAX it is `keras.optimizers.AdamW` unchanged: XLA already
fuses the update into the training step.
"""

import functools

import keras


def _fused_kernel():
    """torch's fused AdamW kernel, or None (another backend, or an old torch)."""
    if keras.backend.backend() != "torch":
        return None
    import torch

    return getattr(torch, "_fused_adamw_", None)


@functools.cache
def _fused_kernel_runs_on(device_type):
    """Whether the kernel runs on `device_type` ("cpu" needs torch >= 2.4): one tiny trial update."""
    import torch

    kernel = _fused_kernel()
    if kernel is None:
        return False
    try:
        tensors = [[torch.zeros(2, device=device_type)] for _ in range(4)]
        step = [torch.ones((), device=device_type)]
        kernel(*tensors, [], step, lr=1e-3, beta1=0.9, beta2=0.999, weight_decay=0.0, eps=1e-8, amsgrad=False, maximize=False)
    except (RuntimeError, NotImplementedError):
        return False
    return True


@keras.saving.register_keras_serializable(package="kerasformer")
class AdamW(keras.optimizers.AdamW):
    """`keras.optimizers.AdamW` with the same arguments and results.

    Example:

    >>> model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    >>> optimizer = AdamW(learning_rate=1e-3, weight_decay=0.1)
    >>> model.compile(optimizer=optimizer, loss="mse")
    >>> history = model.fit(np.ones((8, 3)), np.ones((8, 1)), epochs=2, verbose=0)
    >>> int(optimizer.iterations)
    2
    """

    def _use_fused_kernel(self, variables):
        if self.amsgrad or _fused_kernel() is None or not variables:
            return False
        import torch

        if torch.compiler.is_compiling():
            return False  # Under `torch.compile` Inductor fuses Keras's update itself.
        # One kernel call takes float32 tensors on one device.
        device = variables[0].value.device
        return _fused_kernel_runs_on(device.type) and all(
            v.value.device == device and v.value.dtype == torch.float32 for v in variables
        )

    def _host_step(self):
        """The number of this update (`iterations + 1`) as a Python float, read from the device once.

        The kernel's epsilon depends on it. On a GPU each read waits for every
        queued kernel, so the host could not queue the next step while the
        GPU runs this one. After the first read it is counted here: Keras adds
        one to `iterations` after each update (one in-place write of its
        tensor), so a tensor one write further on than at the last update
        holds the last step. Any other write (a checkpoint restored, an
        `assign`, accumulated gradients) is read again.
        """
        tensor = self.iterations.value
        last = getattr(self, "_last_host_step", None)
        if last is not None and last[0] is tensor and last[1] + 1 == tensor._version:
            step = last[2] + 1.0
        else:
            step = float(keras.ops.convert_to_numpy(tensor)) + 1.0
        self._last_host_step = (tensor, tensor._version, step)
        return step

    def _clip_gradients(self, grads):
        torch_backend = keras.backend.backend() == "torch"
        if not self.global_clipnorm or self.clipnorm or not torch_backend or any(g is None for g in grads):
            return super()._clip_gradients(grads)
        import torch

        # Keras's `clip_by_global_norm` in two foreach calls instead of ~3 ops per tensor.
        norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
        scale = self.global_clipnorm * torch.minimum(1.0 / norm, torch.tensor(1.0 / self.global_clipnorm))
        scale = scale + (norm - norm)  # NaN for a non-finite norm, as Keras.
        return torch._foreach_mul(grads, scale)

    def _apply_weight_decay(self, variables):
        if not self._use_fused_kernel(variables):
            super()._apply_weight_decay(variables)
        # Otherwise the fused kernel decays the weights in `_backend_update_step`.

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        if not self._use_fused_kernel(trainable_variables):
            return super()._backend_update_step(grads, trainable_variables, learning_rate)
        import torch

        with torch.no_grad():
            device = trainable_variables[0].value.device
            step = self._host_step()
            # A tensor, not a float read from the device (a sync, as `_host_step` explains).
            learning_rate = keras.ops.convert_to_tensor(learning_rate).to(device, torch.float32)
            steps = torch.full((), step, dtype=torch.float32, device=device)
            # Keras: var -= lr sqrt(bc2) / bc1 * m / (sqrt(v) + eps); torch's kernel
            # divides by sqrt(v) / sqrt(bc2) + eps', equal for eps' = eps / sqrt(bc2).
            epsilon = self.epsilon / (1.0 - self.beta_2**step) ** 0.5
            groups = {True: [], False: []}  # decayed or not
            for grad, variable in zip(grads, trainable_variables):
                decayed = self.weight_decay is not None and self._use_weight_decay(variable)
                groups[decayed].append((grad, variable))
            for decayed, pairs in groups.items():
                if not pairs:
                    continue
                index = [self._get_variable_index(variable) for _, variable in pairs]
                _fused_kernel()(
                    [variable.value for _, variable in pairs],
                    [grad.to(variable.value.dtype) for grad, variable in pairs],
                    [self._momentums[i].value for i in index],
                    [self._velocities[i].value for i in index],
                    [],
                    [steps] * len(pairs),
                    lr=learning_rate,
                    beta1=float(self.beta_1),
                    beta2=float(self.beta_2),
                    weight_decay=float(self.weight_decay) if decayed else 0.0,
                    eps=epsilon,
                    amsgrad=False,
                    maximize=False,
                )
