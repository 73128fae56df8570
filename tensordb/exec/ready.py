"""The pool's ready queues: one heap per worker, all under one lock.

A worker takes its best item: the lowest ``(class, rank)``, where aggregation folds (class 0) come
before task runs (class 1), and ranks are the plan's memory-aware order (``physical/order.py``).
Before a run item is taken, its run may refuse it for now (``admit``: the memory budget, see
``budget.py``); the worker then waits until something is put or released (``wake``).
"""
from __future__ import annotations

import heapq
import itertools
import threading

__all__ = ["ReadyQueues", "STOP"]

STOP = (-1, -1)  # the priority of the item that ends a worker thread (None)


class ReadyQueues:
    def __init__(self, workers: int) -> None:
        self.lock = threading.Lock()
        self.conds = [threading.Condition(self.lock) for _ in range(workers)]
        self.heaps: list[list] = [[] for _ in range(workers)]
        self._seq = itertools.count()  # ties keep the order items were put in

    def __len__(self) -> int:
        return len(self.heaps)

    def put(self, w: int, priority: tuple, item) -> None:
        with self.lock:
            heapq.heappush(self.heaps[w], (priority, next(self._seq), item))
            self.conds[w].notify()

    def get(self, w: int):
        """Worker ``w``'s best item, once its run admits it (``item[0].admit(item)``, called
        under the lock); None ends the worker."""
        heap, cond = self.heaps[w], self.conds[w]
        with self.lock:
            while True:
                if heap:
                    item = heap[0][2]
                    if item is None or item[0].admit(item):
                        heapq.heappop(heap)
                        return item
                cond.wait()

    def wake(self) -> None:
        """Memory was released or a task ended: workers waiting for room look again."""
        with self.lock:
            for cond in self.conds:
                cond.notify()
