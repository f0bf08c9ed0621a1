// What one round of a single-copy device transfer costs on this GPU, piece by
// piece (issue 32): the driver calls braid makes per send and per call, and the
// latency of GPU work that alternates between two ranks, as threads of one
// process (one context) and as two processes (two contexts time-sharing the GPU).
//
//   gpu-probe solo            driver-call latencies and the thread ping-pong
//   gpu-probe pair DIR        two processes (run it twice, same DIR): IPC open,
//                             close and the process ping-pong
//
// Prints one JSON object per line: {"probe":NAME,"median_us":..,"p90_us":..}.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <string>
#include <sys/mman.h>
#include <thread>
#include <unistd.h>
#include <vector>
#include <cuda_runtime.h>

#define CK(x)                                                                 \
  do {                                                                        \
    cudaError_t e_ = (x);                                                     \
    if (e_ != cudaSuccess) {                                                  \
      fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x,              \
              cudaGetErrorString(e_));                                        \
      exit(1);                                                                \
    }                                                                         \
  } while (0)

using clk = std::chrono::steady_clock;
static double us_since(clk::time_point t) {
  return std::chrono::duration<double, std::micro>(clk::now() - t).count();
}
static void report(const char* name, std::vector<double> v) {
  std::sort(v.begin(), v.end());
  printf("{\"probe\":\"%s\",\"n\":%zu,\"median_us\":%.2f,\"p90_us\":%.2f,\"min_us\":%.2f}\n", name, v.size(),
         v[v.size() / 2], v[v.size() * 9 / 10], v[0]);
  fflush(stdout);
}
static void wait_event(cudaEvent_t e) {
  while (cudaEventQuery(e) == cudaErrorNotReady) {
  }
}

static const size_t PIECE = 512 << 10;
static const size_t BIG = 256 << 20;

// One side of a ping-pong: wait for our turn, copy PIECE on the GPU (from
// `src`), wait for the copy, hand the turn over. Returns per-hop times.
static std::vector<double> pingpong(std::atomic<int>* turn, int me, int hops, void* dst, const void* src,
                                    cudaStream_t s, cudaEvent_t e) {
  std::vector<double> v;
  for (int i = 0; i < hops; i++) {
    auto t = clk::now();
    while (turn->load(std::memory_order_acquire) != me) {
    }
    CK(cudaMemcpyAsync(dst, src, PIECE, cudaMemcpyDeviceToDevice, s));
    CK(cudaEventRecord(e, s));
    wait_event(e);
    turn->store(1 - me, std::memory_order_release);
    if (i > 0) v.push_back(us_since(t));
  }
  return v;
}

static void solo() {
  CK(cudaSetDevice(0));
  void *a, *b;
  CK(cudaMalloc(&a, BIG));
  CK(cudaMalloc(&b, BIG));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e;
  CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  std::vector<double> v;
  for (int i = 0; i < 200; i++) {
    cudaIpcMemHandle_t h;
    auto t = clk::now();
    CK(cudaIpcGetMemHandle(&h, (char*)a));
    v.push_back(us_since(t));
  }
  report("ipc_get_mem_handle", v);
  v.clear();
  for (int i = 0; i < 200; i++) {
    auto t = clk::now();
    // The runtime has no address-range call: cudaPointerGetAttributes is the nearest.
    cudaPointerAttributes at;
    CK(cudaPointerGetAttributes(&at, (char*)a + 4096));
    v.push_back(us_since(t));
  }
  report("pointer_attributes", v);
  v.clear();
  for (int i = 0; i < 200; i++) {
    auto t = clk::now();
    CK(cudaEventRecord(e, s));
    v.push_back(us_since(t));
    wait_event(e);
  }
  report("event_record", v);
  for (size_t bytes : {PIECE, (size_t)64 << 20}) {
    v.clear();
    for (int i = 0; i < 100; i++) {
      auto t = clk::now();
      CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s));
      CK(cudaEventRecord(e, s));
      wait_event(e);
      v.push_back(us_since(t));
    }
    report(bytes == PIECE ? "copy_512k_launch_to_done" : "copy_64m_launch_to_done", v);
  }
  v.clear();
  for (int i = 0; i < 200; i++) {
    auto t = clk::now();
    CK(cudaStreamSynchronize(s));
    v.push_back(us_since(t));
  }
  report("stream_sync_idle", v);
  // Two threads of one process, each with its own stream, taking turns.
  std::atomic<int> turn{0};
  cudaStream_t s2;
  CK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  cudaEvent_t e2;
  CK(cudaEventCreateWithFlags(&e2, cudaEventDisableTiming));
  std::vector<double> other;
  std::thread th([&] {
    CK(cudaSetDevice(0));
    other = pingpong(&turn, 1, 300, (char*)b + PIECE, a, s2, e2);
  });
  auto mine = pingpong(&turn, 0, 300, b, (char*)a + PIECE, s, e);
  th.join();
  report("threads_pingpong_round", mine);
}

struct Shared {
  std::atomic<int> turn;
  std::atomic<int> ready;
  cudaIpcMemHandle_t handle;
};

static void pair(const char* dir) {
  std::string path = std::string(dir) + "/probe-shm";
  int fd = open(path.c_str(), O_RDWR | O_CREAT, 0600);
  if (fd < 0 || ftruncate(fd, sizeof(Shared)) != 0) {
    perror("probe-shm");
    exit(1);
  }
  auto* sh = (Shared*)mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  // The first to take the lock file is the owner.
  int owner = open((std::string(dir) + "/probe-owner").c_str(), O_CREAT | O_EXCL | O_WRONLY, 0600) >= 0;
  CK(cudaSetDevice(0));
  void *mine, *peer = nullptr;
  CK(cudaMalloc(&mine, BIG));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e;
  CK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  if (owner) {
    CK(cudaIpcGetMemHandle(&sh->handle, mine));
    sh->turn.store(0);
    sh->ready.store(1, std::memory_order_release);
    while (sh->ready.load(std::memory_order_acquire) != 2) {
    }
  } else {
    while (sh->ready.load(std::memory_order_acquire) != 1) {
    }
    std::vector<double> op, cl;
    for (int i = 0; i < 20; i++) {
      auto t = clk::now();
      CK(cudaIpcOpenMemHandle(&peer, sh->handle, cudaIpcMemLazyEnablePeerAccess));
      op.push_back(us_since(t));
      t = clk::now();
      CK(cudaIpcCloseMemHandle(peer));
      cl.push_back(us_since(t));
    }
    report("ipc_open_mem_handle", op);
    report("ipc_close_mem_handle", cl);
    CK(cudaIpcOpenMemHandle(&peer, sh->handle, cudaIpcMemLazyEnablePeerAccess));
    sh->ready.store(2, std::memory_order_release);
  }
  // Owner copies within its memory; the other reads the owner's through IPC.
  const void* src = owner ? (char*)mine + PIECE : peer;
  void* dst = owner ? mine : (void*)((char*)mine + 2 * PIECE);
  auto v = pingpong(&sh->turn, owner ? 0 : 1, 300, dst, src, s, e);
  if (owner) report("processes_pingpong_round", v);
  // Both finish their hops before either frees.
  sh->ready.fetch_add(1);
  while (sh->ready.load() < 4) {
  }
  if (!owner) CK(cudaIpcCloseMemHandle(peer));
  sh->ready.fetch_add(1);
  while (sh->ready.load() < 6) {
  }
  CK(cudaFree(mine));
}

int main(int argc, char** argv) {
  if (argc >= 2 && !strcmp(argv[1], "solo")) {
    solo();
  } else if (argc >= 3 && !strcmp(argv[1], "pair")) {
    pair(argv[2]);
  } else {
    fprintf(stderr, "usage: gpu-probe solo | pair DIR\n");
    return 2;
  }
  return 0;
}
