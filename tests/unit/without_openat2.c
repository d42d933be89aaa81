// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Runs a command with openat2 failing ENOSYS, as it does under qemu-user and on kernels before
// 5.6, so the policy directory reader's userspace resolution is tested natively: a seccomp
// filter that answers openat2 with ENOSYS and allows everything else.
// usage: without_openat2 PROGRAM [ARG...]
#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#if defined(__x86_64__)
#define MPS_AUDIT_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define MPS_AUDIT_ARCH AUDIT_ARCH_AARCH64
#else
#error "without_openat2: add this architecture's AUDIT_ARCH"
#endif

int main(int argc, char** argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: without_openat2 PROGRAM [ARG...]\n");
        return 2;
    }
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, MPS_AUDIT_ARCH, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_openat2, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = sizeof filter / sizeof filter[0], .filter = filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) != 0) {
        perror("without_openat2: seccomp");
        return 2;
    }
    // The filter must be what the test relies on: openat2 now fails ENOSYS.
    if (syscall(SYS_openat2, AT_FDCWD, ".", NULL, 0) != -1 || errno != ENOSYS) {
        fprintf(stderr, "without_openat2: openat2 still reachable\n");
        return 2;
    }
    execvp(argv[1], argv + 1);
    perror("without_openat2: exec");
    return 2;
}
