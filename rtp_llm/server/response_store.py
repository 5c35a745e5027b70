"""The Responses API's store: responses created with store=true, kept in memory for GET / DELETE
/v1/responses/{id} and for previous_response_id, with the conversation that led to each (its input items, the
previous responses' included, and its output). Bounded: the oldest go first beyond max_items, and none outlives
ttl_s. One process: a restart forgets them (documented)."""

from __future__ import annotations

import time
from collections import OrderedDict
from typing import Optional


class ResponseStore:
    def __init__(self, max_items: int = 1024, ttl_s: float = 3600.0):
        self.max_items, self.ttl_s = max_items, ttl_s
        self._items: OrderedDict[str, tuple[float, dict, list]] = OrderedDict()

    def put(self, rid: str, body: dict, conversation: list[dict]) -> None:
        self._expire()
        self._items[rid] = (time.monotonic(), body, conversation)
        while len(self._items) > self.max_items:
            self._items.popitem(last=False)

    def get(self, rid: str) -> Optional[tuple[dict, list]]:
        self._expire()
        hit = self._items.get(rid)
        return None if hit is None else (hit[1], hit[2])

    def delete(self, rid: str) -> bool:
        return self._items.pop(rid, None) is not None

    def _expire(self) -> None:
        cutoff = time.monotonic() - self.ttl_s
        while self._items and next(iter(self._items.values()))[0] < cutoff:
            self._items.popitem(last=False)
