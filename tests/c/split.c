/* braid_comm_split: two halves of a 4-rank job run collectives at the same time,
 * each checking its own results; then a split where one rank joins no group;
 * then braid_comm_dup, braid_comm_new_group and braid_work_wait_timeout.
 * Run on 4 ranks: braid run -n 4 ./split */
#include "check.h"

int main(void) {
    braid_comm *world_comm = NULL, *half = NULL, *three = NULL;
    int world = 0, r = -1, n = -1;
    EXPECT_OK(braid_comm_init_from_env(&world_comm));
    if (!world_comm) return report("split");
    EXPECT_OK(braid_comm_rank(world_comm, &g_rank));
    EXPECT_OK(braid_comm_size(world_comm, &world));
    CHECK(world == 4, "run on 4 ranks, not %d", world);

    /* Halves {0,1} and {2,3}; keys reverse the order inside each (negative keys work). */
    int color = g_rank / 2, first = 2 * color;
    EXPECT_OK(braid_comm_split(world_comm, color, -g_rank, &half));
    if (!half) return report("split");
    EXPECT_OK(braid_comm_rank(half, &r));
    EXPECT_OK(braid_comm_size(half, &n));
    CHECK(n == 2 && r == 1 - g_rank % 2, "half %d: rank %d of %d, expected %d of 2", color, r, n, 1 - g_rank % 2);

    /* Both halves at once: many calls each, results that differ between halves. */
    for (int i = 0; i < 200; i++) {
        int64_t v[3] = {g_rank + i, g_rank * i, 1}, got[6];
        EXPECT_OK(braid_all_reduce(v, v, 3, BRAID_I64, BRAID_SUM, half));
        CHECK(v[0] == 2 * first + 1 + 2 * i && v[1] == (2 * first + 1) * i && v[2] == 2,
              "half %d all_reduce %d: %lld %lld %lld", color, i, (long long)v[0], (long long)v[1], (long long)v[2]);
        int64_t mine[3] = {g_rank, i, color};
        braid_work *w = NULL;
        EXPECT_OK(braid_all_gather_async(mine, got, 3, BRAID_I64, half, &w));
        EXPECT_OK(braid_work_wait(w));
        EXPECT_OK(braid_work_free(w));
        /* half rank 0 is the higher parent rank (keys reversed) */
        CHECK(got[0] == first + 1 && got[3] == first && got[1] == i && got[4] == i && got[2] == color &&
                  got[5] == color,
              "half %d all_gather %d: %lld %lld", color, i, (long long)got[0], (long long)got[3]);
        float b[4] = {0};
        if (r == 1)
            for (int j = 0; j < 4; j++) b[j] = (float)(100 * color + i + j);
        EXPECT_OK(braid_broadcast(b, b, 4, BRAID_F32, 1, half));
        for (int j = 0; j < 4; j++)
            CHECK(b[j] == (float)(100 * color + i + j), "half %d broadcast %d [%d] = %g", color, i, j, b[j]);
    }

    /* The parent still works alongside its children. */
    int32_t s = g_rank;
    EXPECT_OK(braid_all_reduce(&s, &s, 1, BRAID_I32, BRAID_SUM, world_comm));
    CHECK(s == 6, "world all_reduce after split: %d", s);

    /* color < 0: rank 3 joins no group and gets NULL; the others form a 3-rank one. */
    EXPECT_OK(braid_comm_split(world_comm, g_rank == 3 ? -1 : 7, 0, &three));
    if (g_rank == 3) {
        CHECK(three == NULL, "color -1 gave a communicator");
    } else if (three) {
        EXPECT_OK(braid_comm_size(three, &n));
        CHECK(n == 3, "3-rank split has size %d", n);
        int32_t t = g_rank + 1;
        EXPECT_OK(braid_all_reduce(&t, &t, 1, BRAID_I32, BRAID_PROD, three));
        CHECK(t == 6, "3-rank product %d", t);
        EXPECT_OK(braid_comm_destroy(three));
    } else {
        CHECK(0, "color 7 gave no communicator");
    }

    /* dup: the same ranks again; its async all-reduce is in flight across a parent
     * call, polled with braid_work_wait_timeout; exact results on both. */
    braid_comm *twin = NULL;
    EXPECT_OK(braid_comm_dup(world_comm, &twin));
    if (twin) {
        EXPECT_OK(braid_comm_rank(twin, &r));
        EXPECT_OK(braid_comm_size(twin, &n));
        CHECK(r == g_rank && n == 4, "dup: rank %d of %d", r, n);
        for (int i = 0; i < 20; i++) {
            int32_t a = g_rank + i, b = g_rank * i;
            braid_work *w = NULL;
            EXPECT_OK(braid_all_reduce_async(&a, &a, 1, BRAID_I32, BRAID_SUM, twin, &w));
            EXPECT_OK(braid_all_reduce(&b, &b, 1, BRAID_I32, BRAID_SUM, world_comm));
            braid_result rc;
            while ((rc = braid_work_wait_timeout(w, 1)) == BRAID_IN_PROGRESS) {
            }
            CHECK(rc == BRAID_SUCCESS, "dup all_reduce %d: %d %s", i, (int)rc, braid_last_error());
            EXPECT_OK(braid_work_free(w));
            CHECK(a == 6 + 4 * i && b == 6 * i, "dup/parent all_reduce %d: %d %d", i, a, b);
        }
        EXPECT_OK(braid_comm_destroy(twin));
    }

    /* new_group: {3,1} and {2,0} at once, each formed by its members alone and
     * ranked in list order. */
    int pair[2] = {g_rank % 2 ? 3 : 2, g_rank % 2 ? 1 : 0};
    braid_comm *group = NULL;
    EXPECT_OK(braid_comm_new_group(world_comm, pair, 2, &group));
    if (group) {
        EXPECT_OK(braid_comm_rank(group, &r));
        CHECK(r == (g_rank == pair[0] ? 0 : 1), "new_group {%d,%d}: rank %d", pair[0], pair[1], r);
        int32_t mine = g_rank, both[2] = {-1, -1};
        EXPECT_OK(braid_all_gather(&mine, both, 1, BRAID_I32, group));
        CHECK(both[0] == pair[0] && both[1] == pair[1], "new_group all_gather: %d %d", both[0], both[1]);
        EXPECT_OK(braid_comm_destroy(group));
    }
    int twice[2] = {g_rank, g_rank}, outside[2] = {g_rank, 4}, negative[1] = {-1};
    group = (braid_comm *)&group;
    EXPECT_ERR(braid_comm_new_group(world_comm, twice, 2, &group), BRAID_ERR_INVALID_ARGUMENT, "twice");
    CHECK(group == NULL, "a refused new_group left a handle");
    EXPECT_ERR(braid_comm_new_group(world_comm, outside, 2, &group), BRAID_ERR_INVALID_ARGUMENT, "rank 4");
    EXPECT_ERR(braid_comm_new_group(world_comm, negative, 1, &group), BRAID_ERR_INVALID_ARGUMENT, "not a rank");
    EXPECT_ERR(braid_comm_new_group(world_comm, NULL, 1, &group), BRAID_ERR_INVALID_ARGUMENT, "NULL");
    braid_work *done = NULL;
    EXPECT_OK(braid_barrier_async(world_comm, &done));
    EXPECT_ERR(braid_work_wait_timeout(done, -1), BRAID_ERR_INVALID_ARGUMENT, "timeout_ms is -1");
    EXPECT_OK(braid_work_wait_timeout(done, 30000));
    EXPECT_OK(braid_work_wait_timeout(done, 0)); /* the result again, as braid_work_wait gives it */
    EXPECT_OK(braid_work_free(done));

    EXPECT_OK(braid_comm_destroy(half));
    EXPECT_OK(braid_comm_destroy(world_comm));
    return report("split");
}
