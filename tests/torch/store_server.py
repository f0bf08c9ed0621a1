"""Host torch's own TCPStore server (libuv, or the older one with `legacy`), print
its port, then act as torch's client once a line arrives on stdin: check what
braid's client wrote and write for braid to read. Exits when stdin closes.

    python store_server.py libuv|legacy
"""

import datetime
import sys

import torch.distributed as dist

use_libuv = sys.argv[1] == "libuv"
timeout = datetime.timedelta(seconds=30)
server = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timeout, wait_for_workers=False, use_libuv=use_libuv)
print(server.port, flush=True)
for line in sys.stdin:
    if line.strip() == "check":
        # torch's client puts `/` before every key.
        got = server.get("from-braid")
        if got != b"hello torch":
            sys.exit(f"torch read {got!r} for the key braid set")
        if server.add("counter", 0) != 42:
            sys.exit("torch's counter is not braid's 42")
        server.set("from-torch", b"hello braid")
        print("checked", flush=True)
