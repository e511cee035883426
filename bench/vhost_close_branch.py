"""The cost of OUT_VHOST_CLOSED's test in Broker._on_outputs (node/broker.py), old loop against new.

Outputs for other nodes' connections (most of a follower's: every delivery is applied everywhere)
take the ``endpoint is None`` branch, where the vhost-closed output is looked for.  Testing the
kind there (``out[1] == OUT_VHOST_CLOSED``) measured +12 ns per output; testing ``out[0] is None``
first, +5 ns.  Run: ``python bench/vhost_close_branch.py``; prints the best of 5 per variant.
"""

import timeit

OUT_VHOST_CLOSED = 6
outputs = [(f"n2.b.{i % 50}", 1, 1, "tag", None) for i in range(1_000_000)]
endpoints = {"n1.b.1": object()}


def old() -> None:
    for out in outputs:
        endpoint = endpoints.get(out[0])
        if endpoint is None:
            continue


def kind_first() -> None:
    for out in outputs:
        endpoint = endpoints.get(out[0])
        if endpoint is None:
            if out[1] == OUT_VHOST_CLOSED:
                pass
            continue


def conn_first() -> None:  # what node/broker.py does
    for out in outputs:
        endpoint = endpoints.get(out[0])
        if endpoint is None:
            if out[0] is None and out[1] == OUT_VHOST_CLOSED:
                pass
            continue


if __name__ == "__main__":
    for name, fn in (("old", old), ("kind first", kind_first), ("conn first (new)", conn_first)) * 2:
        best = min(timeit.repeat(fn, number=1, repeat=5))
        print(f"{name}: {best * 1000:.1f} ms per 1M foreign outputs ({best * 1e3:.1f} ns each)")
