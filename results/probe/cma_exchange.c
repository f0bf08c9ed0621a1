/* Both ranks at once read the other's N bytes: two processes (CPU 0, CPU 1) each write
 * their own N-byte block, then read the peer's, with process_vm_readv from private
 * memory (mode 0: the CMA floor of a 2-rank all-gather of plain buffers) or with memcpy
 * from a MAP_SHARED block (mode 1: registered buffers). Median of 5 runs, slowest rank.
 * gcc -O2 -o /tmp/cma_exchange results/probe/cma_exchange.c; /tmp/cma_exchange BYTES [MODE] */
#define _GNU_SOURCE
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/mman.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>
static double now(void){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec*1e-9;}
static void pin(int c){cpu_set_t s;CPU_ZERO(&s);CPU_SET(c,&s);sched_setaffinity(0,sizeof s,&s);}
struct sh { _Alignas(128) atomic_long phase[2]; _Alignas(128) atomic_long addr[2]; double spent[2]; int pid[2]; };
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
static void waitall(struct sh*s,long v){ while(atomic_load(&s->phase[0])<v||atomic_load(&s->phase[1])<v); }
int main(int argc,char**argv){
  size_t N=argc>1?strtoul(argv[1],0,0):1<<19; int shared=argc>2?atoi(argv[2]):0;
  long IT=N<=(1<<20)?2000:100;
  struct sh*s=mmap(0,sizeof *s,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS,-1,0);
  char*shb[2]; for(int i=0;i<2;i++) shb[i]=mmap(0,N,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS,-1,0);
  double runs[5];
  for(int r=0;r<5;r++){ atomic_store(&s->phase[0],0); atomic_store(&s->phase[1],0);
    pid_t c[2];
    for(int me=0;me<2;me++){ c[me]=fork(); if(c[me]==0){ pin(me); s->pid[me]=getpid();
        char*src=shared?shb[me]:aligned_alloc(4096,N); char*dst=aligned_alloc(4096,N); memset(dst,0,N);
        atomic_store(&s->addr[me],(long)src); double spent=0; int o=1-me;
        for(long it=1;it<=IT;it++){ memset(src,(int)it,N);
          atomic_store(&s->phase[me],2*it-1); waitall(s,2*it-1);
          double t=now();
          if(shared) memcpy(dst,shb[o],N); else { struct iovec lo={dst,N},re={(void*)atomic_load(&s->addr[o]),N};
            if(process_vm_readv(s->pid[o],&lo,1,&re,1,0)!=(ssize_t)N){perror("rv");_exit(1);} }
          spent+=now()-t;
          atomic_store(&s->phase[me],2*it); waitall(s,2*it);}
        s->spent[me]=spent/IT; _exit(0);} }
    waitpid(c[0],0,0); waitpid(c[1],0,0); runs[r]=s->spent[0]>s->spent[1]?s->spent[0]:s->spent[1];}
  qsort(runs,5,sizeof(double),cmp);
  printf("%s both reading %zu: %.2f us\n",shared?"shared-memcpy":"cma",N,runs[2]*1e6);
}
