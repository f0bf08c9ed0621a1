/* braid_comm_agree and braid_comm_shrink: rank 3 of 4 vanishes after the first
 * all-reduce (_exit: no goodbye, as a killed process); the other three see the
 * next call fail, agree on ranks {0,1,2} and one completed call, shrink, and
 * sum exactly on the 3-rank communicator. Run on 4 ranks: braid run -n 4 ./shrink */
#include <unistd.h>

#include "check.h"

int main(void) {
    braid_comm *comm = NULL, *small = NULL;
    int world = 0, r = -1, n = -1;
    EXPECT_OK(braid_comm_init_from_env(&comm));
    if (!comm) return report("shrink");
    EXPECT_OK(braid_comm_rank(comm, &g_rank));
    EXPECT_OK(braid_comm_size(comm, &world));
    CHECK(world == 4, "run on 4 ranks, not %d", world);
    int64_t v = g_rank + 1;
    EXPECT_OK(braid_all_reduce(&v, &v, 1, BRAID_I64, BRAID_SUM, comm));
    CHECK(v == 10, "all-reduce of 4: %lld", (long long)v);
    if (g_rank == 3) {
        /* Its own checks passed; it leaves without closing anything. */
        int rc = report("shrink");
        fflush(stdout);
        fflush(stderr);
        _exit(rc);
    }
    v = g_rank + 1;
    CHECK(braid_all_reduce(&v, &v, 1, BRAID_I64, BRAID_SUM, comm) != BRAID_SUCCESS, "a call without rank 3 succeeded");

    int live[4] = {-1, -1, -1, -1};
    size_t nlive = 0;
    uint64_t completed = 99;
    EXPECT_ERR(braid_comm_agree(comm, live, 2, &nlive, &completed), BRAID_ERR_INVALID_ARGUMENT, "live_cap");
    CHECK(nlive == 3, "agree (too small) counted %zu live ranks", nlive);
    EXPECT_OK(braid_comm_agree(comm, live, 4, &nlive, &completed));
    CHECK(nlive == 3 && live[0] == 0 && live[1] == 1 && live[2] == 2 && completed == 1,
          "agree: %zu live (%d %d %d), %llu completed", nlive, live[0], live[1], live[2], (unsigned long long)completed);

    EXPECT_OK(braid_comm_shrink(comm, &small));
    if (!small) return report("shrink");
    EXPECT_OK(braid_comm_rank(small, &r));
    EXPECT_OK(braid_comm_size(small, &n));
    CHECK(n == 3 && r == g_rank, "shrunk: rank %d of %d", r, n);
    int32_t w[5];
    for (int i = 0; i < 5; i++) w[i] = (g_rank + 1) * (i + 1);
    EXPECT_OK(braid_all_reduce(w, w, 5, BRAID_I32, BRAID_SUM, small));
    for (int i = 0; i < 5; i++) CHECK(w[i] == 6 * (i + 1), "shrunk all-reduce [%d] = %d", i, w[i]);
    EXPECT_OK(braid_comm_destroy(small));
    EXPECT_OK(braid_comm_destroy(comm));
    return report("shrink");
}
