/* The single-copy floor for *plain* buffers between processes: the parent (CPU 0)
 * writes N bytes of ordinary private memory, then the child (CPU 1) copies them into
 * its own buffer with process_vm_readv (CMA), the only way one process can read
 * another's unshared memory. Mode 1 instead places the source in a MAP_SHARED
 * mapping and copies it with memcpy (what registered buffers allow). Times only the
 * child's copy; median of 5 runs of 2000 (<= 1 MiB) or 100 copies.
 * gcc -O2 -o /tmp/cma_read results/probe/cma_read.c
 * /tmp/cma_read BYTES [CHUNK] [MODE: 0 cma, 1 shared memcpy]; HUGE=1 advises THP. */
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
struct sh { _Alignas(128) atomic_long ready; _Alignas(128) atomic_long ack; double spent; };
static int cmp(const void*a,const void*b){double x=*(double*)a,y=*(double*)b;return x<y?-1:x>y;}
static char *huge_alloc(size_t n){
  size_t h=1<<21; char*p=aligned_alloc(h,(n+h-1)&~(h-1));
  if(getenv("HUGE")) madvise(p,n,MADV_HUGEPAGE);
  return p;}
int main(int argc,char**argv){
  size_t N=argc>1?strtoul(argv[1],0,0):1<<20; size_t CH=argc>2?strtoul(argv[2],0,0):N;
  int shared=argc>3?atoi(argv[3]):0;
  long ITERS=N<=(1<<20)?2000:100;
  struct sh*s=mmap(0,sizeof *s,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS,-1,0);
  char*src=shared?mmap(0,N,PROT_READ|PROT_WRITE,MAP_SHARED|MAP_ANONYMOUS,-1,0):huge_alloc(N);
  memset(src,1,N);
  pid_t parent=getpid(); double runs[5];
  for(int r=0;r<5;r++){
    atomic_store(&s->ready,0); atomic_store(&s->ack,0);
    pid_t c=fork();
    if(c==0){ pin(1); char*dst=huge_alloc(N); memset(dst,2,N); double spent=0;
      for(long it=1;it<=ITERS;it++){
        while(atomic_load_explicit(&s->ready,memory_order_acquire)!=it);
        double t=now();
        if(shared) memcpy(dst,src,N); else
        for(size_t o=0;o<N;o+=CH){ size_t l=N-o<CH?N-o:CH; struct iovec lo={dst+o,l},re={src+o,l};
          if(process_vm_readv(parent,&lo,1,&re,1,0)!=(ssize_t)l){perror("process_vm_readv");_exit(1);} }
        spent+=now()-t;
        atomic_store_explicit(&s->ack,it,memory_order_release);}
      s->spent=spent/ITERS; _exit(0);}
    pin(0);
    for(long it=1;it<=ITERS;it++){
      while(atomic_load_explicit(&s->ack,memory_order_acquire)!=it-1);
      memset(src,(int)it,N);
      atomic_store_explicit(&s->ready,it,memory_order_release);}
    waitpid(c,0,0); runs[r]=s->spent;}
  qsort(runs,5,sizeof(double),cmp);
  printf("%s bytes %zu chunk %zu: %.2f us, %.2f GB/s\n",shared?"shared-memcpy":"cma",N,CH,runs[2]*1e6,N/runs[2]/1e9);
}
