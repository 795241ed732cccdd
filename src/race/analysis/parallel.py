"""``pmap``: the report's independent pieces of work (one fit, one band, one figure file) on
several processes.

The report is the study's last job, so it runs alone: the cores the model jobs used are free,
and ``race report --threads N`` (the rule passes its ``threads``) spends them here. Each item
is computed exactly as in one process -- every piece is a pure function of its inputs with its
own seed -- and results come back in input order, so the report is the same file for any N.
Processes, not threads: the fits and matplotlib hold the GIL.
"""

from __future__ import annotations

import math
import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import TypeVar

T = TypeVar("T")
R = TypeVar("R")


def pmap(fn: Callable[[T], R], items: Sequence[T], workers: int = 1) -> list[R]:
    """``[fn(x) for x in items]``, on ``workers`` forked processes when that is more than one
    and there is more than one item. ``fn`` and the items must pickle (a module-level function
    or a ``functools.partial`` of one)."""
    if workers <= 1 or len(items) < 2:
        return [fn(x) for x in items]
    workers = min(workers, len(items))
    # Fork: the children start with the parent's imports (pandas, scipy, matplotlib), which a
    # spawned child would spend seconds importing again.
    context = multiprocessing.get_context("fork")
    chunk = max(1, math.ceil(len(items) / (4 * workers)))
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        return list(pool.map(fn, items, chunksize=chunk))
