/* braid_group_start/braid_group_end around sends and receives, and tags:
 * a ring of large messages posted send-first in one group, an exchange with every
 * rank (several tagged messages to each) in a nested group, groups refused before
 * anything runs, a tag mismatch failing on both ranks of a pair, and receives
 * from any source (braid_recv_any).
 * Run on 3 or more ranks: braid run -n 4 ./p2p_group */
#include "check.h"

#define RING (1 << 22) /* int32 elements: 16 MiB, far more than any link buffers */
#define SMALL 3

static int32_t value(int from, int to, size_t i) { return (int32_t)(from * 1000003 + to * 10007 + (int32_t)i); }

int main(void) {
    braid_comm *comm = NULL, *pair = NULL;
    int world = 0;
    EXPECT_OK(braid_comm_init_from_env(&comm));
    if (!comm) return report("p2p_group");
    EXPECT_OK(braid_comm_rank(comm, &g_rank));
    EXPECT_OK(braid_comm_size(comm, &world));
    CHECK(world >= 3, "run on 3 or more ranks, not %d", world);
    int right = (g_rank + 1) % world, left = (g_rank + world - 1) % world;

    /* The ring: each rank sends to its right before it receives from its left; one
     * at a time, every rank would wait in its send. */
    int32_t *out = malloc(RING * sizeof *out), *in = malloc(RING * sizeof *in);
    for (size_t i = 0; i < RING; i++) out[i] = value(g_rank, right, i), in[i] = -1;
    EXPECT_OK(braid_group_start());
    EXPECT_OK(braid_send(out, RING, BRAID_I32, right, comm));
    EXPECT_OK(braid_recv(in, RING, BRAID_I32, left, comm));
    EXPECT_OK(braid_group_end());
    size_t bad = 0;
    for (size_t i = 0; i < RING; i++) bad += in[i] != value(left, g_rank, i);
    CHECK(bad == 0, "ring: %zu of %d elements from rank %d are wrong", bad, RING, left);

    /* Every rank with every other, nested groups, SMALL tagged messages per peer
     * (kept in order), plus one empty message each way. */
    int64_t *sent = calloc((size_t)world * SMALL, sizeof *sent), *got = calloc((size_t)world * SMALL, sizeof *got);
    EXPECT_OK(braid_group_start());
    for (int p = 0; p < world; p++) {
        if (p == g_rank) continue;
        EXPECT_OK(braid_group_start());
        for (int k = 0; k < SMALL; k++) {
            sent[p * SMALL + k] = 100 * g_rank + 10 * p + k;
            EXPECT_OK(braid_recv_tagged(&got[p * SMALL + k], 1, BRAID_I64, p, (uint32_t)k + 40, comm));
            EXPECT_OK(braid_send_tagged(&sent[p * SMALL + k], 1, BRAID_I64, p, (uint32_t)k + 40, comm));
        }
        EXPECT_OK(braid_send(NULL, 0, BRAID_F32, p, comm));
        EXPECT_OK(braid_recv(NULL, 0, BRAID_F32, p, comm));
        EXPECT_OK(braid_group_end());
    }
    EXPECT_OK(braid_group_end());
    for (int p = 0; p < world; p++)
        for (int k = 0; p != g_rank && k < SMALL; k++)
            CHECK(got[p * SMALL + k] == 100 * p + 10 * g_rank + k, "message %d from rank %d: %lld", k, p,
                  (long long)got[p * SMALL + k]);

    /* Refused before anything runs: a collective inside a group, a message to this
     * rank, a receive overlapping another message, an end without a start. Each
     * group also holds a send to the right that must not leave. */
    int32_t stray = -7, two[2] = {0, 0};
    EXPECT_OK(braid_group_start());
    EXPECT_OK(braid_send(&stray, 1, BRAID_I32, right, comm));
    EXPECT_ERR(braid_barrier(comm), BRAID_ERR_INVALID_ARGUMENT, "only braid_send, braid_recv");
    EXPECT_ERR(braid_group_end(), BRAID_ERR_INVALID_ARGUMENT, "nothing of the group ran");
    EXPECT_OK(braid_group_start());
    EXPECT_OK(braid_send(&stray, 1, BRAID_I32, right, comm));
    EXPECT_OK(braid_recv(two, 1, BRAID_I32, g_rank, comm));
    EXPECT_ERR(braid_group_end(), BRAID_ERR_INVALID_ARGUMENT, "to itself");
    EXPECT_OK(braid_group_start());
    EXPECT_OK(braid_send(&stray, 1, BRAID_I32, right, comm));
    EXPECT_OK(braid_recv(two, 2, BRAID_I32, left, comm));
    EXPECT_OK(braid_recv(&two[1], 1, BRAID_I32, right, comm));
    EXPECT_ERR(braid_group_end(), BRAID_ERR_INVALID_ARGUMENT, "overlaps");
    EXPECT_ERR(braid_group_end(), BRAID_ERR_INVALID_ARGUMENT, "no group is open");
    /* None of those sends left: the next message from the left is this one. */
    int32_t mine = 1000 + g_rank, from_left = 0;
    EXPECT_OK(braid_group_start());
    EXPECT_OK(braid_recv(&from_left, 1, BRAID_I32, left, comm));
    EXPECT_OK(braid_send(&mine, 1, BRAID_I32, right, comm));
    EXPECT_OK(braid_group_end());
    CHECK(from_left == 1000 + left, "after the refused groups rank %d sent %d", left, from_left);

    /* A tag mismatch, on a communicator of ranks 0 and 1: the receiver fails in the
     * call, the sender in its send or its next call, both naming both tags. */
    EXPECT_OK(braid_comm_split(comm, g_rank < 2 ? 0 : -1, 0, &pair));
    if (pair && g_rank == 0) {
        braid_result rc = braid_send_tagged(&mine, 1, BRAID_I32, 1, 3, pair);
        if (rc == BRAID_SUCCESS) rc = braid_barrier(pair);
        const char *msg = braid_last_error();
        CHECK(rc != BRAID_SUCCESS && strstr(msg, "tag=3") && strstr(msg, "tag=5"), "sender: %d %s", (int)rc, msg);
    } else if (pair) {
        EXPECT_ERR(braid_recv_tagged(&from_left, 1, BRAID_I32, 0, 5, pair), BRAID_ERR_MISMATCH, "tag=3");
        CHECK(strstr(braid_last_error(), "tag=5") != NULL, "receiver: %s", braid_last_error());
    }
    if (pair) braid_comm_destroy(pair);

    /* Receive from any source: every other rank sends rank 0 a message tagged 21,
     * then one tagged 22; rank 0 takes the first ones with braid_recv_any (each
     * sender once, with its data), then the others by name, which pair only if
     * braid_recv_any kept each link's order. */
    int64_t any_msg[2] = {100 + g_rank, g_rank}, any_in[2] = {0, 0}, next = 0;
    if (g_rank != 0) {
        EXPECT_OK(braid_send_tagged(any_msg, 2, BRAID_I64, 0, 21, comm));
        any_msg[0] += 1000;
        EXPECT_OK(braid_send_tagged(any_msg, 1, BRAID_I64, 0, 22, comm));
    } else {
        int source = -1, seen[64] = {0};
        EXPECT_ERR(braid_recv_any(comm, any_in, 2, BRAID_I64, 21, NULL), BRAID_ERR_INVALID_ARGUMENT, "source is NULL");
        EXPECT_OK(braid_group_start());
        EXPECT_ERR(braid_recv_any(comm, any_in, 2, BRAID_I64, 21, &source), BRAID_ERR_INVALID_ARGUMENT,
                   "only braid_send");
        EXPECT_ERR(braid_group_end(), BRAID_ERR_INVALID_ARGUMENT, "nothing of the group ran");
        for (int k = 1; k < world && world <= 64; k++) {
            source = -1;
            EXPECT_OK(braid_recv_any(comm, any_in, 2, BRAID_I64, 21, &source));
            CHECK(source > 0 && source < world, "braid_recv_any gave source %d", source);
            if (source <= 0 || source >= world) continue;
            seen[source]++;
            CHECK(any_in[0] == 100 + source && any_in[1] == source, "from rank %d: %lld %lld", source,
                  (long long)any_in[0], (long long)any_in[1]);
        }
        for (int p = 1; p < world && world <= 64; p++) {
            CHECK(seen[p] == 1, "braid_recv_any took rank %d %d times", p, seen[p]);
            EXPECT_OK(braid_recv_tagged(&next, 1, BRAID_I64, p, 22, comm));
            CHECK(next == 1100 + p, "tagged receive from rank %d after braid_recv_any: %lld", p, (long long)next);
        }
    }

    EXPECT_OK(braid_barrier(comm));
    EXPECT_OK(braid_comm_destroy(comm));
    free(out), free(in), free(sent), free(got);
    return report("p2p_group");
}
