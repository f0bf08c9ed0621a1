/* mpi_alltoall.c - Open MPI's MPI_Alltoall timed the way ../shared/peers'
 * mpi_allreduce.c times the other collectives, so results/scripts/vs_mpi.sh can set
 * braid's all-to-all beside it (the shared peer has no all-to-all).
 *
 * SIZE (bytes, --sizes) is each rank's whole send buffer, as `braid perf` and
 * nccl-tests count it: n blocks of SIZE/4/n floats, block j going to rank j.
 * Out of place; the receive buffer is poisoned with NaNs before each op.
 * Each timed op is [poison] ; MPI_Barrier ; t0 ; MPI_Alltoall ; t1, its time
 * the slowest rank's; reported: the median over iterations, busbw factor
 * (n-1)/n. Every op's result is compared bit-exactly with the expected one.
 *
 * Data: element i of the block rank r sends to rank j is (r*3 + j + i) % 5 + 1.
 * Build: mpicc -O2 -o /tmp/mpi/mpi_alltoall results/probe/mpi_alltoall.c
 * Run:   mpirun -np 2 /tmp/mpi/mpi_alltoall --sizes 4096,65536 [--iters N]
 */
#define _GNU_SOURCE
#include <math.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int default_iters(size_t bytes) { return bytes <= (64u << 10) ? 200 : bytes <= (1u << 20) ? 50 : 20; }

int main(int argc, char **argv) {
    MPI_Init(&argc, &argv);
    int rank, n;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    size_t sizes[64];
    int nsizes = 0, iters_override = 0, warmup = 5;
    for (int a = 1; a < argc; a++) {
        if (!strcmp(argv[a], "--sizes") && a + 1 < argc) {
            char *s = argv[++a];
            for (char *t = strtok(s, ","); t && nsizes < 64; t = strtok(NULL, ",")) sizes[nsizes++] = strtoull(t, NULL, 10);
        } else if (!strcmp(argv[a], "--iters") && a + 1 < argc) {
            iters_override = atoi(argv[++a]);
        } else if (!strcmp(argv[a], "--warmup") && a + 1 < argc) {
            warmup = atoi(argv[++a]);
        } else {
            if (rank == 0) fprintf(stderr, "usage: mpi_alltoall --sizes B[,B...] [--iters N] [--warmup W]\n");
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    for (int si = 0; si < nsizes; si++) {
        size_t count = sizes[si] / sizeof(float) / (size_t)n;
        size_t total = count * (size_t)n;
        size_t bytes = total * sizeof(float);
        float *send = malloc(bytes + 1), *recv = malloc(bytes + 1), *expect = malloc(bytes + 1);
        for (int j = 0; j < n; j++)
            for (size_t i = 0; i < count; i++) {
                send[j * count + i] = (float)((rank * 3 + j + i) % 5 + 1);
                expect[j * count + i] = (float)((j * 3 + rank + i) % 5 + 1);
            }
        int iters = iters_override > 0 ? iters_override : default_iters(bytes);
        double *lat = malloc(sizeof(double) * (size_t)iters);
        long bad = 0, bad_all = 0;
        for (int it = -warmup; it < iters; it++) {
            for (size_t k = 0; k < total; k++) recv[k] = NAN;
            MPI_Barrier(MPI_COMM_WORLD);
            double t0 = now();
            MPI_Alltoall(send, (int)count, MPI_FLOAT, recv, (int)count, MPI_FLOAT, MPI_COMM_WORLD);
            double t1 = now();
            if (memcmp(recv, expect, bytes) != 0) bad++;
            if (it >= 0) lat[it] = t1 - t0;
        }
        MPI_Allreduce(MPI_IN_PLACE, lat, iters, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
        MPI_Allreduce(&bad, &bad_all, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
        if (rank == 0 && count > 0) {
            qsort(lat, (size_t)iters, sizeof(double), cmp_double);
            double med = (iters % 2) ? lat[iters / 2] : 0.5 * (lat[iters / 2 - 1] + lat[iters / 2]);
            double f = (double)(n - 1) / n;
            printf("{\"peer\":\"openmpi\",\"op\":\"alltoall\",\"transport\":\"sm\",\"np\":%d,\"mode\":\"oop\","
                   "\"bytes\":%zu,\"iters\":%d,\"warmup\":%d,\"median_us\":%.3f,\"min_us\":%.3f,"
                   "\"algbw_GBps\":%.4f,\"busbw_GBps\":%.4f,\"busbw_factor\":%.4f,\"correct\":%s,\"bad_ops\":%ld}\n",
                   n, bytes, iters, warmup, med * 1e6, lat[0] * 1e6, bytes / med / 1e9, bytes / med / 1e9 * f, f,
                   bad_all == 0 ? "true" : "false", bad_all);
            fflush(stdout);
        }
        free(lat);
        free(send);
        free(recv);
        free(expect);
    }
    MPI_Finalize();
    return 0;
}
