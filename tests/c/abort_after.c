/* A rank that aborts as soon as its own call has returned must not fail the
 * peers' same call, which can still complete (issue 31, defect 1). For every
 * collective and send/recv: a fresh communicator (split off the world), the call
 * with exact results, then abort and destroy on every rank at once. Last, the same
 * with a barrier on the world communicator. Run on 3 ranks:
 * braid run -n 3 ./abort_after */
#include "check.h"

#define N 1031 /* elements per block: odd, and more than one small frame's worth */

enum op { ALL_REDUCE, BROADCAST, ALL_GATHER, REDUCE_SCATTER, REDUCE, BARRIER, ALL_TO_ALL, SEND_RECV, OPS };
static const char *const NAMES[OPS] = {"all_reduce", "broadcast", "all_gather", "reduce_scatter",
                                       "reduce",     "barrier",   "all_to_all", "send_recv"};

/* What rank r contributes to block b at element i. */
static int32_t value(int r, int b, size_t i) { return (int32_t)(r * 1000000 + b * 10000 + (int)i); }

static int32_t summed(int world, int b, size_t i) {
    int32_t s = 0;
    for (int r = 0; r < world; r++) s += value(r, b, i);
    return s;
}

static void run(enum op op, braid_comm *c, int rank, int world) {
    int root = world - 1, to = (rank + 1) % world, from = (rank + world - 1) % world;
    int32_t *in = malloc(sizeof(int32_t) * N * world), *out = malloc(sizeof(int32_t) * N * world);
    for (int b = 0; b < world; b++)
        for (size_t i = 0; i < N; i++) in[b * N + i] = value(rank, b, i);
    memset(out, 0xff, sizeof(int32_t) * N * world);
    const char *name = NAMES[op];
    switch (op) {
    case ALL_REDUCE:
        EXPECT_OK(braid_all_reduce(in, out, N, BRAID_I32, BRAID_SUM, c));
        for (size_t i = 0; i < N; i++) CHECK(out[i] == summed(world, 0, i), "%s [%zu] = %d", name, i, out[i]);
        break;
    case BROADCAST:
        EXPECT_OK(braid_broadcast(in, out, N, BRAID_I32, root, c));
        for (size_t i = 0; i < N; i++) CHECK(out[i] == value(root, 0, i), "%s [%zu] = %d", name, i, out[i]);
        break;
    case ALL_GATHER:
        EXPECT_OK(braid_all_gather(in, out, N, BRAID_I32, c));
        for (size_t j = 0; j < N * (size_t)world; j++)
            CHECK(out[j] == value((int)(j / N), 0, j % N), "%s [%zu] = %d", name, j, out[j]);
        break;
    case REDUCE_SCATTER:
        EXPECT_OK(braid_reduce_scatter(in, out, N, BRAID_I32, BRAID_SUM, c));
        for (size_t i = 0; i < N; i++) CHECK(out[i] == summed(world, rank, i), "%s [%zu] = %d", name, i, out[i]);
        break;
    case REDUCE:
        EXPECT_OK(braid_reduce(in, out, N, BRAID_I32, BRAID_SUM, root, c));
        for (size_t i = 0; rank == root && i < N; i++)
            CHECK(out[i] == summed(world, 0, i), "%s [%zu] = %d", name, i, out[i]);
        break;
    case BARRIER:
        EXPECT_OK(braid_barrier(c));
        break;
    case ALL_TO_ALL:
        EXPECT_OK(braid_all_to_all(in, out, N, BRAID_I32, c));
        for (size_t j = 0; j < N * (size_t)world; j++)
            CHECK(out[j] == value((int)(j / N), rank, j % N), "%s [%zu] = %d", name, j, out[j]);
        break;
    case SEND_RECV:
        /* A ring: even ranks send first, odd ranks receive first. */
        if (rank % 2 == 0) {
            EXPECT_OK(braid_send(in + to * N, N, BRAID_I32, to, c));
            EXPECT_OK(braid_recv(out, N, BRAID_I32, from, c));
        } else {
            EXPECT_OK(braid_recv(out, N, BRAID_I32, from, c));
            EXPECT_OK(braid_send(in + to * N, N, BRAID_I32, to, c));
        }
        for (size_t i = 0; i < N; i++) CHECK(out[i] == value(from, rank, i), "%s [%zu] = %d", name, i, out[i]);
        break;
    case OPS:
        break;
    }
    free(in);
    free(out);
}

int main(void) {
    braid_comm *world_comm = NULL;
    int world = 0;
    EXPECT_OK(braid_comm_init_from_env(&world_comm));
    if (!world_comm) return report("abort_after");
    EXPECT_OK(braid_comm_rank(world_comm, &g_rank));
    EXPECT_OK(braid_comm_size(world_comm, &world));
    for (int op = 0; op < OPS; op++) {
        braid_comm *c = NULL;
        EXPECT_OK(braid_comm_split(world_comm, 0, g_rank, &c));
        if (!c) continue;
        run((enum op)op, c, g_rank, world);
        EXPECT_OK(braid_comm_abort(c));
        EXPECT_OK(braid_comm_destroy(c));
    }
    /* The shape a new user's program had: barrier, abort, destroy. */
    EXPECT_OK(braid_barrier(world_comm));
    EXPECT_OK(braid_comm_abort(world_comm));
    EXPECT_OK(braid_comm_destroy(world_comm));
    return report("abort_after");
}
