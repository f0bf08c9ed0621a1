/* The fastest a message can move from one core's cache to another core's memory on
 * this machine: thread A (CPU 0) copies N bytes from its own buffer into a shared one,
 * chunk by chunk, raising a flag per chunk; thread B (CPU 1) copies each chunk out into
 * its own buffer as soon as its flag is up, then acknowledges the whole message. Time
 * per message and GB/s, for a 2-rank broadcast's lower bound at sizes in cache (a
 * single-core copy rate is not one: its data never crosses cores). Median of 7 runs of
 * ITERS messages. gcc -O2 -pthread -o /tmp/core_handoff results/probe/core_handoff.c
 * Usage: /tmp/core_handoff [BYTES [CHUNK]] */
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
static size_t N, CH, NCH; static long ITERS;
static char *src, *shared, *dst;
static _Alignas(128) atomic_long ack;
static atomic_long *flags;
static void *consumer(void *a){
  (void)a; pin(1);
  for(long it=1; it<=ITERS; it++){
    for(size_t k=0;k<NCH;k++){
      while(atomic_load_explicit(&flags[k*16],memory_order_acquire)!=it);
      size_t len = (k+1)*CH<=N ? CH : N-k*CH;
      memcpy(dst+k*CH, shared+k*CH, len);
    }
    atomic_store_explicit(&ack,it,memory_order_release);
  }
  return 0;
}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){
  N = argc>1 ? strtoul(argv[1],0,0) : 1<<20;
  CH = argc>2 ? strtoul(argv[2],0,0) : 64<<10;
  NCH = (N+CH-1)/CH;
  ITERS = N <= (1<<20) ? 2000 : N <= (16<<20) ? 100 : 20;
  src=aligned_alloc(4096,N); shared=aligned_alloc(4096,N); dst=aligned_alloc(4096,N);
  memset(src,1,N); memset(shared,2,N); memset(dst,3,N);
  flags=aligned_alloc(128,NCH*16*sizeof(atomic_long)); memset(flags,0,NCH*16*sizeof(atomic_long));
  pin(0);
  double runs[7];
  long base=0;
  for(int r=0;r<7;r++){
    atomic_store(&ack,0); for(size_t k=0;k<NCH;k++) atomic_store(&flags[k*16],0);
    pthread_t th; pthread_create(&th,0,consumer,0);
    double t=now();
    for(long it=1; it<=ITERS; it++){
      while(atomic_load_explicit(&ack,memory_order_acquire)!=it-1);
      for(size_t k=0;k<NCH;k++){
        size_t len = (k+1)*CH<=N ? CH : N-k*CH;
        memcpy(shared+k*CH, src+k*CH, len);
        atomic_store_explicit(&flags[k*16],it,memory_order_release);
      }
    }
    while(atomic_load_explicit(&ack,memory_order_acquire)!=ITERS);
    runs[r]=(now()-t)/ITERS;
    pthread_join(th,0);
  }
  (void)base;
  qsort(runs,7,sizeof(double),cmp);
  printf("bytes %zu chunk %zu: %.2f us per message, %.2f GB/s (median of 7 x %ld)\n",
         N, CH, runs[3]*1e6, N/runs[3]/1e9, ITERS);
  return 0;
}
