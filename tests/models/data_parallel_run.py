"""Data-parallel `fit` over two CPU devices, against the same model trained on one.

Run as a script (`KERAS_BACKEND=... python data_parallel_run.py FAMILY`):
the devices must be split before the backend starts. TF trains under a
`tf.distribute.MirroredStrategy`, JAX under `keras.distribution.DataParallel`.
Prints one JSON line: the largest weight difference and both evaluations.
"""

import json
import os
import sys

BACKEND = os.environ["KERAS_BACKEND"]
if BACKEND == "jax":
    os.environ["XLA_FLAGS"] = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2"
elif BACKEND == "tensorflow":
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import contextlib  # noqa: E402

import keras  # noqa: E402
import numpy as np  # noqa: E402

from kerasformer.models import BERT, GPT, T5, BERTClassifier  # noqa: E402

VOCAB, LENGTH, BATCH = 48, 12, 8


def build(family):
    if family == "gpt":
        return GPT(VOCAB, 2, 2, 32, max_sequence_length=LENGTH, dropout=0.0)
    if family == "t5":
        # Gated GELU, not ReLU: ReLU's gradient jumps at 0, so a pre-activation
        # within rounding of 0 takes another branch on one device than on two,
        # and SGD carries that finite difference on (3 seeds of 12: weights
        # 0.6-1.6e-3 apart from starts 1e-6 apart). Gated GELU kept it <= 10x.
        return T5(VOCAB, 2, 2, 32, 64, dropout=0.0, activation="geglu_tanh")
    backbone = BERT(VOCAB, 2, 2, 32, max_sequence_length=LENGTH, dropout=0.0)
    return BERTClassifier(backbone, num_classes=3, dropout=0.0)


def data(family):
    rng = np.random.default_rng(0)
    ids = rng.integers(1, VOCAB, (2 * BATCH, LENGTH)).astype("int32")
    if family == "gpt":
        return ids, np.roll(ids, -1, axis=1)
    if family == "bert-ids":  # Token ids alone: one segment.
        return ids, rng.integers(0, 3, (2 * BATCH,))
    if family == "bert":
        segments = (np.arange(LENGTH) >= LENGTH // 2).astype("int32") * np.ones_like(ids)
        return {"token_ids": ids, "segment_ids": segments}, rng.integers(0, 3, (2 * BATCH,))
    return {"encoder_token_ids": ids, "decoder_token_ids": ids[:, ::-1].copy()}, ids


def trained(model, weights, x, y):
    """Weights and loss after two epochs of SGD from `weights` on (x, y), in fixed batch order."""
    model.set_weights(weights)
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    return [np.asarray(w) for w in model.get_weights()], float(model.evaluate(x, y, batch_size=BATCH, verbose=0))


def main(family):
    keras.utils.set_random_seed(0)  # The same start in every run.
    x, y = data(family)
    reference = build(family.split("-")[0])
    initial = reference.get_weights()
    one_device, one_device_loss = trained(reference, initial, x, y)
    if BACKEND == "tensorflow":
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
        scope, replicas = strategy.scope(), strategy.num_replicas_in_sync
    else:
        keras.distribution.set_distribution(keras.distribution.DataParallel())
        scope, replicas = contextlib.nullcontext(), len(keras.distribution.list_devices())
    with scope:
        model = build(family.split("-")[0])
        two_devices, two_devices_loss = trained(model, initial, x, y)
    difference = max(float(np.max(np.abs(a - b))) for a, b in zip(one_device, two_devices))
    moved = max(float(np.max(np.abs(a - np.asarray(b)))) for a, b in zip(one_device, initial))
    print(json.dumps({"replicas": replicas, "difference": difference, "moved": moved, "losses": [one_device_loss, two_devices_loss]}))


if __name__ == "__main__":
    main(sys.argv[1])
