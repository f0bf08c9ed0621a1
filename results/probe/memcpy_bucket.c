// Issue 39: how long packing or unpacking the fusion bench's 1,000 tensors takes
// (one 15.1 MB memcpy), on one thread and on two at once (both ranks pack
// together), median of 31 after warming the pages.
//   cc -O2 -pthread -o /tmp/memcpy_bucket results/probe/memcpy_bucket.c && /tmp/memcpy_bucket
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define BYTES 15100000UL
#define REPS 31

static double now(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return t.tv_sec + t.tv_nsec * 1e-9;
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

struct job { char *src, *dst; double t[REPS]; pthread_barrier_t *bar; };

static void *copy(void *arg) {
  struct job *j = arg;
  memset(j->src, 1, BYTES);
  memset(j->dst, 0, BYTES);
  for (int r = 0; r < REPS; r++) {
    if (j->bar) pthread_barrier_wait(j->bar);
    double t0 = now();
    memcpy(j->dst, j->src, BYTES);
    j->t[r] = now() - t0;
  }
  qsort(j->t, REPS, sizeof(double), cmp);
  return NULL;
}

int main(void) {
  struct job a = {malloc(BYTES), malloc(BYTES), {0}, NULL};
  copy(&a);
  printf("one thread: %.3f ms per 15.1 MB copy (median), %.1f GB/s\n", a.t[REPS / 2] * 1e3, BYTES / a.t[REPS / 2] / 1e9);
  pthread_barrier_t bar;
  pthread_barrier_init(&bar, NULL, 2);
  struct job b[2] = {{malloc(BYTES), malloc(BYTES), {0}, &bar}, {malloc(BYTES), malloc(BYTES), {0}, &bar}};
  pthread_t th[2];
  for (int i = 0; i < 2; i++) pthread_create(&th[i], NULL, copy, &b[i]);
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  printf("two threads at once: %.3f and %.3f ms (medians)\n", b[0].t[REPS / 2] * 1e3, b[1].t[REPS / 2] * 1e3);
  return 0;
}
