/* Every collective and send/recv of the C ABI, blocking and asynchronous (waited
 * for, or polled with braid_work_test), in place and out of place, on every dtype
 * and reduce op, with exact results. Run on 3 ranks: braid run -n 3 ./collectives */
#include "check.h"

#define N 13 /* elements per block: odd, so blocks do not line up with anything */

enum mode { BLOCKING, ASYNC_WAIT, ASYNC_POLL };
static const char *const MODE_NAMES[3] = {"blocking", "async+wait", "async+test"};

static braid_comm *comm;
static int world;
static enum mode mode;
static const char *what = ""; /* the case being run, for messages */

/* Run the blocking or the async form of a call, per `mode`; the async form names
 * `&w_`. Waits (or polls) until the work is done, then frees it. */
#define RUN(sync_call, async_call)                                                   \
    do {                                                                             \
        if (mode == BLOCKING) {                                                      \
            EXPECT_OK(sync_call);                                                    \
        } else {                                                                     \
            braid_work *w_ = NULL;                                                   \
            EXPECT_OK(async_call);                                                   \
            CHECK(w_ != NULL, "%s: no work handle", what);                           \
            if (w_) complete(w_);                                                    \
        }                                                                            \
    } while (0)

static void complete(braid_work *w) {
    if (mode == ASYNC_POLL) {
        braid_result rc;
        while ((rc = braid_work_test(w)) == BRAID_IN_PROGRESS) {
        }
        CHECK(rc == BRAID_SUCCESS, "%s: test returned %d: %s", what, (int)rc, braid_last_error());
    }
    EXPECT_OK(braid_work_wait(w)); /* again after a test: the same result */
    EXPECT_OK(braid_work_free(w));
}

/* Input of reductions: small integers whose sum, product, min, max and average
 * over 3 ranks are exact in every dtype (products at most 120, sums at most 60). */
static double red_in(braid_reduce_op op, int r, size_t j) {
    return (double)((r + j) % 3 + 1) + 3.0 * (double)(j % (op == BRAID_PROD ? 2 : 7));
}

static double red_out(braid_reduce_op op, size_t j) {
    double acc = red_in(op, 0, j);
    for (int r = 1; r < world; r++) {
        double v = red_in(op, r, j);
        switch (op) {
        case BRAID_SUM: case BRAID_AVG: acc += v; break;
        case BRAID_PROD: acc *= v; break;
        case BRAID_MIN: acc = v < acc ? v : acc; break;
        case BRAID_MAX: acc = v > acc ? v : acc; break;
        }
    }
    return op == BRAID_AVG ? acc / world : acc;
}

/* Data that moves without reduction: distinct per rank and element. */
static double mv(int r, size_t j) { return (double)((r * 37 + (int)j) % 101); }

static void *buffer(braid_dtype d, size_t n) {
    void *p = malloc(n * dtype_size(d) + 1);
    memset(p, 0x5a, n * dtype_size(d) + 1);
    return p;
}

static void all_reduce(braid_dtype d, braid_reduce_op op, int in_place) {
    char *send = buffer(d, N), *recv = in_place ? send : buffer(d, N);
    for (size_t j = 0; j < N; j++) put(d, send, j, red_in(op, g_rank, j));
    RUN(braid_all_reduce(send, recv, N, d, op, comm), braid_all_reduce_async(send, recv, N, d, op, comm, &w_));
    for (size_t j = 0; j < N; j++)
        CHECK(get(d, recv, j) == red_out(op, j), "%s all_reduce in_place=%d [%zu] = %g, expected %g", what, in_place,
              j, get(d, recv, j), red_out(op, j));
    if (!in_place) free(recv);
    free(send);
}

static void reduce(braid_dtype d, braid_reduce_op op, int root, int in_place) {
    char *send = buffer(d, N), *recv = in_place ? send : (g_rank == root ? buffer(d, N) : NULL);
    for (size_t j = 0; j < N; j++) put(d, send, j, red_in(op, g_rank, j));
    RUN(braid_reduce(send, recv, N, d, op, root, comm), braid_reduce_async(send, recv, N, d, op, root, comm, &w_));
    for (size_t j = 0; j < N && recv; j++) {
        double want = g_rank == root ? red_out(op, j) : red_in(op, g_rank, j); /* others: unchanged */
        CHECK(get(d, recv, j) == want, "%s reduce root=%d in_place=%d [%zu] = %g, expected %g", what, root, in_place,
              j, get(d, recv, j), want);
    }
    if (!in_place) free(recv);
    free(send);
}

/* layout 0: separate buffers; 1: send == recv (result at the start); 2: NCCL's
 * recv == send + rank * N (result at block rank). */
static void reduce_scatter(braid_dtype d, braid_reduce_op op, int layout) {
    size_t all = (size_t)world * N;
    char *send = buffer(d, all);
    char *recv = layout == 0 ? buffer(d, N) : layout == 1 ? send : send + (size_t)g_rank * N * dtype_size(d);
    for (size_t j = 0; j < all; j++) put(d, send, j, red_in(op, g_rank, j));
    RUN(braid_reduce_scatter(send, recv, N, d, op, comm),
        braid_reduce_scatter_async(send, recv, N, d, op, comm, &w_));
    for (size_t k = 0; k < N; k++) {
        double want = red_out(op, (size_t)g_rank * N + k);
        CHECK(get(d, recv, k) == want, "%s reduce_scatter layout=%d [%zu] = %g, expected %g", what, layout, k,
              get(d, recv, k), want);
    }
    if (layout == 0) free(recv);
    free(send);
}

/* in place: the root's data is in recv; otherwise non-roots pass send = NULL. */
static void broadcast(braid_dtype d, int root, int in_place) {
    char *recv = buffer(d, N), *send = in_place ? recv : (g_rank == root ? buffer(d, N) : NULL);
    for (size_t j = 0; j < N && g_rank == root; j++) put(d, send, j, mv(root, j));
    RUN(braid_broadcast(send, recv, N, d, root, comm), braid_broadcast_async(send, recv, N, d, root, comm, &w_));
    for (size_t j = 0; j < N; j++)
        CHECK(get(d, recv, j) == mv(root, j), "%s broadcast root=%d in_place=%d [%zu] = %g, expected %g", what, root,
              in_place, j, get(d, recv, j), mv(root, j));
    if (!in_place && send) free(send);
    free(recv);
}

/* layout 0: separate; 1: send == recv (block read from the start); 2: NCCL's
 * send == recv + rank * N. */
static void all_gather(braid_dtype d, int layout) {
    size_t all = (size_t)world * N;
    char *recv = buffer(d, all);
    char *send = layout == 0 ? buffer(d, N) : layout == 1 ? recv : recv + (size_t)g_rank * N * dtype_size(d);
    for (size_t j = 0; j < N; j++) put(d, send, j, mv(g_rank, j));
    RUN(braid_all_gather(send, recv, N, d, comm), braid_all_gather_async(send, recv, N, d, comm, &w_));
    for (size_t j = 0; j < all; j++) {
        double want = mv((int)(j / N), j % N);
        CHECK(get(d, recv, j) == want, "%s all_gather layout=%d [%zu] = %g, expected %g", what, layout, j,
              get(d, recv, j), want);
    }
    if (layout == 0) free(send);
    free(recv);
}

static void all_to_all(braid_dtype d, int in_place) {
    size_t all = (size_t)world * N;
    char *send = buffer(d, all), *recv = in_place ? send : buffer(d, all);
    for (size_t j = 0; j < all; j++) put(d, send, j, mv(g_rank, j)); /* block q goes to rank q */
    RUN(braid_all_to_all(send, recv, N, d, comm), braid_all_to_all_async(send, recv, N, d, comm, &w_));
    for (size_t j = 0; j < all; j++) {
        double want = mv((int)(j / N), (size_t)g_rank * N + j % N);
        CHECK(get(d, recv, j) == want, "%s all_to_all in_place=%d [%zu] = %g, expected %g", what, in_place, j,
              get(d, recv, j), want);
    }
    if (!in_place) free(recv);
    free(send);
}

/* A chain 0 -> 1 -> ... -> world-1 -> 0: rank 0 sends first, the others receive first. */
static void send_recv(braid_dtype d) {
    int next = (g_rank + 1) % world, prev = (g_rank + world - 1) % world;
    char *out = buffer(d, N), *in = buffer(d, N);
    for (size_t j = 0; j < N; j++) put(d, out, j, mv(g_rank, j));
    for (int step = 0; step < 2; step++) {
        if ((step == 0) == (g_rank == 0))
            RUN(braid_send(out, N, d, next, comm), braid_send_async(out, N, d, next, comm, &w_));
        else
            RUN(braid_recv(in, N, d, prev, comm), braid_recv_async(in, N, d, prev, comm, &w_));
    }
    for (size_t j = 0; j < N; j++)
        CHECK(get(d, in, j) == mv(prev, j), "%s recv [%zu] = %g, expected %g", what, j, get(d, in, j), mv(prev, j));
    free(out);
    free(in);
}

/* Several async calls in flight at once, completed in reverse order. */
static void overlapping(void) {
    enum { K = 4, M = 100000 };
    int32_t *bufs[K];
    braid_work *works[K];
    for (int k = 0; k < K; k++) {
        bufs[k] = malloc(M * sizeof(int32_t));
        for (int j = 0; j < M; j++) bufs[k][j] = g_rank * (k + 1) + j % 1000;
        EXPECT_OK(braid_all_reduce_async(bufs[k], bufs[k], M, BRAID_I32, BRAID_SUM, comm, &works[k]));
    }
    for (int k = K - 1; k >= 0; k--) {
        EXPECT_OK(braid_work_wait(works[k]));
        EXPECT_OK(braid_work_free(works[k]));
        int bad = 0;
        for (int j = 0; j < M; j++) bad += bufs[k][j] != (k + 1) * world * (world - 1) / 2 + world * (j % 1000);
        CHECK(bad == 0, "overlapping all_reduce %d: %d wrong elements", k, bad);
        free(bufs[k]);
    }
}

/* A second communicator from braid_comm_init; destroyed with work outstanding
 * (destroy waits for it), and work freed before it was waited for (free waits). */
static void second_communicator(void) {
    braid_comm *c2 = NULL;
    EXPECT_OK(braid_comm_init(g_rank, world, getenv("BRAID_STORE"), &c2));
    if (!c2) return;
    int r = -1, n = -1;
    EXPECT_OK(braid_comm_rank(c2, &r));
    EXPECT_OK(braid_comm_size(c2, &n));
    CHECK(r == g_rank && n == world, "braid_comm_init: rank %d of %d", r, n);
    double a[64], b[64];
    for (int j = 0; j < 64; j++) a[j] = b[j] = g_rank + j;
    braid_work *wa = NULL, *wb = NULL;
    EXPECT_OK(braid_all_reduce_async(a, a, 64, BRAID_F64, BRAID_MAX, c2, &wa));
    EXPECT_OK(braid_all_reduce_async(b, b, 64, BRAID_F64, BRAID_SUM, c2, &wb));
    EXPECT_OK(braid_work_free(wa)); /* not waited for: free waits */
    for (int j = 0; j < 64; j++) CHECK(a[j] == world - 1 + j, "max after free [%d] = %g", j, a[j]);
    EXPECT_OK(braid_comm_destroy(c2)); /* wb outstanding (or done): destroy finishes it */
    EXPECT_OK(braid_work_wait(wb));
    EXPECT_OK(braid_work_free(wb));
    for (int j = 0; j < 64; j++)
        CHECK(b[j] == world * (world - 1) / 2 + world * j, "sum after destroy [%d] = %g", j, b[j]);
}

int main(void) {
    EXPECT_OK(braid_comm_init_from_env(&comm));
    if (!comm) return report("collectives");
    EXPECT_OK(braid_comm_rank(comm, &g_rank));
    EXPECT_OK(braid_comm_size(comm, &world));
    CHECK(world == 3, "run on 3 ranks (the expected averages assume it), not %d", world);
    CHECK(strlen(braid_version()) > 0, "braid_version is empty");
    char label[64];
    for (int m = BLOCKING; m <= ASYNC_POLL; m++) {
        mode = (enum mode)m;
        for (int di = 0; di < 8; di++) {
            braid_dtype d = ALL_DTYPES[di];
            for (int oi = 0; oi < 5; oi++) {
                snprintf(label, sizeof label, "%s %s %s", MODE_NAMES[m], DTYPE_NAMES[di], OP_NAMES[oi]);
                what = label;
                for (int in_place = 0; in_place < 2; in_place++) {
                    all_reduce(d, ALL_OPS[oi], in_place);
                    reduce(d, ALL_OPS[oi], (oi + in_place) % world, in_place);
                }
                for (int layout = 0; layout < 3; layout++) reduce_scatter(d, ALL_OPS[oi], layout);
            }
            snprintf(label, sizeof label, "%s %s", MODE_NAMES[m], DTYPE_NAMES[di]);
            what = label;
            for (int root = 0; root < world; root++)
                for (int in_place = 0; in_place < 2; in_place++) broadcast(d, root, in_place);
            for (int layout = 0; layout < 3; layout++) all_gather(d, layout);
            for (int in_place = 0; in_place < 2; in_place++) all_to_all(d, in_place);
            send_recv(d);
        }
        what = MODE_NAMES[m];
        RUN(braid_barrier(comm), braid_barrier_async(comm, &w_));
    }
    overlapping();
    second_communicator();
    EXPECT_OK(braid_comm_destroy(comm));
    return report("collectives");
}
