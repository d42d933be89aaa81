// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// LD_PRELOAD for tools without an MPTCP option (iperf3 3.12): every TCP stream socket the
// process opens is an MPTCP one. `mpsteer bench --live --cases iperf3` runs iperf3 with it on
// both ends, as the yardstick for the lab's own sender.
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <sys/socket.h>

#ifndef IPPROTO_MPTCP
#define IPPROTO_MPTCP 262
#endif

int socket(int domain, int type, int protocol) {
    static int (*real)(int, int, int);
    if (!real) real = (int (*)(int, int, int))dlsym(RTLD_NEXT, "socket");
    if ((domain == AF_INET || domain == AF_INET6) && (type & 0xf) == SOCK_STREAM &&
        (protocol == 0 || protocol == IPPROTO_TCP))
        protocol = IPPROTO_MPTCP;
    return real(domain, type, protocol);
}
