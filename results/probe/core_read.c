/* A single-copy handoff's floor: thread A (CPU 0) writes N bytes (as a root's program
 * writes its buffer before a broadcast), then raises a flag; thread B (CPU 1) copies
 * them into its own buffer, timing only its copy, then acknowledges. The time of one
 * copy whose source sits in the other core's cache: what a receiver that reads the
 * root's memory directly (CMA, registered buffers) cannot beat. Median of 7 runs.
 * gcc -O2 -pthread -o /tmp/core_read results/probe/core_read.c; /tmp/core_read [BYTES] */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);sched_setaffinity(0,sizeof s,&s);}
static size_t N; static long ITERS; static char *src,*dst; static double spent;
static _Alignas(128) atomic_long ready, ack;
static void *consumer(void*a){(void)a;pin(1);spent=0;
  for(long it=1;it<=ITERS;it++){
    while(atomic_load_explicit(&ready,memory_order_acquire)!=it);
    double t=now(); memcpy(dst,src,N); spent+=now()-t;
    atomic_store_explicit(&ack,it,memory_order_release);}
  return 0;}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){
  N=argc>1?strtoul(argv[1],0,0):1<<20; ITERS=N<=(1<<20)?2000:N<=(16<<20)?100:20;
  src=aligned_alloc(4096,N); dst=aligned_alloc(4096,N); memset(src,1,N); memset(dst,2,N);
  pin(0); double runs[7];
  for(int r=0;r<7;r++){
    atomic_store(&ready,0); atomic_store(&ack,0);
    pthread_t th; pthread_create(&th,0,consumer,0);
    for(long it=1;it<=ITERS;it++){
      while(atomic_load_explicit(&ack,memory_order_acquire)!=it-1);
      memset(src,(int)it,N);
      atomic_store_explicit(&ready,it,memory_order_release);}
    pthread_join(th,0); runs[r]=spent/ITERS;}
  qsort(runs,7,sizeof(double),cmp);
  printf("bytes %zu: %.2f us per copy across cores, %.2f GB/s (median of 7 x %ld)\n",N,runs[3]*1e6,N/runs[3]/1e9,ITERS);
}
