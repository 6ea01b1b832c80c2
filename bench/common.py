"""Shared set-up for the benchmarks: text embeddings shaped like a real run's, and interleaved timing."""

from __future__ import annotations

import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


class Timer:
    """Wall time on the CPU; CUDA events on a GPU (both synchronised at the end of the measured call)."""

    def __init__(self, device: torch.device):
        self.device = device

    def __call__(self, fn):
        if self.device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize()
            start.record()
            result = fn()
            end.record()
            torch.cuda.synchronize()
            return result, start.elapsed_time(end) / 1000.0
        started = time.perf_counter()
        result = fn()
        return result, time.perf_counter() - started


def interleaved(timer: Timer, runs: dict, repeats: int) -> dict:
    """Runs each callable `repeats` times, alternating their order round by round so that machine noise
    falls on all of them alike. Returns {name: (last result, fastest seconds, all seconds)}: interference from
    the rest of the machine only ever adds time, so the fastest of the repeats is the least disturbed one."""
    names = list(runs)
    times = {name: [] for name in names}
    results = {}
    for r in range(repeats):
        order = names if r % 2 == 0 else list(reversed(names))
        for name in order:
            results[name], seconds = timer(runs[name])
            times[name].append(seconds)
    return {name: (results[name], min(times[name]), times[name]) for name in names}


def text_embeddings(seed: int, tokens: int = 512, real: int = 24, width: int = 4096) -> torch.Tensor:
    """Shaped like umt5 output: 512 positions, zeros past the prompt's own tokens."""
    g = torch.Generator().manual_seed(seed)
    out = torch.zeros(1, tokens, width)
    out[:, :real] = torch.randn(1, real, width, generator=g)
    return out
