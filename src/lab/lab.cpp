// The namespace lab: commands, namespace switching, building and removing the two-namespace
// MPTCP test bed, interface counters.
#include "lab/lab.h"

#include <fcntl.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <spdlog/spdlog.h>

namespace mpsteer::lab {

namespace {

std::string join(const std::vector<std::string>& argv) {
    std::string s;
    for (const auto& a : argv) s += (s.empty() ? "" : " ") + a;
    return s;
}

std::string sys_error(const std::string& what) {
    return what + ": " + std::strerror(errno);
}

}  // namespace

// ---- commands ------------------------------------------------------------------------------

CmdResult run(const std::vector<std::string>& argv) {
    if (argv.empty()) throw Error("run: empty command");
    // Everything the child needs is prepared before fork: tests fork from threaded processes.
    std::vector<char*> cargv;
    for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
    cargv.push_back(nullptr);
    int p[2];
    if (pipe2(p, O_CLOEXEC) != 0) throw Error(sys_error("pipe"));
    pid_t pid = fork();
    if (pid < 0) {
        close(p[0]);
        close(p[1]);
        throw Error(sys_error("fork"));
    }
    if (pid == 0) {
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0) dup2(devnull, 0);
        dup2(p[1], 1);
        dup2(p[1], 2);
        execvp(cargv[0], cargv.data());
        _exit(127);
    }
    close(p[1]);
    CmdResult r;
    char buf[4096];
    for (;;) {
        ssize_t n = read(p[0], buf, sizeof buf);
        if (n > 0) r.out.append(buf, n);
        else if (n == 0 || errno != EINTR) break;
    }
    close(p[0]);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
    if (r.status == 127) throw Error("cannot run " + argv[0] + " (not installed?)");
    return r;
}

CmdResult run_in(const std::string& netns, const std::vector<std::string>& argv) {
    std::vector<std::string> full{"ip", "netns", "exec", netns};
    full.insert(full.end(), argv.begin(), argv.end());
    return run(full);
}

std::string must(const std::vector<std::string>& argv) {
    CmdResult r = run(argv);
    if (r.status != 0)
        throw Error("'" + join(argv) + "' failed (" + std::to_string(r.status) + "): " + r.out);
    return r.out;
}

std::string must_in(const std::string& netns, const std::vector<std::string>& argv) {
    std::vector<std::string> full{"ip", "netns", "exec", netns};
    full.insert(full.end(), argv.begin(), argv.end());
    return must(full);
}

// ---- NetnsGuard ----------------------------------------------------------------------------

NetnsGuard::NetnsGuard(const std::string& netns) {
    // thread-self: setns changes only this thread, so save this thread's namespace.
    saved_ = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    if (saved_ < 0) throw Error(sys_error("open /proc/thread-self/ns/net"));
    int fd = open(("/run/netns/" + netns).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        close(saved_);
        throw Error(sys_error("open /run/netns/" + netns));
    }
    int r = setns(fd, CLONE_NEWNET);
    int err = errno;
    close(fd);
    if (r != 0) {
        close(saved_);
        errno = err;
        throw Error(sys_error("setns " + netns));
    }
}

NetnsGuard::~NetnsGuard() {
    if (setns(saved_, CLONE_NEWNET) != 0)
        spdlog::critical("lab: cannot return to the original network namespace: {}",
                         std::strerror(errno));
    close(saved_);
}

// ---- Lab -----------------------------------------------------------------------------------

std::string Lab::client_if(int path) const { return prefix_ + "-c" + std::to_string(path); }
std::string Lab::server_if(int path) const { return prefix_ + "-s" + std::to_string(path); }
std::string Lab::client_addr(int path) { return "10.0." + std::to_string(path) + ".1"; }
std::string Lab::server_addr(int path) { return "10.0." + std::to_string(path) + ".2"; }
std::string Lab::client_addr6(int path) { return "fd00:" + std::to_string(path) + "::1"; }
std::string Lab::server_addr6(int path) { return "fd00:" + std::to_string(path) + "::2"; }

Lab::Lab(LabConfig cfg) : cfg_(std::move(cfg)) {
    if (cfg_.tag.empty()) cfg_.tag = "p" + std::to_string(getpid());
    prefix_ = kPrefix + cfg_.tag;
    if (client_if(2).size() > 15) throw Error("lab tag too long for interface names: " + cfg_.tag);
    cleanup(prefix_ + "-");
    try {
        build();
    } catch (...) {
        cleanup(prefix_ + "-");
        throw;
    }
}

Lab::~Lab() {
    try {
        cleanup(prefix_ + "-");
    } catch (const std::exception& e) {
        spdlog::error("lab: cleanup of {} failed: {}", prefix_, e.what());
    }
}

void Lab::build() {
    const std::string cli = client_ns(), srv = server_ns();
    for (const auto& ns : {cli, srv}) {
        must({"ip", "netns", "add", ns});
        must({"ip", "-n", ns, "link", "set", "lo", "up"});
        must_in(ns, {"sysctl", "-q", "-w", "net.mptcp.enabled=1"});
        // IPv6 addresses usable at once; no router solicitations cluttering captures.
        must_in(ns, {"sysctl", "-q", "-w", "net.ipv6.conf.all.accept_dad=0"});
        must_in(ns, {"sysctl", "-q", "-w", "net.ipv6.conf.default.accept_dad=0"});
    }
    for (int p = 1; p <= 2; p++) {
        // Both ends are created directly inside their namespaces: nothing ever sits in the
        // root namespace, so deleting the namespaces removes the pair.
        must({"ip", "link", "add", client_if(p), "netns", cli, "type", "veth", "peer", "name",
              server_if(p), "netns", srv});
        struct End { std::string ns, dev, v4, v6; };
        for (const End& e : {End{cli, client_if(p), client_addr(p), client_addr6(p)},
                             End{srv, server_if(p), server_addr(p), server_addr6(p)}}) {
            must({"ip", "-n", e.ns, "addr", "add", e.v4 + "/24", "dev", e.dev});
            if (cfg_.ipv6)
                must({"ip", "-n", e.ns, "addr", "add", e.v6 + "/64", "dev", e.dev, "nodad"});
            // A veth whose peer checksums nothing delivers complete checksums: a BPF program
            // that breaks a checksum is caught by the receiver instead of being trusted.
            must_in(e.ns, {"ethtool", "-K", e.dev, "tx", "off"});
            must({"ip", "-n", e.ns, "link", "set", e.dev, "up"});
        }
    }
    for (const auto& ns : {cli, srv})
        must({"ip", "-n", ns, "mptcp", "limits", "set", "subflow", "2", "add_addr_accepted",
              "2"});
    if (cfg_.signal)
        must({"ip", "-n", srv, "mptcp", "endpoint", "add", server_addr(2), "dev", server_if(2),
              "signal"});
    for (int p = 1; p <= 2; p++)
        if (cfg_.path[p - 1].delay_ms || cfg_.path[p - 1].rate_kbit) shape(p, cfg_.path[p - 1]);
    spdlog::debug("lab {}: up", prefix_);
}

void Lab::shape(int path, PathShape s) {
    if (path < 1 || path > 2) throw Error("lab: no path " + std::to_string(path));
    cfg_.path[path - 1] = s;
    for (const auto& [ns, dev] : {std::pair{client_ns(), client_if(path)},
                                  std::pair{server_ns(), server_if(path)}}) {
        if (!s.delay_ms && !s.rate_kbit) {
            run({"tc", "-n", ns, "qdisc", "del", "dev", dev, "root"});  // absent is fine
            continue;
        }
        // A deep queue: at a few hundred Mbit/s a 20 ms delay holds thousands of packets,
        // and netem's default limit of 1000 would drop them.
        std::vector<std::string> cmd{"tc", "-n", ns, "qdisc", "replace", "dev", dev, "root",
                                     "netem", "limit", "100000"};
        if (s.delay_ms) cmd.insert(cmd.end(), {"delay", std::to_string(s.delay_ms) + "ms"});
        if (s.rate_kbit) cmd.insert(cmd.end(), {"rate", std::to_string(s.rate_kbit) + "kbit"});
        must(cmd);
    }
}

std::string Lab::ss(const std::string& netns) const {
    return run({"ip", "netns", "exec", netns, "ss", "-tniM"}).out;
}

int Lab::cleanup(const std::string& prefix) {
    if (prefix.size() < 4 || prefix.rfind(kPrefix, 0) != 0)
        throw Error("lab: refusing to clean up names not starting with " +
                    std::string(kPrefix) + ": '" + prefix + "'");
    int removed = 0;
    std::error_code ec;
    for (const auto& ent : std::filesystem::directory_iterator("/run/netns", ec)) {
        std::string name = ent.path().filename();
        if (name.rfind(prefix, 0) != 0) continue;
        if (run({"ip", "netns", "del", name}).status == 0) removed++;
    }
    // Links left in the root namespace (a build interrupted between steps).
    std::istringstream links(run({"ip", "-o", "link", "show"}).out);
    for (std::string line; std::getline(links, line);) {
        auto a = line.find(": ");
        if (a == std::string::npos) continue;
        auto b = line.find_first_of(":@", a + 2);
        std::string name = line.substr(a + 2, b - a - 2);
        if (name.rfind(prefix, 0) == 0 && run({"ip", "link", "del", name}).status == 0)
            removed++;
    }
    if (removed) spdlog::debug("lab: removed {} namespaces/links named {}*", removed, prefix);
    return removed;
}

// ---- counters ------------------------------------------------------------------------------

LinkCounters link_counters(const std::string& netns, const std::string& ifname) {
    NetnsGuard in(netns);
    // thread-self/net follows this thread's namespace (/proc/net is the process leader's).
    std::ifstream f("/proc/thread-self/net/dev");
    for (std::string line; std::getline(f, line);) {
        auto colon = line.find(':');
        if (colon == std::string::npos) continue;
        auto start = line.find_first_not_of(' ');
        if (line.substr(start, colon - start) != ifname) continue;
        std::istringstream in_fields(line.substr(colon + 1));
        uint64_t v[10] = {};
        for (auto& x : v) in_fields >> x;
        // rx: bytes packets errs drop fifo frame compressed multicast; tx: bytes packets ...
        return LinkCounters{v[0], v[1], v[8], v[9]};
    }
    throw Error("lab: no interface " + ifname + " in " + netns);
}

}  // namespace mpsteer::lab
