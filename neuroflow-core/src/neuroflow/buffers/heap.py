"""Handing freed heap memory back to the operating system."""

from __future__ import annotations

import ctypes


def return_freed_heap() -> None:
    """Give the pages of freed heap memory back to the OS (glibc's ``malloc_trim``; nothing elsewhere).

    glibc serves arrays below its mmap threshold from its heap and keeps their
    pages after they are freed. That threshold rises to the size of any large
    array freed before (up to 32 MiB), so after a model is built most of its
    parameters, and a traced step's smaller arrays, live on the heap. Called
    where many of them die at once: when parameters are packed into flat
    buffers, and when the traced step's arrays are dropped for the arena.
    """
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError, TypeError):
        return
    trim(0)
