// bench/ext4_nowait.c — which O_DIRECT writes does the filesystem accept inline from
// io_uring, and which does io_uring punt to an io-wq worker (docs/PERFORMANCE.md,
// "Appends: io-wq and doorbells")? Needs liburing (apt-get install liburing-dev).
//   gcc -O2 -o target/ext4_nowait bench/ext4_nowait.c -luring
//   perf stat -e io_uring:io_uring_queue_async_work target/ext4_nowait (then:)
//     MODE BS COUNT QD target/nowait.dat [BASE] [OVERLAP] [split]     (e.g. falloc 1048576 256 1)
// MODE: append (empty file), keep (fallocate KEEP_SIZE ahead), falloc (fallocate, size
// set), trunc (ftruncate to size, sparse), zero (written with zeros first), zeroout
// (FALLOC_FL_ZERO_RANGE).
// BASE: offset of the first write (512: unaligned to the 4 KiB fs block); OVERLAP: bytes
// each write re-covers of the previous one (4096: an append continuing a partial block);
// SPLIT ("split", qd 1 only): those re-covered bytes go as a write of their own, submitted
// with the rest of the append.
// The file is created, written and removed by the run.
#define _GNU_SOURCE
#include <liburing.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <time.h>
#include <linux/falloc.h>
#include <sys/resource.h>
static double sysbusy(){FILE*f=fopen("/proc/stat","r");unsigned long long u,n,s,i,w,q,sq,st;fscanf(f,"cpu %llu %llu %llu %llu %llu %llu %llu %llu",&u,&n,&s,&i,&w,&q,&sq,&st);fclose(f);return (u+n+s+q+sq+st)/100.0;}
static double selfcpu(){struct rusage r;getrusage(RUSAGE_SELF,&r);return r.ru_utime.tv_sec+r.ru_utime.tv_usec/1e6+r.ru_stime.tv_sec+r.ru_stime.tv_usec/1e6;}
static double now(){struct timespec t;clock_gettime(CLOCK_MONOTONIC,&t);return t.tv_sec+t.tv_nsec/1e9;}
int main(int argc,char**argv){
  if(argc<6){fprintf(stderr,"usage\n");return 2;}
  const char*mode=argv[1]; size_t bs=strtoull(argv[2],0,0); int count=atoi(argv[3]); int qd=atoi(argv[4]); const char*path=argv[5];
  size_t total=bs*(size_t)count; off_t base=argc>6?atoll(argv[6]):0; size_t step=argc>7?atoll(argv[7]):0; int split=argc>8&&!strcmp(argv[8],"split"); total+=base;
  unlink(path);
  int fd=open(path,O_RDWR|O_CREAT|O_TRUNC|O_DIRECT,0644); if(fd<0){perror("open");return 1;}
  double t0=now();
  if(!strcmp(mode,"keep")){ if(fallocate(fd,FALLOC_FL_KEEP_SIZE,0,total)){perror("fallocate");return 1;} }
  else if(!strcmp(mode,"falloc")){ if(fallocate(fd,0,0,total)){perror("fallocate");return 1;} }
  else if(!strcmp(mode,"trunc")){ if(ftruncate(fd,total)){perror("ftruncate");return 1;} }
  else if(!strcmp(mode,"zero")){ void*z=NULL; posix_memalign(&z,4096,1<<20); memset(z,0,1<<20);
     for(size_t o=0;o<total;o+=1<<20) if(pwrite(fd,z,1<<20,o)!=1<<20){perror("pwrite");return 1;}
     fdatasync(fd); free(z);}
  else if(!strcmp(mode,"zeroout")){ if(fallocate(fd,FALLOC_FL_ZERO_RANGE,0,total)){perror("zero_range");return 1;} }
  double tprep=now()-t0;
  struct io_uring ring; if(io_uring_queue_init(64,&ring,0)){perror("ring");return 1;}
  void**bufs=calloc(qd,sizeof(void*)); for(int i=0;i<qd;i++){posix_memalign(&bufs[i],4096,bs); memset(bufs[i],0x5a,bs);}
  int sub=0,done=0,inflight=0; double b0=sysbusy(),c0=selfcpu(); double t1=now();
  if(split&&qd!=1){fprintf(stderr,"split needs qd 1\n");return 2;}
  while(done<count){
    if(split&&sub>0&&step>0){
      /* the append's rewrite of the previous write's last block, and the rest, apart */
      off_t pos=base+(off_t)sub*(bs-step);
      struct io_uring_sqe*s=io_uring_get_sqe(&ring); io_uring_prep_write(s,fd,bufs[0],step,pos); s->user_data=sub;
      s=io_uring_get_sqe(&ring); io_uring_prep_write(s,fd,(char*)bufs[0]+step,bs-step,pos+step); s->user_data=sub;
      io_uring_submit(&ring); sub++;
      for(int k=0;k<2;k++){struct io_uring_cqe*c; if(io_uring_wait_cqe(&ring,&c)){perror("wait");return 1;}
        if(c->res<=0){fprintf(stderr,"write res %d\n",c->res);return 1;} io_uring_cqe_seen(&ring,c);}
      done++; continue;
    }
    while(inflight<qd && sub<count){struct io_uring_sqe*s=io_uring_get_sqe(&ring); io_uring_prep_write(s,fd,bufs[sub%qd],bs,base+(off_t)sub*(bs-step)); s->user_data=sub; sub++; inflight++;}
    io_uring_submit(&ring);
    struct io_uring_cqe*c; if(io_uring_wait_cqe(&ring,&c)){perror("wait");return 1;}
    if(c->res!=(int)bs){fprintf(stderr,"write res %d\n",c->res);return 1;}
    io_uring_cqe_seen(&ring,c); done++; inflight--;
  }
  double t=now()-t1; double b1=sysbusy(),c1=selfcpu(); double gib=total/1073741824.0;
  printf("%-7s bs=%-8zu qd=%d prep=%.3fs %5.0f MiB/s proc %.3f CPU-s/GiB, system %.3f CPU-s/GiB\n",mode,bs,qd,tprep,total/t/1048576.0,(c1-c0)/gib,(b1-b0)/gib);
  close(fd); unlink(path); return 0;
}
