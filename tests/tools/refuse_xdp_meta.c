// LD_PRELOAD shim: this process sees a kernel that refuses bpf_xdp_adjust_meta (helper 54) to XDP
// programs, as issue 50's kernel does, answering BPF_PROG_LOAD of any XDP program that calls it
// with EINVAL and that kernel's verifier line in the program's log. Everything else goes to the
// real kernel. The refusal path (the probe, the loader's message, the daemon's choice of guard
// path, the doctor) is then tested on any kernel, beside the VM's kernels, which allow the helper.
// Built twice: knod_refuse_xdp_meta refuses every such program; knod_refuse_xdp_meta_at_load
// (KNOD_SPARE_PROBES) lets programs named knod_probe load as the kernel says, so the daemon's
// probe says "available" and only the real program is refused (the daemon's fallback at load).
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <linux/bpf.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>

static int calls_adjust_meta(const union bpf_attr *attr) {
    const struct bpf_insn *insn = (const struct bpf_insn *)(unsigned long)attr->insns;
    for (unsigned i = 0; i < attr->insn_cnt; i++)
        if (insn[i].code == (BPF_JMP | BPF_CALL) && insn[i].src_reg == 0 &&
            insn[i].imm == BPF_FUNC_xdp_adjust_meta)
            return 1;
    return 0;
}

long syscall(long number, ...) {
    va_list ap;
    va_start(ap, number);
    long a1 = va_arg(ap, long), a2 = va_arg(ap, long), a3 = va_arg(ap, long);
    long a4 = va_arg(ap, long), a5 = va_arg(ap, long), a6 = va_arg(ap, long);
    va_end(ap);
    if (number == SYS_bpf && a1 == BPF_PROG_LOAD) {
        const union bpf_attr *attr = (const union bpf_attr *)a2;
#ifdef KNOD_SPARE_PROBES
        int spare = strncmp(attr->prog_name, "knod_probe", sizeof attr->prog_name) == 0;
#else
        int spare = 0;
#endif
        if (attr->prog_type == BPF_PROG_TYPE_XDP && !spare && calls_adjust_meta(attr)) {
            if (attr->log_level && attr->log_size && attr->log_buf)
                snprintf((char *)(unsigned long)attr->log_buf, attr->log_size,
                         "0: R1=ctx() R10=fp0\n"
                         "program of this type cannot use helper bpf_xdp_adjust_meta#54\n"
                         "processed 1 insns (limit 1000000) max_states_per_insn 0 total_states "
                         "0 peak_states 0 mark_read 0\n");
            errno = EINVAL;
            return -1;
        }
    }
    long (*real)(long, ...) = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
    return real(number, a1, a2, a3, a4, a5, a6);
}
