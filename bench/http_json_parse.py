"""How parsing a large JSON request body affects the event loop (issue 31 item 9; ops/http/bodies.py).

For a realistic definitions file (200k queues, ~24 MB) and a value bomb (20 MB of ``[[],[],...]``),
prints: the parse time, the Python memory the result takes (tracemalloc), the time to count the
values (ops/http/bodies.json_values), and the longest gap in a 1 ms ticker on the event loop while the
body is parsed (a) on the loop, (b) in a worker thread, (c) in a worker thread with the Python
``object_pairs_hook`` ops/http/bodies.py uses.  Run: ``python bench/http_json_parse.py``.
"""

from __future__ import annotations

import asyncio
import json
import time
import tracemalloc

from raftmq.ops.http.bodies import _object, json_values


def definitions(queues: int) -> bytes:
    return json.dumps({"queues": [{"name": f"queue-{i}", "vhost": "/", "durable": True, "auto_delete": False,
                                   "arguments": {"x-queue-type": "classic"}} for i in range(queues)]}).encode()


def bomb(size: int) -> bytes:
    return b"[" + b"[]," * (size // 3 - 1) + b"[]]"


async def longest_gap(parse, where: str) -> float:
    """The longest interval between ticks of a 1 ms ticker while ``parse`` runs ``where``."""
    loop = asyncio.get_running_loop()
    gaps: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    task = loop.create_task(ticker())
    await asyncio.sleep(0.01)
    if where == "loop":
        parse()
    else:
        await asyncio.to_thread(parse)
    await asyncio.sleep(0.01)
    done.set()
    await task
    return max(gaps)


def main() -> None:
    for name, raw in (("definitions, 200k queues", definitions(200_000)), ("value bomb [[],...]", bomb(20 << 20)),
                      ("value bomb at the 2 M default budget (1 M lists)", bomb(3_000_000)),
                      ("value bomb at the 10,000 budget of other bodies", bomb(15_000))):
        start = time.perf_counter()
        values = json_values(raw)
        counted = time.perf_counter() - start
        start = time.perf_counter()
        json.loads(raw)
        parsed = time.perf_counter() - start
        tracemalloc.start()
        kept = json.loads(raw)
        memory = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        del kept
        print(f"{name}: {len(raw) / 1e6:.1f} MB, {values:,} values (counted in {counted * 1000:.0f} ms), "
              f"parse {parsed:.2f} s, {memory / 1e6:.0f} MB of Python objects")
        for label, where, parse in (("on the loop", "loop", lambda raw=raw: json.loads(raw)),
                                    ("in a thread", "thread", lambda raw=raw: json.loads(raw)),
                                    ("in a thread, object_pairs_hook", "thread",
                                     lambda raw=raw: json.loads(raw, object_pairs_hook=_object))):
            print(f"  {label}: longest loop gap {asyncio.run(longest_gap(parse, where)) * 1000:.0f} ms")


if __name__ == "__main__":
    main()
