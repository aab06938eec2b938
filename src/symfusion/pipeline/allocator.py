"""The C allocator's settings for a stage process: freed tensor memory is kept for reuse, not handed back.

A stage allocates and frees the same large activation tensors batch after batch (evaluation, Fisher,
fine-tuning). glibc's defaults serve each allocation above a dynamic threshold with a fresh mmap, and
trim the heap whenever 128 KiB at its top are free: the kernel then zeroes the same pages again for the
next batch, which showed as system time (about 16% of the mini run's CPU seconds). `keep_freed_memory`
raises both limits once per process: blocks below 32 MiB (glibc's ceiling for the mmap threshold) come
from the heap and freed ones are reused; larger ones (a 7B layer's weights) are still mapped and unmapped.
The resident size stays at the process's peak instead of shrinking between batches. What a stage computes
does not change. Elsewhere than glibc (macOS, musl) this is a no-op.
"""
from __future__ import annotations

import ctypes
import platform

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3      # mallopt's parameter numbers (malloc.h)
MMAP_THRESHOLD = 32 * 2**20        # glibc's largest allowed value on 64-bit systems
TRIM_THRESHOLD = 2**31             # trim the heap's top only when 2 GiB of it are free
TOP_PAD = 64 * 2**20               # grow the heap in steps of 64 MiB


def keep_freed_memory() -> bool:
    """Set glibc's mmap threshold, trim threshold and top pad (see the module's docstring); whether it did."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(mallopt(param, value) == 1 for param, value in
               ((M_MMAP_THRESHOLD, MMAP_THRESHOLD), (M_TRIM_THRESHOLD, TRIM_THRESHOLD), (M_TOP_PAD, TOP_PAD)))
