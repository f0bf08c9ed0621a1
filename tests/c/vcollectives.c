/* All-gather-v, reduce-scatter-v and all-to-all-v from C, blocking and asynchronous
 * (issued, then waited on: the arrays the async call was given are scribbled over
 * and freed before the wait, as a caller may), out of place and in place,
 * with uneven counts including zeros, displacements in reverse order with gaps
 * (which must stay untouched), exact results in three dtypes; and refused calls
 * (NULL arrays, a NULL buffer, a wrong send_count, overflowing displacements,
 * overlapping buffers) on every rank, after which the communicator still works.
 * Run on 4 ranks: braid run -n 4 ./vcollectives */
#include "check.h"

#define GAP (-1.0) /* what the gaps hold; no result is negative */
#define MAXW 16

static braid_comm *comm;
static int world;
static const char *what = "";
static int use_async; /* run the _async forms */

/* A heap copy of `a` (world entries), handed to an async call in place of `a`. */
static size_t *lent(const size_t *a) {
    size_t *p = malloc(sizeof(size_t) * MAXW);
    memcpy(p, a, sizeof(size_t) * (size_t)world);
    return p;
}

/* Scribble over and free an array the async call was given: it must have copied it. */
static void take_back(size_t *p) {
    for (int j = 0; j < world; j++) p[j] = (size_t)0x7777777;
    free(p);
}

/* Wait for an async call, then free its handle. */
static void finish(braid_work *w, const char *call) {
    CHECK(w != NULL, "%s %s: no work handle", what, call);
    if (!w) return;
    EXPECT_OK(braid_work_wait(w));
    EXPECT_OK(braid_work_free(w));
}

/* Elements rank j contributes to the gathers and reductions: 0, 3, 1, 4, 2, 0, ... */
static size_t cnt(int j) { return (size_t)(j * 3 % 5); }
/* Elements rank r sends rank j in the all-to-all: zeros for some pairs. */
static size_t a2a(int r, int j) { return (size_t)((r + 2 * j) % 4); }

static void *filled(braid_dtype d, size_t n) {
    void *p = malloc(n * dtype_size(d) + 1);
    for (size_t i = 0; i < n; i++) put(d, p, i, GAP);
    return p;
}

/* Displacements in reverse rank order, `gap` elements before each block; returns the extent. */
static size_t reversed(const size_t *counts, size_t *displs, size_t gap) {
    size_t at = 0;
    for (int j = world - 1; j >= 0; j--) {
        at += gap;
        displs[j] = at;
        at += counts[j];
    }
    return at;
}

/* Every element of `buf` (n elements) outside the blocks is still GAP. */
static void gaps_untouched(braid_dtype d, const void *buf, size_t n, const size_t *counts, const size_t *displs) {
    for (size_t k = 0; k < n; k++) {
        int inside = 0;
        for (int j = 0; j < world; j++) inside |= k >= displs[j] && k < displs[j] + counts[j];
        if (!inside) CHECK(get(d, buf, k) == GAP, "%s: gap element %zu = %g was written", what, k, get(d, buf, k));
    }
}

static double gv(int j, size_t i) { return (double)(j * 100 + (int)i); }

static void all_gather_v(braid_dtype d, int in_place) {
    size_t counts[MAXW], displs[MAXW];
    for (int j = 0; j < world; j++) counts[j] = cnt(j);
    size_t n = reversed(counts, displs, 2) + 3, mine = counts[g_rank];
    char *recv = filled(d, n);
    char *send = in_place ? recv : filled(d, mine);
    char *own = in_place ? recv + displs[g_rank] * dtype_size(d) : send;
    for (size_t i = 0; i < mine; i++) put(d, own, i, gv(g_rank, i));
    if (use_async) {
        braid_work *w = NULL;
        size_t *c = lent(counts), *p = lent(displs);
        EXPECT_OK(braid_all_gather_v_async(send, mine, recv, c, p, d, comm, &w));
        take_back(c);
        take_back(p);
        finish(w, "all_gather_v_async");
    } else {
        EXPECT_OK(braid_all_gather_v(send, mine, recv, counts, displs, d, comm));
    }
    for (int j = 0; j < world; j++)
        for (size_t i = 0; i < counts[j]; i++)
            CHECK(get(d, recv, displs[j] + i) == gv(j, i), "%s all_gather_v in_place=%d: rank %d's [%zu] = %g, expected %g",
                  what, in_place, j, i, get(d, recv, displs[j] + i), gv(j, i));
    gaps_untouched(d, recv, n, counts, displs);
    if (!in_place) free(send);
    free(recv);
}

static void reduce_scatter_v(braid_dtype d, int in_place) {
    size_t counts[MAXW], total = 0, off = 0;
    for (int j = 0; j < world; j++) {
        counts[j] = cnt(j);
        if (j < g_rank) off += counts[j];
        total += counts[j];
    }
    size_t mine = counts[g_rank];
    char *send = filled(d, total);
    for (size_t k = 0; k < total; k++) put(d, send, k, (double)(g_rank * 10 + (int)k));
    char *recv = in_place ? send : filled(d, mine + 1);
    if (use_async) {
        braid_work *w = NULL;
        size_t *c = lent(counts);
        EXPECT_OK(braid_reduce_scatter_v_async(send, recv, c, d, BRAID_SUM, comm, &w));
        take_back(c);
        finish(w, "reduce_scatter_v_async");
    } else {
        EXPECT_OK(braid_reduce_scatter_v(send, recv, counts, d, BRAID_SUM, comm));
    }
    for (size_t i = 0; i < mine; i++) {
        /* sum over ranks r of r * 10 + k, at k = off + i */
        double want = (double)(10 * world * (world - 1) / 2 + world * (int)(off + i));
        CHECK(get(d, recv, i) == want, "%s reduce_scatter_v in_place=%d [%zu] = %g, expected %g", what, in_place, i,
              get(d, recv, i), want);
    }
    if (!in_place) {
        CHECK(get(d, recv, mine) == GAP, "%s reduce_scatter_v wrote past recv_counts[rank]", what);
        for (size_t k = 0; k < total; k++)
            CHECK(get(d, send, k) == (double)(g_rank * 10 + (int)k), "%s reduce_scatter_v: send [%zu] changed", what, k);
        free(recv);
    }
    free(send);
}

static double av(int from, int to, size_t i) { return (double)(from * 1000 + to * 100 + (int)i); }

static void all_to_all_v(braid_dtype d) {
    size_t sc[MAXW], sd[MAXW], rc[MAXW], rd[MAXW], at = 2;
    for (int j = 0; j < world; j++) {
        sc[j] = a2a(g_rank, j);
        rc[j] = a2a(j, g_rank);
        rd[j] = at; /* rank order, 3 elements apart */
        at += rc[j] + 3;
    }
    size_t sn = reversed(sc, sd, 1), rn = at;
    char *send = filled(d, sn), *recv = filled(d, rn);
    for (int j = 0; j < world; j++)
        for (size_t i = 0; i < sc[j]; i++) put(d, send, sd[j] + i, av(g_rank, j, i));
    if (use_async) {
        braid_work *w = NULL;
        size_t *a = lent(sc), *b = lent(sd), *c = lent(rc), *e = lent(rd);
        EXPECT_OK(braid_all_to_all_v_async(send, a, b, recv, c, e, d, comm, &w));
        take_back(a);
        take_back(b);
        take_back(c);
        take_back(e);
        finish(w, "all_to_all_v_async");
    } else {
        EXPECT_OK(braid_all_to_all_v(send, sc, sd, recv, rc, rd, d, comm));
    }
    for (int j = 0; j < world; j++)
        for (size_t i = 0; i < rc[j]; i++)
            CHECK(get(d, recv, rd[j] + i) == av(j, g_rank, i), "%s all_to_all_v: from rank %d [%zu] = %g, expected %g",
                  what, j, i, get(d, recv, rd[j] + i), av(j, g_rank, i));
    gaps_untouched(d, recv, rn, rc, rd);
    free(send);
    free(recv);
}

/* Calls every rank makes wrongly in the same way: refused before any message. */
static void refused(void) {
    size_t counts[MAXW], displs[MAXW], huge[MAXW];
    int32_t buf[64] = {0}, other[64] = {0};
    for (int j = 0; j < world; j++) {
        counts[j] = 1;
        displs[j] = (size_t)j;
        huge[j] = (size_t)-1 - 1;
    }
    EXPECT_ERR(braid_all_gather_v(buf, 1, other, NULL, displs, BRAID_I32, comm), BRAID_ERR_INVALID_ARGUMENT,
               "recv_counts is NULL");
    EXPECT_ERR(braid_all_gather_v(buf, 1, other, counts, NULL, BRAID_I32, comm), BRAID_ERR_INVALID_ARGUMENT,
               "displs is NULL");
    EXPECT_ERR(braid_reduce_scatter_v(buf, other, NULL, BRAID_I32, BRAID_SUM, comm), BRAID_ERR_INVALID_ARGUMENT,
               "recv_counts is NULL");
    EXPECT_ERR(braid_all_to_all_v(buf, counts, NULL, other, counts, displs, BRAID_I32, comm),
               BRAID_ERR_INVALID_ARGUMENT, "send_displs is NULL");
    EXPECT_ERR(braid_all_to_all_v(buf, counts, displs, other, counts, NULL, BRAID_I32, comm),
               BRAID_ERR_INVALID_ARGUMENT, "recv_displs is NULL");
    EXPECT_ERR(braid_all_gather_v(buf, 2, other, counts, displs, BRAID_I32, comm), BRAID_ERR_INVALID_ARGUMENT,
               "send_count 2 differs from recv_counts");
    EXPECT_ERR(braid_all_gather_v(buf, 1, NULL, counts, displs, BRAID_I32, comm), BRAID_ERR_INVALID_ARGUMENT,
               "recv is NULL");
    EXPECT_ERR(braid_all_gather_v(buf, 1, other, counts, huge, BRAID_I32, comm), BRAID_ERR_INVALID_ARGUMENT,
               "overflow");
    EXPECT_ERR(braid_all_to_all_v(buf, counts, displs, other, counts, huge, BRAID_I32, comm),
               BRAID_ERR_INVALID_ARGUMENT, "overflow");
    EXPECT_ERR(braid_all_to_all_v(buf, counts, displs, buf + 1, counts, displs, BRAID_I32, comm),
               BRAID_ERR_INVALID_ARGUMENT, "overlap");
    EXPECT_ERR(braid_reduce_scatter_v(buf, other, counts, BRAID_I32, 99, comm), BRAID_ERR_INVALID_ARGUMENT,
               "braid_reduce_op");
    /* The async forms refuse as the blocking ones do, and leave no handle. */
    braid_work *w = (braid_work *)&other;
    EXPECT_ERR(braid_all_to_all_v_async(buf, counts, displs, buf + 1, counts, displs, BRAID_I32, comm, &w),
               BRAID_ERR_INVALID_ARGUMENT, "overlap");
    CHECK(w == NULL, "a refused async call left a work handle");
}

int main(void) {
    EXPECT_OK(braid_comm_init_from_env(&comm));
    if (!comm) return report("vcollectives");
    EXPECT_OK(braid_comm_rank(comm, &g_rank));
    EXPECT_OK(braid_comm_size(comm, &world));
    CHECK(world <= MAXW, "at most %d ranks", MAXW);
    const braid_dtype dtypes[3] = {BRAID_I32, BRAID_I64, BRAID_F64};
    const char *names[2][3] = {{"i32", "i64", "f64"}, {"async i32", "async i64", "async f64"}};
    for (use_async = 0; use_async < 2; use_async++) {
        for (int di = 0; di < 3 && world <= MAXW; di++) {
            what = names[use_async][di];
            for (int in_place = 0; in_place < 2; in_place++) {
                all_gather_v(dtypes[di], in_place);
                reduce_scatter_v(dtypes[di], in_place);
            }
            all_to_all_v(dtypes[di]);
        }
    }
    use_async = 0;
    refused();
    what = "after the refused calls";
    all_to_all_v(BRAID_I32);
    EXPECT_OK(braid_comm_destroy(comm));
    return report("vcollectives");
}
