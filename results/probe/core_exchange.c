/* The floor of a 2-rank all-gather read single-copy: threads on CPU 0 and CPU 1 each
 * write their own N/2 bytes, meet, then both copy the other's N/2 bytes into their own
 * buffer at the same time (as two receivers reading each other's memory with CMA do),
 * and meet again. Times the copies (from the first meeting to the second), median of 7
 * runs. gcc -O2 -pthread -o /tmp/core_exchange results/probe/core_exchange.c;
 * /tmp/core_exchange [N] */
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
static size_t H; static long ITERS; static char *mine[2], *got[2];
static _Alignas(128) atomic_long arrived[2][16];
static void meet(int me, long k){atomic_store_explicit(&arrived[me][0],k,memory_order_release);
  while(atomic_load_explicit(&arrived[1-me][0],memory_order_acquire)<k);}
static double spent;
static void *side(void *a){int me=(int)(long)a; pin(me); long k=0; double t0=0;
  for(long it=1;it<=ITERS;it++){
    memset(mine[me],(int)it,H);
    meet(me,++k); if(me==0) t0=now();
    memcpy(got[me],mine[1-me],H);
    meet(me,++k); if(me==0) spent+=now()-t0;}
  return 0;}
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
int main(int argc,char**argv){
  size_t n=argc>1?strtoul(argv[1],0,0):16<<20; H=n/2; ITERS=n<=(1<<20)?2000:n<=(16<<20)?100:20;
  for(int i=0;i<2;i++){mine[i]=aligned_alloc(4096,H); got[i]=aligned_alloc(4096,H); memset(got[i],0,H);}
  double runs[7];
  for(int r=0;r<7;r++){spent=0; atomic_store(&arrived[0][0],0); atomic_store(&arrived[1][0],0);
    pthread_t t1; pthread_create(&t1,0,side,(void*)1L); side((void*)0L); pthread_join(t1,0); runs[r]=spent/ITERS;}
  qsort(runs,7,sizeof(double),cmp);
  printf("all-gather of %zu bytes (each reads %zu): %.2f us, busbw %.2f GB/s (median of 7 x %ld)\n",
         n,H,runs[3]*1e6,(double)H/runs[3]/1e9,ITERS);
}
