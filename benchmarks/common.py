"""Helpers shared by the benchmarks: run each backend in its own process, time things."""

import os
import platform
import subprocess
import sys
import time

import numpy as np

BACKENDS = ("jax", "tensorflow", "torch")


def machine_description():
    """The CPU this runs on, e.g. "AMD EPYC (family 25, model 1), 2 CPUs, AVX2, no AVX-512".

    Figures differ between CPUs (an AVX-512 machine's matmuls ran twice as
    fast as an AVX2 one's), so each benchmark run says which one it measured.
    """
    fields = {}
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:  # Not Linux.
        return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs"
    flags = fields.get("flags", "").split()
    simd = "AVX-512" if "avx512f" in flags else ("AVX2, no AVX-512" if "avx2" in flags else "no AVX2")
    return (
        f"{fields.get('model name', 'unknown CPU')} (family {fields.get('cpu family', '?')}, "
        f"model {fields.get('model', '?')}), {os.cpu_count()} CPUs, {simd}"
    )


def run_per_backend(script, argv):
    """Runs `script` once per backend (each needs a fresh process); True if all ran."""
    print(f"machine: {machine_description()}", flush=True)
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
