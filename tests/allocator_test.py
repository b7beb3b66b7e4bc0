"""The training allocator: freed large buffers are reused, not faulted in again."""

import mmap
import os
import subprocess
import sys

import pytest

from kerasformer.allocator import set_allocator, uses_glibc
from kerasformer.train import TrainConfig, train

# Allocates, fills and frees a 96 MB buffer a few times, on the main thread and
# on a new thread (TF and JAX run their steps on worker threads), and prints
# the minor page faults per buffer after the first round.
# Plain malloc: numpy would ask for huge pages, which fault 2 MB at a time.
PROBE = """
import ctypes, ctypes.util, resource, sys, threading
from kerasformer.allocator import set_allocator

set_allocator(sys.argv[1])
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]

def buffer():
    address = libc.malloc(96 * 2**20)
    ctypes.memset(address, 1, 96 * 2**20)
    libc.free(address)

def faults_per_buffer(results):
    buffer()  # The first one may fault: the heap grows.
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(4):
        buffer()
    results.append((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start) / 4)

results = []
faults_per_buffer(results)
worker = threading.Thread(target=faults_per_buffer, args=(results,))
worker.start()
worker.join()
print(*results)
"""
PAGES_PER_BUFFER = 96 * 2**20 // mmap.PAGESIZE

pytestmark = pytest.mark.skipif(not uses_glibc(), reason="the allocator settings are glibc's")


def faults_per_buffer(allocator):
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}  # glibc's defaults.
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    output = subprocess.run(
        [sys.executable, "-c", PROBE, allocator], env=env, capture_output=True, text=True, check=True
    ).stdout
    return [float(n) for n in output.split()]


def test_reuse_keeps_freed_buffers_on_the_main_thread_and_on_new_threads():
    default = faults_per_buffer("system")
    # glibc's default: each large buffer is a fresh mapping whose pages fault in.
    assert min(default) > 0.9 * PAGES_PER_BUFFER, default
    reused = faults_per_buffer("reuse")
    assert max(reused) < 0.05 * PAGES_PER_BUFFER, reused


def test_train_applies_the_allocator_choice_and_names_a_bad_one():
    with pytest.raises(ValueError, match="`allocator`"):
        train(TrainConfig(allocator="jemalloc"))
    with pytest.raises(ValueError, match="`allocator`"):
        set_allocator("tcmalloc")
