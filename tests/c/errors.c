/* Bad calls from C return the right code with a readable message, and none
 * crashes: NULL pointers, unknown enum values, roots and peers out of range,
 * counts that overflow, overlapping buffers, calls on an aborted communicator,
 * mismatched calls. Run on 3 ranks: braid run -n 3 ./errors */
#include <stdint.h>

#include "check.h"

int main(void) {
    braid_comm *comm = NULL, *sub = NULL;
    braid_work *w = (braid_work *)&w; /* not NULL: checks that failures clear it */
    int world = 0, x = 0;
    float buf[8] = {1, 2, 3, 4, 5, 6, 7, 8}, out[24];
    const char *url = getenv("BRAID_STORE");

    /* Communicator creation and queries. */
    EXPECT_ERR(braid_comm_init_from_env(NULL), BRAID_ERR_INVALID_ARGUMENT, "out is NULL");
    EXPECT_ERR(braid_comm_init(-1, 3, url, &comm), BRAID_ERR_INVALID_ARGUMENT, "rank -1 of world size 3");
    CHECK(comm == NULL, "failed init left a communicator");
    EXPECT_ERR(braid_comm_init(3, 3, url, &comm), BRAID_ERR_INVALID_ARGUMENT, "0 <= rank < world_size");
    EXPECT_ERR(braid_comm_init(0, 0, url, &comm), BRAID_ERR_INVALID_ARGUMENT, "world size 0");
    EXPECT_ERR(braid_comm_init(0, 3, NULL, &comm), BRAID_ERR_INVALID_ARGUMENT, "store_url is NULL");
    EXPECT_ERR(braid_comm_init(0, 3, "bogus://nowhere", &comm), BRAID_ERR_INVALID_ARGUMENT, "bogus");
    EXPECT_OK(braid_comm_init_from_env(&comm));
    if (!comm) return report("errors");
    EXPECT_OK(braid_comm_rank(comm, &g_rank));
    EXPECT_OK(braid_comm_size(comm, &world));
    EXPECT_ERR(braid_comm_rank(NULL, &x), BRAID_ERR_INVALID_ARGUMENT, "communicator is NULL");
    EXPECT_ERR(braid_comm_rank(comm, NULL), BRAID_ERR_INVALID_ARGUMENT, "rank is NULL");
    EXPECT_ERR(braid_comm_size(comm, NULL), BRAID_ERR_INVALID_ARGUMENT, "size is NULL");
    EXPECT_ERR(braid_comm_split(NULL, 0, 0, &sub), BRAID_ERR_INVALID_ARGUMENT, "communicator is NULL");
    EXPECT_ERR(braid_comm_destroy(NULL), BRAID_ERR_INVALID_ARGUMENT, "communicator is NULL");
    EXPECT_ERR(braid_comm_abort(NULL), BRAID_ERR_INVALID_ARGUMENT, "communicator is NULL");

    /* NULL buffers and handles. */
    EXPECT_ERR(braid_all_reduce(NULL, out, 8, BRAID_F32, BRAID_SUM, comm), BRAID_ERR_INVALID_ARGUMENT,
               "send buffer is NULL");
    EXPECT_ERR(braid_all_reduce(buf, NULL, 8, BRAID_F32, BRAID_SUM, comm), BRAID_ERR_INVALID_ARGUMENT,
               "receive buffer is NULL");
    EXPECT_ERR(braid_all_reduce(buf, out, 8, BRAID_F32, BRAID_SUM, NULL), BRAID_ERR_INVALID_ARGUMENT,
               "communicator is NULL");
    EXPECT_ERR(braid_all_gather(buf, NULL, 8, BRAID_F32, comm), BRAID_ERR_INVALID_ARGUMENT, "NULL");
    EXPECT_ERR(braid_send(NULL, 8, BRAID_F32, (g_rank + 1) % world, comm), BRAID_ERR_INVALID_ARGUMENT,
               "buffer is NULL");
    EXPECT_ERR(braid_all_reduce_async(buf, out, 8, BRAID_F32, BRAID_SUM, comm, NULL), BRAID_ERR_INVALID_ARGUMENT,
               "work is NULL");
    EXPECT_ERR(braid_all_reduce_async(NULL, out, 8, BRAID_F32, BRAID_SUM, comm, &w), BRAID_ERR_INVALID_ARGUMENT,
               "send buffer is NULL");
    CHECK(w == NULL, "a refused async call left a work handle");
    EXPECT_ERR(braid_barrier(NULL), BRAID_ERR_INVALID_ARGUMENT, "communicator is NULL");
    EXPECT_ERR(braid_work_wait(NULL), BRAID_ERR_INVALID_ARGUMENT, "work handle is NULL");
    EXPECT_ERR(braid_work_test(NULL), BRAID_ERR_INVALID_ARGUMENT, "work handle is NULL");
    EXPECT_ERR(braid_work_free(NULL), BRAID_ERR_INVALID_ARGUMENT, "work handle is NULL");

    /* Unknown enum values (C may pass any int). */
    EXPECT_ERR(braid_all_reduce(buf, out, 8, (braid_dtype)42, BRAID_SUM, comm), BRAID_ERR_INVALID_ARGUMENT,
               "unknown braid_dtype value 42");
    EXPECT_ERR(braid_broadcast(buf, buf, 8, (braid_dtype)-1, 0, comm), BRAID_ERR_INVALID_ARGUMENT,
               "unknown braid_dtype value -1");
    EXPECT_ERR(braid_all_reduce(buf, out, 8, BRAID_F32, (braid_reduce_op)99, comm), BRAID_ERR_INVALID_ARGUMENT,
               "unknown braid_reduce_op value 99");
    EXPECT_ERR(braid_reduce_scatter_async(buf, out, 1, BRAID_F32, (braid_reduce_op)5, comm, &w),
               BRAID_ERR_INVALID_ARGUMENT, "unknown braid_reduce_op value 5");

    /* Roots and peers out of range. */
    EXPECT_ERR(braid_broadcast(buf, buf, 8, BRAID_F32, world, comm), BRAID_ERR_INVALID_ARGUMENT,
               "root 3 is not a rank of this 3-rank communicator");
    EXPECT_ERR(braid_reduce(buf, out, 8, BRAID_F32, BRAID_SUM, -1, comm), BRAID_ERR_INVALID_ARGUMENT, "root -1");
    EXPECT_ERR(braid_send(buf, 8, BRAID_F32, 7, comm), BRAID_ERR_INVALID_ARGUMENT, "peer 7");
    EXPECT_ERR(braid_recv_async(out, 8, BRAID_F32, -2, comm, &w), BRAID_ERR_INVALID_ARGUMENT, "peer -2");
    EXPECT_ERR(braid_send(buf, 8, BRAID_F32, g_rank, comm), BRAID_ERR_INVALID_ARGUMENT, "not another rank");

    /* Counts whose byte sizes overflow. */
    EXPECT_ERR(braid_all_reduce(buf, out, SIZE_MAX / 2, BRAID_F32, BRAID_SUM, comm), BRAID_ERR_INVALID_ARGUMENT,
               "more bytes than this machine can address");
    EXPECT_ERR(braid_all_gather(buf, out, SIZE_MAX / 3, BRAID_U8, comm), BRAID_ERR_INVALID_ARGUMENT,
               "more bytes than this machine can address");
    EXPECT_ERR(braid_recv(out, SIZE_MAX / 4, BRAID_F64, (g_rank + 1) % world, comm), BRAID_ERR_INVALID_ARGUMENT,
               "more bytes than this machine can address");

    /* Buffers that overlap without being the same. */
    EXPECT_ERR(braid_all_reduce(buf, buf + 1, 4, BRAID_F32, BRAID_SUM, comm), BRAID_ERR_INVALID_ARGUMENT, "overlap");
    EXPECT_ERR(braid_all_gather(out + 1, out, 2, BRAID_F32, comm), BRAID_ERR_INVALID_ARGUMENT, "overlap");

    /* After all those refusals the communicator still works (nothing was issued). */
    float one = 1;
    EXPECT_OK(braid_all_reduce(&one, &one, 1, BRAID_F32, BRAID_SUM, comm));
    CHECK(one == (float)world, "all_reduce after refusals: %g", one);
    CHECK(braid_last_error()[0] == '\0', "a success left \"%s\"", braid_last_error());

    /* Mismatched calls: rank 0 reduces f32, the others i32; every rank is told. */
    EXPECT_OK(braid_comm_split(comm, 0, 0, &sub));
    if (sub) {
        braid_result rc = braid_all_reduce(buf, buf, 4, g_rank == 0 ? BRAID_F32 : BRAID_I32, BRAID_SUM, sub);
        const char *msg = braid_last_error();
        CHECK(rc == BRAID_ERR_MISMATCH || rc == BRAID_ERR_REMOTE, "mismatch returned %d: %s", (int)rc, msg);
        CHECK(strstr(msg, "f32") != NULL || strstr(msg, "rank") != NULL, "mismatch message: %s", msg);
        EXPECT_OK(braid_comm_destroy(sub));
        sub = NULL;
    }

    /* A communicator aborted on every rank: calls return BRAID_ERR_ABORTED. */
    EXPECT_OK(braid_comm_split(comm, 0, 0, &sub));
    if (sub) {
        EXPECT_OK(braid_comm_abort(sub));
        EXPECT_ERR(braid_all_reduce(buf, out, 8, BRAID_F32, BRAID_SUM, sub), BRAID_ERR_ABORTED, "aborted");
        EXPECT_ERR(braid_barrier_async(sub, &w), BRAID_ERR_ABORTED, "aborted");
        CHECK(w == NULL, "an aborted communicator gave a work handle");
        braid_comm *child = (braid_comm *)&w;
        EXPECT_ERR(braid_comm_split(sub, 0, 0, &child), BRAID_ERR_ABORTED, "aborted");
        CHECK(child == NULL, "a split of an aborted communicator left a handle");
        /* Again: harmless, and abort keeps the message of the failure that led to it. */
        CHECK(braid_comm_abort(sub) == BRAID_SUCCESS, "a second abort failed: %s", braid_last_error());
        CHECK(strstr(braid_last_error(), "aborted") != NULL, "abort cleared the split's message: \"%s\"",
              braid_last_error());
        EXPECT_OK(braid_comm_destroy(sub));
    }

    EXPECT_OK(braid_barrier(comm));
    EXPECT_OK(braid_comm_destroy(comm));
    return report("errors");
}
