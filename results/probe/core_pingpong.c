/* Core-to-core round trip (CPU 0 <-> CPU 1, one cache line) and single-thread
 * memcpy bandwidth: tells which state the VM host has put the two vCPUs in.
 * gcc -O2 -pthread -o /tmp/core_pingpong results/probe/core_pingpong.c */
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
static _Alignas(128) atomic_long flag;
static void *pong(void *a){pin(1);for(long i=1;i<=2000000;i+=2){while(atomic_load_explicit(&flag,memory_order_acquire)!=i);atomic_store_explicit(&flag,i+1,memory_order_release);}return 0;}
int main(){
  pin(0);
  size_t n=64<<20; char *a=malloc(n),*b=malloc(n); memset(a,1,n); memset(b,2,n);
  double t=now(); for(int k=0;k<4;k++) memcpy(b,a,n); double bw=4.0*n/(now()-t)/1e9;
  pthread_t th; atomic_store(&flag,0); pthread_create(&th,0,pong,0);
  t=now(); for(long i=0;i<2000000;i+=2){atomic_store_explicit(&flag,i+1,memory_order_release);while(atomic_load_explicit(&flag,memory_order_acquire)!=i+2);}
  double rt=(now()-t)/1e6*1e9; pthread_join(th,0);
  printf("memcpy64M %.1f GB/s  pingpong %.0f ns/roundtrip\n",bw,rt);
}
