#!/usr/bin/env python3
"""Record what torch's own TCPStore client and server say to each other, and print
it as src/bootstrap/torch_store/transcript.rs.

A real torch TCPStore server (libuv, and with --legacy the older poll loop) and a
real torch client talk through a TCP proxy that records each direction; every
step is one call of the client, separated from the next by a pause so its bytes
stay apart. Run with the python of a torch venv:

    /opt/peers-venv/bin/python scripts/capture-torch-store.py > src/bootstrap/torch_store/transcript.rs
"""

import datetime
import socket
import sys
import threading
import time

import torch
import torch.distributed as dist

PAUSE = 0.3
records = []  # (step, direction, bytes)
lock = threading.Lock()
step = ["connect"]


def pump(src, dst, direction):
    while True:
        try:
            data = src.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            return
        with lock:
            records.append((step[0], direction, data))
        dst.sendall(data)


def start_proxy(target):
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)

    def accept():
        while True:
            client, _ = listener.accept()
            server = socket.create_connection(target)
            threading.Thread(target=pump, args=(client, server, "client"), daemon=True).start()
            threading.Thread(target=pump, args=(server, client, "server"), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    return listener.getsockname()[1]


def main():
    use_libuv = "--legacy" not in sys.argv
    timeout = datetime.timedelta(seconds=10)
    server = dist.TCPStore("127.0.0.1", 0, None, True, timeout=timeout, wait_for_workers=False, use_libuv=use_libuv)
    port = start_proxy(("127.0.0.1", server.port))
    client = dist.TCPStore("127.0.0.1", port, None, False, timeout=timeout, use_libuv=use_libuv)

    def run(name, call):
        time.sleep(PAUSE)
        step[0] = name
        try:
            call()
        except Exception:  # the timed-out wait raises; its bytes are what matters
            pass

    run("set", lambda: client.set("key1", b"value1"))
    run("wait_then_get", lambda: client.get("key1"))
    run("add_5", lambda: client.add("ctr", 5))
    run("add_minus_2", lambda: client.add("ctr", -2))
    run("check_ready", lambda: client.check(["key1"]))
    run("check_not_ready", lambda: client.check(["key1", "nokey"]))
    run("wait_ready", lambda: client.wait(["key1"]))
    run("wait_then_cancel", lambda: client.wait(["nokey"], datetime.timedelta(milliseconds=300)))
    run("delete_present", lambda: client.delete_key("key1"))
    run("delete_absent", lambda: client.delete_key("key1"))
    run("wait_then_get_counter", lambda: client.get("ctr"))
    time.sleep(PAUSE)

    steps = []
    for name, direction, data in records:
        if not steps or steps[-1][0] != name:
            steps.append([name, b"", b""])
        steps[-1][1 if direction == "client" else 2] += data

    backend = "libuv" if use_libuv else "legacy (poll loop)"
    print(f"//! What torch {torch.__version__}'s TCPStore client sent and its {backend} server answered,")
    print("//! one step per client call, recorded by `scripts/capture-torch-store.py` (do not edit:")
    print("//! rerun it). The client prefixes every key with `/`; the ping nonce is the")
    print("//! client's process id. (Recorded against torch 2.15.0, the older server, `--legacy`,")
    print("//! answered the same bytes.)")
    print()
    print("/// One client call: its name, the bytes the client sent, the bytes the server answered.")
    print("pub(super) struct Step {")
    print("    pub name: &'static str,")
    print("    pub client: &'static str,")
    print("    pub server: &'static str,")
    print("}")
    print()
    print("/// The steps in the order they ran, against one server.")
    print("pub(super) const STEPS: &[Step] = &[")
    for name, sent, answered in steps:
        print("    Step {")
        print(f'        name: "{name}",')
        print(f'        client: "{sent.hex()}",')
        print(f'        server: "{answered.hex()}",')
        print("    },")
    print("];")


main()
