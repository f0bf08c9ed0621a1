/* Helpers shared by the C tests of braid's C ABI: checks that count and report,
 * and element access for every braid_dtype (values are small integers, exact in
 * every type, so results are compared exactly). */
#ifndef BRAID_TEST_CHECK_H
#define BRAID_TEST_CHECK_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "braid.h"

static int g_rank = -1;
static int g_checks = 0;
static int g_failures = 0;

#define CHECK(cond, ...)                                                         \
    do {                                                                         \
        g_checks++;                                                              \
        if (!(cond)) {                                                           \
            g_failures++;                                                        \
            fprintf(stderr, "rank %d: FAILED %s:%d: ", g_rank, __FILE__, __LINE__); \
            fprintf(stderr, __VA_ARGS__);                                        \
            fputc('\n', stderr);                                                 \
        }                                                                        \
    } while (0)

/* `call` succeeds, and leaves no error message. */
#define EXPECT_OK(call)                                                          \
    do {                                                                         \
        braid_result rc_ = (call);                                               \
        CHECK(rc_ == BRAID_SUCCESS, "%s returned %d: %s", #call, (int)rc_, braid_last_error()); \
        CHECK(rc_ != BRAID_SUCCESS || braid_last_error()[0] == '\0', "%s left a message", #call); \
    } while (0)

/* `call` fails with `code`, and braid_last_error() contains `text`. */
#define EXPECT_ERR(call, code, text)                                             \
    do {                                                                         \
        braid_result rc_ = (call);                                               \
        const char *msg_ = braid_last_error();                                   \
        CHECK(rc_ == (code), "%s returned %d, expected %s (%s)", #call, (int)rc_, #code, msg_); \
        CHECK(strstr(msg_, (text)) != NULL, "%s: message \"%s\" lacks \"%s\"", #call, msg_, (text)); \
    } while (0)

static const braid_dtype ALL_DTYPES[8] = {BRAID_F32, BRAID_F64, BRAID_F16, BRAID_BF16,
                                          BRAID_I8,  BRAID_U8,  BRAID_I32, BRAID_I64};
static const char *const DTYPE_NAMES[8] = {"f32", "f64", "f16", "bf16", "i8", "u8", "i32", "i64"};
static const braid_reduce_op ALL_OPS[5] = {BRAID_SUM, BRAID_PROD, BRAID_MIN, BRAID_MAX, BRAID_AVG};
static const char *const OP_NAMES[5] = {"sum", "prod", "min", "max", "avg"};

static inline size_t dtype_size(braid_dtype d) {
    switch (d) {
    case BRAID_F64: case BRAID_I64: return 8;
    case BRAID_F32: case BRAID_I32: return 4;
    case BRAID_F16: case BRAID_BF16: return 2;
    default: return 1;
    }
}

/* binary16 of a float that is exactly representable as a normal binary16 (or 0). */
static inline uint16_t f32_to_f16(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint32_t sign = (x >> 16) & 0x8000u;
    if ((x & 0x7fffffffu) == 0) return (uint16_t)sign;
    uint32_t exp = ((x >> 23) & 0xffu) - 127u + 15u;
    return (uint16_t)(sign | (exp << 10) | ((x & 0x7fffffu) >> 13));
}

static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, x;
    if (exp == 0) {
        float v = (float)mant * 5.9604644775390625e-08f; /* subnormal: mant x 2^-24 */
        return sign ? -v : v;
    }
    x = exp == 31 ? sign | 0x7f800000u | (mant << 13) : sign | ((exp - 15u + 127u) << 23) | (mant << 13);
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

static inline void put(braid_dtype d, void *buf, size_t i, double v) {
    float f = (float)v;
    uint32_t x;
    uint16_t h;
    switch (d) {
    case BRAID_F32: ((float *)buf)[i] = f; break;
    case BRAID_F64: ((double *)buf)[i] = v; break;
    case BRAID_F16: h = f32_to_f16(f); memcpy((char *)buf + 2 * i, &h, 2); break;
    case BRAID_BF16: memcpy(&x, &f, 4); h = (uint16_t)(x >> 16); memcpy((char *)buf + 2 * i, &h, 2); break;
    case BRAID_I8: ((int8_t *)buf)[i] = (int8_t)v; break;
    case BRAID_U8: ((uint8_t *)buf)[i] = (uint8_t)v; break;
    case BRAID_I32: ((int32_t *)buf)[i] = (int32_t)v; break;
    case BRAID_I64: ((int64_t *)buf)[i] = (int64_t)v; break;
    }
}

static inline double get(braid_dtype d, const void *buf, size_t i) {
    uint32_t x;
    uint16_t h;
    float f;
    switch (d) {
    case BRAID_F32: return ((const float *)buf)[i];
    case BRAID_F64: return ((const double *)buf)[i];
    case BRAID_F16: memcpy(&h, (const char *)buf + 2 * i, 2); return f16_to_f32(h);
    case BRAID_BF16: memcpy(&h, (const char *)buf + 2 * i, 2); x = (uint32_t)h << 16; memcpy(&f, &x, 4); return f;
    case BRAID_I8: return ((const int8_t *)buf)[i];
    case BRAID_U8: return ((const uint8_t *)buf)[i];
    case BRAID_I32: return ((const int32_t *)buf)[i];
    case BRAID_I64: return (double)((const int64_t *)buf)[i];
    }
    return -1.0;
}

/* Print the tally; the exit status of the program. */
static inline int report(const char *program) {
    if (g_failures == 0) {
        printf("rank %d: %s: all %d checks passed\n", g_rank, program, g_checks);
        return 0;
    }
    printf("rank %d: %s: %d of %d checks FAILED\n", g_rank, program, g_failures, g_checks);
    return 1;
}

#endif
