"""A 0-9-1 channel's publish path with one group, this tree against another (old against new).

Session 21 (issue 34) made a channel hold the commands behind a topology change it issued
(node/amqp091/channel.py, "order behind a topology change"); with no change in flight the cost is a
flag read per method and per publish.  This measures, in process (a recording connection whose
``submit`` does nothing: no log, no apply), the ns per publish of

- ``publish_whole`` (the one-step path of a publish read whole: method, header and body), and
- the frame-by-frame path (``on_method`` basic.publish, ``on_header``, ``on_body``),

in CPU time of the thread (the machine is shared: wall time would count the waits),

(``--amqp010``: a 0-10 session's ``on_command`` of a message.transfer, whose hold behind a change
costs two attribute reads per command with no change in flight)

for each source tree given, in alternating rounds, each round in a fresh subprocess (so both
trees' modules never meet), and prints the best and median of the rounds per tree.

    .venv/bin/python bench/channel_hold.py --against /path/to/old/tree [--rounds 10]

(``git archive <commit> | tar -x -C /tmp/old`` makes an old tree; raftmq/ is the package there.)
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]

ROUND = r'''
import struct, sys, time
sys.path.insert(0, sys.argv[1])
from types import SimpleNamespace
from raftmq.node.amqp091.channel import Channel
from raftmq.protocol.amqp091 import methods as m
from raftmq.protocol.amqp091.frames import WholePublish


class Access:
    def authorize(self, command): pass
    def require(self, *args): pass


class Host:
    def __init__(self):
        self.broker = SimpleNamespace(machine=SimpleNamespace(vhosts={"/": SimpleNamespace(exchanges={"": 1})}),
                                      submit=lambda command, deferrable=False, size=0: None)
        self.config = SimpleNamespace(raft_groups=1, max_message_size=1 << 20, prefetch_readahead=0,
                                      autoack_credit=0)
        self.conn_id, self.access, self.vhost, self.frame_max = "c", Access(), "/", 131072
        self.is_publisher, self.client_capabilities, self.confirm_dirty = False, {}, {}
        self.write_high, self.counts = 1 << 20, [0, 0]
    def write(self, data): pass
    def issue_token(self): return 1
    def request(self, channel, command, method_cls, on_ok, deferrable=False, size=0): on_ok(None)
    def request_publish(self, *args): pass
    def forget_channel(self, number): pass


ch = Channel(Host(), 1)
ch.on_method(m.ChannelOpen())
whole = WholePublish(0, 1, "", "q", 0, b"\x10\x00\x02", b"x" * 100, b"", 0)
method = m.BasicPublish(exchange="", routing_key="q")
header = struct.pack(">HHQH", 60, 0, 100, 0x1000) + b"\x02"
body = b"x" * 100
n = int(sys.argv[2])
publish_whole, on_method, on_header, on_body = ch.publish_whole, ch.on_method, ch.on_header, ch.on_body
start = time.thread_time()
for _ in range(n):
    publish_whole(whole)
middle = time.thread_time()
for _ in range(n):
    on_method(method)
    on_header(header)
    on_body(body)
end = time.thread_time()
print((middle - start) / n * 1e9, (end - middle) / n * 1e9)
'''


ROUND_010 = r'''
import sys, time
sys.path.insert(0, sys.argv[1])
from types import SimpleNamespace
from raftmq.node.amqp010.session import ServerSession
from raftmq.protocol.amqp010 import codec as c


class Access:
    def authorize(self, command): pass


class Host:
    def __init__(self):
        self.broker = SimpleNamespace(config=SimpleNamespace(raft_groups=1))
        self.conn_id, self.principal, self.access, self.vhost = "c", None, Access(), "/"
        self.counts, self.completion_due = [0, 0], {}
    def send(self, channel, method): pass
    def submit(self, command, deferrable=False): pass
    def request(self, session, command, on_ok, on_error=None, deferrable=False): pass
    def drop_session(self, channel): pass


session = ServerSession(Host(), 1, b"s")
session.attaching, session.attached = False, True
headers = [c.DeliveryProperties(routing_key="q", delivery_mode=1), c.MessageProperties()]
n = int(sys.argv[2]) // 4
transfers = [c.MessageTransfer(destination="", accept_mode=1, acquire_mode=0, headers=headers, body=b"x" * 100)
             for _ in range(n)]
on_command = session.on_command
start = time.thread_time()
for transfer in transfers:
    on_command(transfer)
print((time.thread_time() - start) / n * 1e9, 0.0)
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--against", required=True, help="the other source tree (the old one)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--publishes", type=int, default=200_000, help="per path per round")
    parser.add_argument("--amqp010", action="store_true",
                        help="a 0-10 session's on_command of message.transfer instead (a quarter as many)")
    args = parser.parse_args()
    code = ROUND_010 if args.amqp010 else ROUND
    trees = {"old": str(Path(args.against).resolve()), "new": str(HERE)}
    figures: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            out = subprocess.run([sys.executable, "-c", code, tree, str(args.publishes)], check=True,
                                 capture_output=True, text=True, cwd="/").stdout.split()
            figures[name].append((float(out[0]), float(out[1])))
    for name, values in figures.items():
        whole = [w for w, _ in values]
        frames = [f for _, f in values]
        if args.amqp010:
            print(f"{name} ({trees[name]}): 0-10 message.transfer on_command {min(whole):6.0f} ns best, "
                  f"{statistics.median(whole):6.0f} median")
            continue
        print(f"{name} ({trees[name]}): publish_whole {min(whole):6.0f} ns best, {statistics.median(whole):6.0f} "
              f"median; frame by frame {min(frames):6.0f} best, {statistics.median(frames):6.0f} median")


if __name__ == "__main__":
    main()
