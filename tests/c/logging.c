/* Logging from C: the library prints braid's log lines on stderr from BRAID_DEBUG
 * (read on the first call), or from braid_set_log_level. With the argument `set`,
 * the program asks for debug lines itself (after checking that a bad filter is
 * refused); without it, BRAID_DEBUG decides. Run: braid run -n 2 ./logging [set] */
#include "check.h"

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "set") == 0) {
        EXPECT_ERR(braid_set_log_level(NULL), BRAID_ERR_INVALID_ARGUMENT, "filter is NULL");
        EXPECT_ERR(braid_set_log_level("braid=nonsense"), BRAID_ERR_INVALID_ARGUMENT, "is not a log filter");
        EXPECT_OK(braid_set_log_level("braid=debug"));
    }
    braid_comm *comm = NULL;
    EXPECT_OK(braid_comm_init_from_env(&comm));
    if (!comm) return report("logging");
    EXPECT_OK(braid_comm_rank(comm, &g_rank));
    EXPECT_OK(braid_barrier(comm));
    EXPECT_OK(braid_comm_destroy(comm));
    return report("logging");
}
