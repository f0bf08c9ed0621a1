/* Gather and scatter from C, blocking and asynchronous, with every root, on every
 * dtype, in every buffer layout, with exact results; and a root that is not a rank
 * refused. Run on 4 ranks: braid run -n 4 ./rooted */
#include "check.h"

#define N 11 /* elements per block: odd */

static braid_comm *comm;
static int world;
static int async_mode;
static const char *what = "";

/* Run the blocking or the async form (which names `&w_`), then wait for the work. */
#define RUN(sync_call, async_call)                                       \
    do {                                                                 \
        if (!async_mode) {                                               \
            EXPECT_OK(sync_call);                                        \
        } else {                                                         \
            braid_work *w_ = NULL;                                       \
            EXPECT_OK(async_call);                                       \
            CHECK(w_ != NULL, "%s: no work handle", what);               \
            if (w_) {                                                    \
                EXPECT_OK(braid_work_wait(w_));                          \
                EXPECT_OK(braid_work_free(w_));                          \
            }                                                            \
        }                                                                \
    } while (0)

/* Distinct per rank and element, exact in every dtype. */
static double mv(int r, size_t j) { return (double)((r * 29 + (int)j) % 97); }

static void *buffer(braid_dtype d, size_t n) {
    void *p = malloc(n * dtype_size(d) + 1);
    memset(p, 0x5a, n * dtype_size(d) + 1);
    return p;
}

/* layout 0: separate buffers (recv NULL off the root); 1: send == recv (the root's
 * block already at block root, MPI_IN_PLACE); 2: at the root send == recv + root * N. */
static void gather(braid_dtype d, int root, int layout) {
    size_t all = (size_t)world * N, es = dtype_size(d);
    int is_root = g_rank == root;
    char *recv = is_root ? buffer(d, all) : (layout == 1 ? buffer(d, N) : NULL);
    char *send = layout == 0 || (!is_root && layout == 2) ? buffer(d, N)
                 : is_root                                ? recv + (size_t)root * N * es
                                                          : recv;
    for (size_t j = 0; j < N; j++) put(d, send, j, mv(g_rank, j));
    char *arg = layout == 1 ? recv : send; /* layout 1 passes the same pointer twice */
    RUN(braid_gather(arg, recv, N, d, root, comm), braid_gather_async(arg, recv, N, d, root, comm, &w_));
    if (is_root) {
        for (size_t k = 0; k < all; k++) {
            double want = mv((int)(k / N), k % N);
            CHECK(get(d, recv, k) == want, "%s gather root=%d layout=%d [%zu] = %g, expected %g", what, root, layout,
                  k, get(d, recv, k), want);
        }
    }
    for (size_t j = 0; j < N; j++)
        CHECK(get(d, send, j) == mv(g_rank, j), "%s gather root=%d layout=%d: send [%zu] changed", what, root,
              layout, j);
    if (send != recv && (layout == 0 || !is_root)) free(send);
    free(recv);
}

/* layout 0: separate buffers (send NULL off the root); 1: send == recv (the root's
 * block stays at block root); 2: at the root recv == send + root * N. */
static void scatter(braid_dtype d, int root, int layout) {
    size_t all = (size_t)world * N, es = dtype_size(d);
    int is_root = g_rank == root;
    char *send = is_root ? buffer(d, all) : (layout == 1 ? buffer(d, N) : NULL);
    char *recv = layout == 0 || (!is_root && layout == 2) ? buffer(d, N)
                 : is_root                                ? send + (size_t)root * N * es
                                                          : send;
    for (size_t k = 0; k < all && is_root; k++) put(d, send, k, mv((int)(k / N), k % N));
    char *arg = layout == 1 ? send : recv;
    RUN(braid_scatter(send, arg, N, d, root, comm), braid_scatter_async(send, arg, N, d, root, comm, &w_));
    for (size_t j = 0; j < N; j++)
        CHECK(get(d, recv, j) == mv(g_rank, j), "%s scatter root=%d layout=%d [%zu] = %g, expected %g", what, root,
              layout, j, get(d, recv, j), mv(g_rank, j));
    for (size_t k = 0; k < all && is_root; k++)
        CHECK(get(d, send, k) == mv((int)(k / N), k % N), "%s scatter root=%d layout=%d: root's send [%zu] changed",
              what, root, layout, k);
    if (recv != send && (layout == 0 || !is_root)) free(recv);
    free(send);
}

int main(void) {
    EXPECT_OK(braid_comm_init_from_env(&comm));
    if (!comm) return report("rooted");
    EXPECT_OK(braid_comm_rank(comm, &g_rank));
    EXPECT_OK(braid_comm_size(comm, &world));
    char label[64];
    for (async_mode = 0; async_mode < 2; async_mode++) {
        for (int di = 0; di < 8; di++) {
            snprintf(label, sizeof label, "%s %s", async_mode ? "async" : "blocking", DTYPE_NAMES[di]);
            what = label;
            for (int root = 0; root < world; root++) {
                for (int layout = 0; layout < 3; layout++) {
                    gather(ALL_DTYPES[di], root, layout);
                    scatter(ALL_DTYPES[di], root, layout);
                }
            }
        }
    }
    int32_t x[N] = {0};
    EXPECT_ERR(braid_gather(x, x, N, BRAID_I32, world, comm), BRAID_ERR_INVALID_ARGUMENT, "root");
    EXPECT_ERR(braid_scatter(x, x, N, BRAID_I32, -1, comm), BRAID_ERR_INVALID_ARGUMENT, "root");
    EXPECT_OK(braid_comm_destroy(comm));
    return report("rooted");
}
