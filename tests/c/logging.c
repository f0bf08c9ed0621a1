/* Logging from C: the library prints braid's log lines on stderr from BRAID_DEBUG
 * (read on the first call), or from braid_set_log_level. With the argument `set`,
 * the program asks for debug lines itself (after checking that a bad filter is
 * refused); without it, BRAID_DEBUG decides. With `callback`, it asks for debug
 * lines and registers a log callback while it builds its communicator (the lines
 * go to the callback, not stderr), then unregisters it before a dup (whose line
 * goes to stderr again). Run: braid run -n 2 ./logging [set|callback] */
#include "check.h"

/* What the callback saw; it runs on whichever thread logs, so a mutex would be
 * needed in general: building a communicator logs "topology discovered" on the
 * calling thread, which is all this program looks for. */
static int g_calls = 0;
static int g_topology_level = -1;
static char g_topology_target[128];
static char g_topology_message[512];
static braid_result g_reentry = BRAID_SUCCESS;
static char g_reentry_error[256];
static int g_user_ok = 1;
static int g_marker;

static void on_log(void *user, int level, const char *target, const char *message) {
    __atomic_add_fetch(&g_calls, 1, __ATOMIC_SEQ_CST);
    if (user != &g_marker) g_user_ok = 0;
    if (strstr(message, "topology discovered") && g_topology_level < 0) {
        g_topology_level = level;
        snprintf(g_topology_target, sizeof g_topology_target, "%s", target);
        snprintf(g_topology_message, sizeof g_topology_message, "%s", message);
        /* braid calls are refused in here; reading the error is allowed. */
        int size = 0;
        g_reentry = braid_comm_size(NULL, &size);
        snprintf(g_reentry_error, sizeof g_reentry_error, "%s", braid_last_error());
    }
}

int main(int argc, char **argv) {
    int callback = argc > 1 && strcmp(argv[1], "callback") == 0;
    if (argc > 1 && strcmp(argv[1], "set") == 0) {
        EXPECT_ERR(braid_set_log_level(NULL), BRAID_ERR_INVALID_ARGUMENT, "filter is NULL");
        EXPECT_ERR(braid_set_log_level("braid=nonsense"), BRAID_ERR_INVALID_ARGUMENT, "is not a log filter");
        EXPECT_OK(braid_set_log_level("braid=debug"));
    }
    if (callback) {
        EXPECT_OK(braid_set_log_level("braid=debug"));
        EXPECT_OK(braid_set_log_callback(on_log, &g_marker));
    }
    braid_comm *comm = NULL;
    EXPECT_OK(braid_comm_init_from_env(&comm));
    if (!comm) return report("logging");
    EXPECT_OK(braid_comm_rank(comm, &g_rank));
    if (callback) {
        CHECK(g_calls > 0, "the callback was never called");
        CHECK(g_user_ok, "the callback got another user pointer");
        CHECK(g_topology_level == BRAID_LOG_DEBUG, "\"topology discovered\" at level %d, not BRAID_LOG_DEBUG",
              g_topology_level);
        CHECK(strcmp(g_topology_target, "braid::topology") == 0, "target \"%s\"", g_topology_target);
        char rank_field[32];
        snprintf(rank_field, sizeof rank_field, "rank=%d", g_rank);
        CHECK(strstr(g_topology_message, rank_field) != NULL, "message \"%s\" lacks %s", g_topology_message,
              rank_field);
        CHECK(g_reentry == BRAID_ERR_UNSUPPORTED, "a braid call inside the callback returned %d", (int)g_reentry);
        CHECK(strstr(g_reentry_error, "refused inside the log callback") != NULL, "its error: \"%s\"",
              g_reentry_error);
        EXPECT_OK(braid_set_log_callback(NULL, NULL));
        int before = __atomic_load_n(&g_calls, __ATOMIC_SEQ_CST);
        braid_comm *twin = NULL;
        EXPECT_OK(braid_comm_dup(comm, &twin));
        if (twin) EXPECT_OK(braid_comm_destroy(twin));
        CHECK(__atomic_load_n(&g_calls, __ATOMIC_SEQ_CST) == before, "%d calls after unregistering",
              __atomic_load_n(&g_calls, __ATOMIC_SEQ_CST) - before);
    }
    EXPECT_OK(braid_barrier(comm));
    EXPECT_OK(braid_comm_destroy(comm));
    return report("logging");
}
