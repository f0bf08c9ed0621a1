"""One rank of a user script (the Ray Train case): torch's gloo group first, whose
rank 0 hosts torch's TCPStore on MASTER_PORT, then braid in the same process
through its C ABI, configured from the same environment (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT; no BRAID_* variable). Exits non-zero with the reason
when anything disagrees.

    python init_process_group_then_braid.py PATH/TO/libbraid.so
"""

import ctypes
import datetime
import sys

import torch
import torch.distributed as dist

lib = ctypes.CDLL(sys.argv[1])
lib.braid_last_error.restype = ctypes.c_char_p
lib.braid_comm_init_from_env.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
lib.braid_all_reduce.argtypes = [
    ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_void_p,
]
lib.braid_comm_destroy.argtypes = [ctypes.c_void_p]
BRAID_F32, BRAID_SUM = 0, 0

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=60))
rank, world = dist.get_rank(), dist.get_world_size()


def check(rc, what):
    if rc != 0:
        sys.exit(f"rank {rank}: {what} returned {rc}: {lib.braid_last_error().decode()}")


comm = ctypes.c_void_p()
check(lib.braid_comm_init_from_env(ctypes.byref(comm)), "braid_comm_init_from_env")
n = 4096
buf = (ctypes.c_float * n)(*([float(rank + 1)] * n))
check(lib.braid_all_reduce(buf, buf, n, BRAID_F32, BRAID_SUM, comm), "braid_all_reduce")
want = world * (world + 1) / 2
wrong = [i for i in range(n) if buf[i] != want]
if wrong:
    sys.exit(f"rank {rank}: braid's all-reduce gave {buf[wrong[0]]} at {len(wrong)} places, not {want}")

# torch's own group still works beside braid's.
t = torch.tensor([float(rank)])
dist.all_reduce(t)
if t.item() != sum(range(world)):
    sys.exit(f"rank {rank}: torch's all-reduce gave {t.item()}")
check(lib.braid_comm_destroy(comm), "braid_comm_destroy")
dist.destroy_process_group()
print(f"rank {rank} of {world}: braid and torch agree", flush=True)
