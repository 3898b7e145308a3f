// Profiling only (bench/control_profile.sh), never in a build or a package: valgrind 3.19
// (Debian 12) does not know pidfd_open (syscall 434) and answers ENOSYS, so the daemon refuses
// every caller under callgrind (it fails closed). LD_PRELOADed into the profiled daemon, this
// answers pidfd_open with an eventfd that never polls readable: the daemon's checks run and
// cost what they cost in user space, but "the caller still runs" is then always true. A newer
// valgrind does not need it.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>
long syscall(long n, ...) {
    va_list ap;
    va_start(ap, n);
    long a[6];
    for (int i = 0; i < 6; ++i)
        a[i] = va_arg(ap, long);
    va_end(ap);
    if (n == SYS_pidfd_open) return eventfd(0, EFD_CLOEXEC);
    static long (*real)(long, ...);
    if (!real) real = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
    return real(n, a[0], a[1], a[2], a[3], a[4], a[5]);
}
