"""glibc's malloc set up for training: freed memory is kept for the next step.

A training step allocates and frees the same large buffers every time: logits,
their gradients, XLA's temporary arena. glibc's malloc serves buffers over
32 MB with a fresh `mmap` and returns them to the OS on `free`; the worker
threads of TensorFlow and JAX allocate from per-thread arenas, which do the
same above 64 MB. So every step the kernel zero-fills the same pages again:
270-440 MB of page faults and 0.2-0.3 s of system time per step for the GPT of
`benchmarks/train_throughput.py` on 2 CPU cores. Three settings keep that
memory in the process instead:

    one arena for all threads            (M_ARENA_MAX = 1,  MALLOC_ARENA_MAX=1)
    no mmap for large buffers            (M_MMAP_MAX = 0,   MALLOC_MMAP_MAX_=0)
    no returning of freed heap memory    (M_TRIM_THRESHOLD, MALLOC_TRIM_THRESHOLD_)

Measured on that model (2 cores, same session, default -> reuse): ms per
training step TensorFlow 865 -> 606, JAX 885 -> 701, torch 698 -> 669; peak
resident memory 1515 -> 1810 MB, 1473 -> 2178 MB, 1560 -> 1603 MB. So the price
is memory: one arena fragments more, and the process keeps its peak until it
exits. PyTorch's CPU launcher (`torch.backends.xeon.run_cpu`) makes the same
trade by preloading jemalloc or tcmalloc.

`kerasformer train` applies it (`--allocator system` leaves malloc alone).
The arena limit only covers threads that have not allocated yet, so call
`keep_freed_memory()` early: before the first model is built or run. Starting
Python with the environment variables above has the same effect.
"""

import ctypes
import ctypes.util
import platform
import sys

# mallopt(3) parameters, from glibc's malloc.h.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
_M_ARENA_MAX = -8

ALLOCATORS = ("reuse", "system")


def uses_glibc():
    """Whether this process's C library is glibc, the one these settings are for."""
    return sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"


def keep_freed_memory():
    """Sets glibc's malloc to keep freed memory for reuse (see the module doc).

    Returns:
        True if the settings were applied; False where the C library is not
        glibc (macOS, Windows, musl), whose allocators behave differently.
    """
    if not uses_glibc():
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    settings = ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, 2**31 - 1))
    return all(libc.mallopt(parameter, value) == 1 for parameter, value in settings)


def set_allocator(name):
    """Applies a `kerasformer train --allocator` choice: "reuse" or "system"."""
    if name not in ALLOCATORS:
        raise ValueError(f"`allocator` must be one of {ALLOCATORS}, got {name!r}.")
    return keep_freed_memory() if name == "reuse" else False
