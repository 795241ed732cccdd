"""Measured peak tensor memory on any device, for checking :mod:`race.study.memory`.

:class:`LiveTensorBytes` is a dispatch mode that follows every storage an operator returns
until it is freed and keeps the peak of their sum: the same quantity as
``torch.cuda.max_memory_allocated`` and as torch.profiler's memory timeline on the CPU (which
``bench/calibration/memory_estimate.py --profiler`` also reports), without the profiler's
cost. What existed before the mode was entered (weights loaded outside it) is not counted;
storages that no operator returned (a safetensors memory map) are not either.
"""

from __future__ import annotations

import weakref

from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveTensorBytes(TorchDispatchMode):
    """``with LiveTensorBytes() as probe: ...``; then ``probe.peak`` (bytes) and
    ``probe.largest`` (the largest storages alive at the peak: bytes, operator, shape)."""

    def __init__(self, keep: int = 5):
        super().__init__()
        self.live = self.peak = 0
        self.keep = keep
        self.largest: list[tuple] = []
        self._alive: dict[int, tuple] = {}

    def _freed(self, key: int, nbytes: int) -> None:
        self.live -= nbytes
        self._alive.pop(key, None)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        import torch

        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if not isinstance(t, torch.Tensor):
                continue
            storage = t.untyped_storage()
            key, nbytes = storage.data_ptr(), storage.nbytes()
            if nbytes == 0 or key in self._alive:  # a view, or an in-place result
                continue
            self._alive[key] = (nbytes, str(func), tuple(t.shape), str(t.dtype))
            self.live += nbytes
            weakref.finalize(storage, self._freed, key, nbytes)
            if self.live > self.peak:
                self.peak = self.live
                self.largest = sorted(self._alive.values(), reverse=True)[:self.keep]
        return out
