"""Data-parallel training (several GPUs, here two CPU devices) gives the one-device result."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import BACKEND

SCRIPT = Path(__file__).with_name("data_parallel_run.py")


@pytest.mark.skipif(
    BACKEND == "torch",
    reason="Keras has no data-parallel fit on torch: `keras.distribution` is JAX's, `tf.distribute` TF's; torch users wrap a training loop in DDP",
)
@pytest.mark.parametrize("family", ["gpt", "bert", "bert-ids", "t5"])
def test_data_parallel_fit_equals_one_device(family):
    # Under a MirroredStrategy, Keras's TF trainer builds the model from the
    # replicas' batches averaged into floats, which the models refused as
    # "`token_ids` must be integer token ids": no model could fit.
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = subprocess.run([sys.executable, str(SCRIPT), family], env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["replicas"] == 2
    assert report["moved"] > 1e-2  # Training changed the weights.
    # Relative to how far training moved the weights: two half-batch gradients
    # averaged sum in another order than one batch's, and four SGD steps at
    # lr 0.5 grow that (~10x with smooth activations; see `build`). Gradients
    # summed rather than averaged, or a replica left out, differ by about as
    # much as the weights moved.
    assert report["difference"] < 1e-2 * report["moved"], report
    one, two = report["losses"]
    assert abs(one - two) < 1e-4 * max(1.0, abs(one)), report
