/* braid_comm_split: two halves of a 4-rank job run collectives at the same time,
 * each checking its own results; then a split where one rank joins no group.
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
    EXPECT_OK(braid_comm_destroy(half));
    EXPECT_OK(braid_comm_destroy(world_comm));
    return report("split");
}
