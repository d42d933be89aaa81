// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The namespace lab: commands, namespace switching, building and removing the two-namespace
// MPTCP test bed, interface counters.
#include "lab/lab.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
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
    net::Fd read_end(p[0]), write_end(p[1]);
    pid_t pid = fork();
    if (pid < 0) throw Error(sys_error("fork"));
    if (pid == 0) {
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0) dup2(devnull, 0);
        dup2(write_end.get(), 1);
        dup2(write_end.get(), 2);
        execvp(cargv[0], cargv.data());
        _exit(127);
    }
    write_end.reset();  // else the read below never sees EOF
    CmdResult r;
    char buf[4096];
    for (;;) {
        ssize_t n = read(read_end.get(), buf, sizeof buf);
        if (n > 0)
            r.out.append(buf, n);
        else if (n == 0 || errno != EINTR)
            break;
    }
    read_end.reset();  // before waiting: a child still writing must not block on a full pipe
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
    saved_.reset(open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC));
    if (!saved_) throw Error(sys_error("open /proc/thread-self/ns/net"));
    net::Fd fd(open(("/run/netns/" + netns).c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) throw Error(sys_error("open /run/netns/" + netns));
    int r = setns(fd.get(), CLONE_NEWNET);
    int err = errno;
    fd.reset();
    if (r != 0) {
        errno = err;
        throw Error(sys_error("setns " + netns));
    }
}

NetnsGuard::~NetnsGuard() {
    if (setns(saved_.get(), CLONE_NEWNET) != 0)
        spdlog::critical("lab: cannot return to the original network namespace: {}",
                         std::strerror(errno));
}

// ---- Lab -----------------------------------------------------------------------------------

std::string Lab::client_if(int path) const {
    return prefix_ + "-c" + std::to_string(path);
}
std::string Lab::server_if(int path) const {
    return prefix_ + "-s" + std::to_string(path);
}
std::string Lab::client_addr(int path) {
    return "10.0." + std::to_string(path) + ".1";
}
std::array<uint64_t, 2> Lab::client_received_per_path(uint16_t server_port) const {
    std::array<uint64_t, 2> got{0, 0};
    for (const auto& sf : tcp_subflows(client_ns()))
        for (int path = 1; path <= 2; path++)
            if (sf.remote == server_addr(path) + ":" + std::to_string(server_port))
                got[path - 1] += sf.bytes_received;
    return got;
}

std::string Lab::server_addr(int path) {
    return "10.0." + std::to_string(path) + ".2";
}
std::string Lab::client_addr6(int path) {
    return "fd00:" + std::to_string(path) + "::1";
}
std::string Lab::server_addr6(int path) {
    return "fd00:" + std::to_string(path) + "::2";
}

namespace {
const char* kPidDir = "/run/mpsteer-lab";
std::string pid_file(const std::string& prefix) {
    return std::string(kPidDir) + "/" + prefix;
}
}  // namespace

Lab::Lab(LabConfig cfg) : cfg_(std::move(cfg)) {
    if (cfg_.tag.empty()) cfg_.tag = "p" + std::to_string(getpid() % 1000000);
    prefix_ = kPrefix + cfg_.tag;
    if ((prefix_ + "-dc2").size() > 15)
        throw Error("lab tag too long for interface names: " + cfg_.tag);
    require_tools();
    cleanup_stale();
    cleanup(prefix_ + "-");
    claim(prefix_);
    try {
        build();
    } catch (...) {
        for (auto& d : delay_) d.reset();
        cleanup(prefix_ + "-");
        release(prefix_);
        throw;
    }
}

void Lab::claim(const std::string& prefix) {
    // Written before anything exists, so cleanup_stale() in another process never takes a
    // lab under construction for a leftover.
    std::filesystem::create_directories(kPidDir);
    std::ofstream(pid_file(prefix)) << getpid() << "\n";
}

void Lab::release(const std::string& prefix) {
    std::error_code ec;
    std::filesystem::remove(pid_file(prefix), ec);
}

Lab::~Lab() {
    for (auto& d : delay_) d.reset();
    try {
        cleanup(prefix_ + "-");
    } catch (const std::exception& e) {
        spdlog::error("lab: cleanup of {} failed: {}", prefix_, e.what());
    }
    release(prefix_);
}

void Lab::build() {
    const std::string cli = client_ns(), srv = server_ns(), dly = delay_ns();
    const bool delayed[2] = {cfg_.path[0].delay_ms > 0, cfg_.path[1].delay_ms > 0};
    std::vector<std::string> namespaces{cli, srv};
    if (delayed[0] || delayed[1]) namespaces.push_back(dly);
    for (const auto& ns : namespaces) {
        must({"ip", "netns", "add", ns});
        must({"ip", "-n", ns, "link", "set", "lo", "up"});
        must_in(ns, {"sysctl", "-q", "-w", "net.mptcp.enabled=1"});
        // IPv6 addresses usable at once; no router solicitations cluttering captures.
        must_in(ns, {"sysctl", "-q", "-w", "net.ipv6.conf.all.accept_dad=0"});
        must_in(ns, {"sysctl", "-q", "-w", "net.ipv6.conf.default.accept_dad=0"});
    }
    auto bring_up = [&](const std::string& ns, const std::string& dev) {
        set_offloads(ns, dev, cfg_.offloads);
        must({"ip", "-n", ns, "link", "set", dev, "up"});
    };
    for (int p = 1; p <= 2; p++) {
        const std::string c = client_if(p), s = server_if(p);
        // Every end is created directly inside its namespace: nothing ever sits in the root
        // namespace, so deleting the namespaces removes the pairs.
        if (delayed[p - 1]) {
            const std::string dc = prefix_ + "-dc" + std::to_string(p);
            const std::string ds = prefix_ + "-ds" + std::to_string(p);
            must({"ip", "link", "add", c, "netns", cli, "type", "veth", "peer", "name", dc, "netns",
                  dly});
            must({"ip", "link", "add", ds, "netns", dly, "type", "veth", "peer", "name", s, "netns",
                  srv});
            bring_up(dly, dc);
            bring_up(dly, ds);
        } else {
            must({"ip", "link", "add", c, "netns", cli, "type", "veth", "peer", "name", s, "netns",
                  srv});
        }
        struct End {
            std::string ns, dev, v4, v6;
        };
        for (const End& e : {End{cli, c, client_addr(p), client_addr6(p)},
                             End{srv, s, server_addr(p), server_addr6(p)}}) {
            must({"ip", "-n", e.ns, "addr", "add", e.v4 + "/24", "dev", e.dev});
            if (cfg_.ipv6)
                must({"ip", "-n", e.ns, "addr", "add", e.v6 + "/64", "dev", e.dev, "nodad"});
            bring_up(e.ns, e.dev);
        }
    }
    for (const auto& ns : {cli, srv})
        must({"ip", "-n", ns, "mptcp", "limits", "set", "subflow", "2", "add_addr_accepted", "2"});
    if (cfg_.signal)
        must({"ip", "-n", srv, "mptcp", "endpoint", "add", server_addr(2), "dev", server_if(2),
              "signal"});
    for (int p = 1; p <= 2; p++) {
        if (delayed[p - 1])
            delay_[p - 1] = std::make_unique<DelayLine>(
                dly, prefix_ + "-dc" + std::to_string(p), prefix_ + "-ds" + std::to_string(p),
                std::chrono::milliseconds(cfg_.path[p - 1].delay_ms));
        if (cfg_.path[p - 1].rate_kbit) set_rate(p, cfg_.path[p - 1].rate_kbit);
    }
    spdlog::debug("lab {}: up", prefix_);
}

void Lab::shape(int path, PathShape s) {
    if (path < 1 || path > 2) throw Error("lab: no path " + std::to_string(path));
    auto& d = delay_[path - 1];
    if (s.delay_ms && !d)
        throw Error("lab: path " + std::to_string(path) + " was built without a delay line");
    if (d) d->set_delay(std::chrono::milliseconds(s.delay_ms));
    set_rate(path, s.rate_kbit);
    cfg_.path[path - 1] = s;
}

void Lab::blackhole(int path, bool on) {
    if (path < 1 || path > 2) throw Error("lab: no path " + std::to_string(path));
    if (!delay_[path - 1])
        throw Error("lab: path " + std::to_string(path) + " was built without a delay line");
    delay_[path - 1]->set_blackhole(on);
}

void Lab::set_rate(int path, unsigned rate_kbit) {
    shape_egress(client_ns(), client_if(path), rate_kbit);
    shape_egress(server_ns(), server_if(path), rate_kbit);
}

void shape_egress(const std::string& netns, const std::string& dev, unsigned rate_kbit) {
    if (!rate_kbit) {
        run({"tc", "-n", netns, "qdisc", "del", "dev", dev, "root"});  // absent is fine
        return;
    }
    // 10 ms of burst, at least two frames.
    unsigned burst = std::max(3100u, rate_kbit * 1000 / 8 / 100);
    must({"tc", "-n", netns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate",
          std::to_string(rate_kbit) + "kbit", "burst", std::to_string(burst), "latency", "200ms"});
}

const char* to_string(Offloads o) {
    return o == Offloads::host ? "host" : "strict";
}

void set_offloads(const std::string& netns, const std::string& dev, Offloads o) {
    // Explicit either way: a veth's defaults (GRO off, the rest on) are not a host's.
    if (o == Offloads::strict)
        must_in(netns, {"ethtool", "-K", dev, "rx", "off", "tx", "off", "tso", "off", "gso", "off",
                        "gro", "off"});
    else
        must_in(netns, {"ethtool", "-K", dev, "rx", "on", "tx", "on", "tso", "on", "gso", "on",
                        "gro", "on"});
}

void veth_pair(const VethEnd& a, const VethEnd& b, Offloads o) {
    must({"ip", "link", "add", a.dev, "netns", a.ns, "type", "veth", "peer", "name", b.dev, "netns",
          b.ns});
    for (const VethEnd& e : {a, b}) {
        must({"ip", "-n", e.ns, "addr", "add", e.v4, "dev", e.dev});
        if (!e.v6.empty()) must({"ip", "-n", e.ns, "addr", "add", e.v6, "dev", e.dev, "nodad"});
        set_offloads(e.ns, e.dev, o);
        must({"ip", "-n", e.ns, "link", "set", e.dev, "up"});
    }
}

std::string Lab::ss(const std::string& netns) const {
    return run({"ip", "netns", "exec", netns, "ss", "-tniM"}).out;
}

void Lab::require_tools() {
    static const std::pair<const char*, const char*> kTools[] = {{"ip", "iproute2"},
                                                                 {"tc", "iproute2"},
                                                                 {"ss", "iproute2"},
                                                                 {"sysctl", "procps"},
                                                                 {"ethtool", "ethtool"}};
    const char* path = std::getenv("PATH");
    std::vector<std::string> dirs;
    std::istringstream in(path && *path ? path : "/bin:/usr/bin");  // execvp's default
    for (std::string d; std::getline(in, d, ':');)
        if (!d.empty()) dirs.push_back(d);
    std::string missing;
    std::set<std::string> packages;
    for (auto [tool, package] : kTools) {
        bool found = std::any_of(dirs.begin(), dirs.end(), [&](const std::string& d) {
            return access((d + "/" + tool).c_str(), X_OK) == 0;
        });
        if (found) continue;
        missing += std::string(missing.empty() ? "" : ", ") + tool + " (package " + package + ")";
        packages.insert(package);
    }
    if (missing.empty()) return;
    std::string install = "apt-get install";
    for (const auto& p : packages) install += " " + p;
    throw Error("the lab runs commands that are not installed here: " + missing +
                "; install them with `" + install + "`");
}

int Lab::cleanup_stale() {
    // Only labs this code made: each has an owner file, written before its namespaces exist.
    // Anything else named mps-* (other tools' namespaces) is not ours to remove.
    int removed = 0;
    std::error_code ec;
    for (const auto& ent : std::filesystem::directory_iterator(kPidDir, ec)) {
        std::string prefix = ent.path().filename();
        if (prefix.rfind(kPrefix, 0) != 0) continue;
        pid_t owner = 0;
        std::ifstream(ent.path()) >> owner;
        if (owner > 0 && (kill(owner, 0) == 0 || errno != ESRCH)) continue;  // alive
        spdlog::info("lab: removing leftovers of {} (pid {} is gone)", prefix, owner);
        removed += cleanup(prefix + "-");
        std::filesystem::remove(ent.path(), ec);
    }
    return removed;
}

int Lab::cleanup(const std::string& prefix) {
    if (prefix.size() < 4 || prefix.rfind(kPrefix, 0) != 0)
        throw Error("lab: refusing to clean up names not starting with " + std::string(kPrefix) +
                    ": '" + prefix + "'");
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
        if (name.rfind(prefix, 0) == 0 && run({"ip", "link", "del", name}).status == 0) removed++;
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

namespace {

// One group of a MIB file under /proc/thread-self/net read inside `netns`: two lines per
// group, "Group: Name1 Name2 ..." then "Group: 1 2 ...".
std::optional<std::map<std::string, uint64_t>> mib_group(const std::string& netns, const char* file,
                                                         const std::string& group) {
    NetnsGuard in(netns);
    std::ifstream f(std::string("/proc/thread-self/net/") + file);
    const std::string head = group + ":";
    std::vector<std::string> names;
    for (std::string line; std::getline(f, line);) {
        if (line.rfind(head, 0) != 0) continue;
        std::istringstream words(line.substr(head.size()));
        if (names.empty()) {
            for (std::string w; words >> w;) names.push_back(w);
            continue;
        }
        std::map<std::string, uint64_t> out;
        int64_t v = 0;  // Tcp's MaxConn is -1
        for (size_t i = 0; i < names.size() && words >> v; i++) out[names[i]] = uint64_t(v);
        return out;
    }
    return std::nullopt;
}

}  // namespace

std::map<std::string, uint64_t> mptcp_counters(const std::string& netns) {
    if (auto m = mib_group(netns, "netstat", "MPTcpExt")) return *m;
    throw Error("lab: no MPTcpExt counters in " + netns + " (kernel without MPTCP?)");
}

std::map<std::string, uint64_t> tcp_counters(const std::string& netns) {
    if (auto m = mib_group(netns, "snmp", "Tcp")) return *m;
    throw Error("lab: no Tcp counters in " + netns);
}

}  // namespace mpsteer::lab
