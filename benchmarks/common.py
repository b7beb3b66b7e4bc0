"""Helpers shared by the benchmarks: run each backend in its own process, time things."""

import os
import subprocess
import sys
import time

import numpy as np

BACKENDS = ("jax", "tensorflow", "torch")


def run_per_backend(script, argv):
    """Runs `script` once per backend (each needs a fresh process); True if all ran."""
    ok = True
    for backend in BACKENDS:
        env = {**os.environ, "KERAS_BACKEND": backend, "TF_CPP_MIN_LOG_LEVEL": "3"}
        args = [a for a in argv if a != "--all"]
        result = subprocess.run([sys.executable, script, *args], env=env)
        ok = ok and result.returncode == 0
    return ok


def median_seconds(function, repeats=3, warmup=1):
    """Median wall time of `function()` after `warmup` untimed calls."""
    for _ in range(warmup):
        function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def alternating_seconds(functions, rounds=5, warmup=1):
    """Wall times of each of `functions`, called in turn for `rounds` rounds.

    Alternating keeps the machine's drift between minutes (10-25% on 2
    shared cores) out of the comparison: each round times every function
    within a few seconds. Returns one list of `rounds` times per function,
    after `warmup` untimed calls of each (compilation).
    """
    for function in functions:
        for _ in range(warmup):
            function()
    times = [[] for _ in functions]
    for _ in range(rounds):
        for function, record in zip(functions, times):
            start = time.perf_counter()
            function()
            record.append(time.perf_counter() - start)
    return times
