// include/braid.h compiles as C++ (g++ -std=c++17 -Wall -Werror) and links: the
// declarations are extern "C" and the enums are usable as C++ types.
#include "braid.h"

#include <cstdio>
#include <cstring>

int main() {
    braid_result r = braid_comm_rank(nullptr, nullptr);
    braid_dtype d = BRAID_BF16;
    braid_reduce_op op = BRAID_AVG;
    braid_work *w = nullptr;
    if (r != BRAID_ERR_INVALID_ARGUMENT || std::strlen(braid_last_error()) == 0 || d != 3 || op != 4 ||
        braid_work_free(w) != BRAID_ERR_INVALID_ARGUMENT) {
        std::printf("C++: unexpected result %d\n", static_cast<int>(r));
        return 1;
    }
    std::printf("C++: braid %s\n", braid_version());
    return 0;
}
