// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// net::MptcpPathManager against the kernel: endpoints added, listed (as `ip mptcp endpoint`
// lists them), renewed and removed in a throw-away namespace; the errors it reports; and a
// renew re-opening the subflow of a live connection between the lab's two namespaces.
#include <catch2/catch.hpp>

#include <linux/mptcp.h>
#include <net/if.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <thread>

#include <nlohmann/json.hpp>

#include "lab/lab.h"
#include "net/mptcp_pm.h"

using namespace mpsteer::lab;
using mpsteer::net::MptcpEndpoint;
using mpsteer::net::MptcpPathManager;
using mpsteer::net::NetlinkError;
using namespace std::chrono_literals;

namespace {

// A throw-away network namespace, deleted by name when the test ends, however it ends.
class ScratchNetns {
public:
    static constexpr const char* kPrefix = "mps-pmtest-";

    ScratchNetns() : name_(kPrefix + std::to_string(getpid())) {
        remove_orphans();
        run({"ip", "netns", "del", name_});  // this pid's, left by an earlier crash
        must({"ip", "netns", "add", name_});
    }
    ~ScratchNetns() {
        try {
            run({"ip", "netns", "del", name_});
        } catch (const std::exception&) {}
    }
    ScratchNetns(const ScratchNetns&) = delete;
    ScratchNetns& operator=(const ScratchNetns&) = delete;
    const std::string& name() const { return name_; }

private:
    // Namespaces of test processes that are gone (the name ends in their pid). Those of running
    // ones, other cases of this file under `ctest -j`, are left alone.
    static void remove_orphans() {
        std::error_code ec;
        for (const auto& ent : std::filesystem::directory_iterator("/run/netns", ec)) {
            const std::string name = ent.path().filename();
            if (name.rfind(kPrefix, 0) != 0) continue;
            pid_t owner = std::atoi(name.c_str() + std::strlen(kPrefix));
            if (owner > 0 && kill(owner, 0) != 0 && errno == ESRCH)
                run({"ip", "netns", "del", name});
        }
    }
    std::string name_;
};

MptcpPathManager path_manager_in(const std::string& netns) {
    NetnsGuard in(netns);  // the manager's socket stays in `netns`
    return MptcpPathManager();
}

int ifindex_in(const std::string& netns, const std::string& dev) {
    NetnsGuard in(netns);
    int index = int(if_nametoindex(dev.c_str()));
    if (!index) throw Error("no interface " + dev + " in " + netns);
    return index;
}

// The endpoints as `ip mptcp endpoint show` lists them: the reference the manager must match.
std::vector<MptcpEndpoint> endpoints_per_ip(const std::string& netns) {
    auto listed =
        nlohmann::json::parse(must({"ip", "-n", netns, "-j", "mptcp", "endpoint", "show"}));
    static const std::pair<const char*, uint32_t> kFlags[] = {
        {"signal", MPTCP_PM_ADDR_FLAG_SIGNAL},     {"subflow", MPTCP_PM_ADDR_FLAG_SUBFLOW},
        {"backup", MPTCP_PM_ADDR_FLAG_BACKUP},     {"fullmesh", MPTCP_PM_ADDR_FLAG_FULLMESH},
        {"implicit", MPTCP_PM_ADDR_FLAG_IMPLICIT},
    };
    std::vector<MptcpEndpoint> out;
    for (const auto& j : listed) {
        MptcpEndpoint e;
        e.id = j.at("id").get<uint8_t>();
        e.address = j.at("address").get<std::string>();
        e.port = j.value("port", uint16_t(0));
        for (auto [name, bit] : kFlags)
            if (j.value(name, false)) e.flags |= bit;
        if (j.contains("dev")) e.ifindex = ifindex_in(netns, j.at("dev").get<std::string>());
        out.push_back(e);
    }
    return out;
}

const MptcpEndpoint* find_id(const std::vector<MptcpEndpoint>& endpoints, uint8_t id) {
    for (const auto& e : endpoints)
        if (e.id == id) return &e;
    return nullptr;
}

// `f` must throw a NetlinkError carrying `error`, its message containing `text`. Returns the
// message.
std::string check_netlink_error(const std::function<void()>& f, int error,
                                const std::string& text) {
    try {
        f();
    } catch (const NetlinkError& e) {
        INFO(e.what());
        CHECK(e.error == error);
        CHECK_THAT(e.what(), Catch::Contains(text));
        return e.what();
    }
    FAIL("no NetlinkError; expected one with " << std::strerror(error) << " and '" << text << "'");
    return {};
}

// Polls `done` every 50 ms until it holds or `timeout` passes; `between` runs before each poll.
bool wait_until(const std::function<bool()>& done, std::chrono::milliseconds timeout,
                const std::function<void()>& between = {}) {
    for (auto end = std::chrono::steady_clock::now() + timeout;;) {
        if (between) between();
        if (done()) return true;
        if (std::chrono::steady_clock::now() > end) return false;
        std::this_thread::sleep_for(50ms);
    }
}

// A namespace with one interface carrying 10.9.0.1/24, 10.9.0.2/24 and fd09::1/64. A veth
// pair, as this kernel has no dummy driver; the endpoints only need the addresses to exist.
void add_test_interface(const std::string& netns) {
    must({"ip", "-n", netns, "link", "add", "pm0", "type", "veth", "peer", "name", "pm1"});
    must({"ip", "-n", netns, "addr", "add", "10.9.0.1/24", "dev", "pm0"});
    must({"ip", "-n", netns, "addr", "add", "10.9.0.2/24", "dev", "pm0"});
    must({"ip", "-n", netns, "addr", "add", "fd09::1/64", "dev", "pm0", "nodad"});
    must({"ip", "-n", netns, "link", "set", "pm0", "up"});
}

}  // namespace

TEST_CASE("mptcp_pm: endpoints added, listed, renewed and removed", "[e2e][mptcp_pm]") {
    ScratchNetns ns;
    add_test_interface(ns.name());
    const int pm0 = ifindex_in(ns.name(), "pm0");
    MptcpPathManager pm = path_manager_in(ns.name());
    CHECK(pm.endpoints().empty());

    const MptcpEndpoint v4{3, "10.9.0.1", pm0, MPTCP_PM_ADDR_FLAG_SUBFLOW, 0};
    const MptcpEndpoint v6{7, "fd09::1", pm0, MPTCP_PM_ADDR_FLAG_SIGNAL | MPTCP_PM_ADDR_FLAG_BACKUP,
                           0};
    // id 0: the kernel picks one. A port makes the kernel listen on it (signal endpoints only).
    const MptcpEndpoint with_port{0, "10.9.0.2", 0, MPTCP_PM_ADDR_FLAG_SIGNAL, 8443};
    pm.add(v4);
    pm.add(v6);
    pm.add(with_port);

    const auto listed = pm.endpoints();
    std::string listed_text;
    for (const auto& e : listed) listed_text += to_string(e) + "; ";
    INFO("listed: " << listed_text);
    REQUIRE(listed.size() == 3);
    CHECK(listed[0] == v4);  // ordered by id
    CHECK(listed[1] == v6);
    const MptcpEndpoint picked = listed[2];
    CHECK(picked.id > 7);  // the kernel counts on from the highest id it has
    CHECK(picked.address == with_port.address);
    CHECK(picked.port == with_port.port);
    CHECK(picked.flags == with_port.flags);
    CHECK(picked.ifindex == 0);
    CHECK(listed == endpoints_per_ip(ns.name()));

    // Each comes back with the same id, flags, interface and port; any spelling of the address.
    CHECK(pm.renew("10.9.0.1"));
    CHECK(pm.renew("fd09:0:0::1"));
    CHECK(pm.renew("10.9.0.2"));
    const auto renewed = pm.endpoints();
    CHECK(renewed == listed);
    CHECK(renewed == endpoints_per_ip(ns.name()));

    pm.remove(v4.id);
    const auto after_remove = pm.endpoints();
    CHECK(find_id(after_remove, v4.id) == nullptr);
    CHECK(after_remove.size() == 2);
    pm.remove(v6.id);
    pm.remove(picked.id);
    CHECK(pm.endpoints().empty());
    CHECK(endpoints_per_ip(ns.name()).empty());
}

TEST_CASE("mptcp_pm: errors name the operation, the endpoint and the kernel's reason",
          "[e2e][mptcp_pm]") {
    ScratchNetns ns;
    add_test_interface(ns.name());
    MptcpPathManager pm = path_manager_in(ns.name());
    const MptcpEndpoint first{5, "10.9.0.1", 0, MPTCP_PM_ADDR_FLAG_SUBFLOW, 0};
    pm.add(first);

    const MptcpEndpoint same_id{5, "10.9.0.2", 0, MPTCP_PM_ADDR_FLAG_SUBFLOW, 0};
    check_netlink_error(
        [&] { pm.add(same_id); }, EBUSY,
        std::string("mptcp_pm: add endpoint id 5 10.9.0.2 subflow: ") + std::strerror(EBUSY));
    const MptcpEndpoint same_address{0, "10.9.0.1", 0, MPTCP_PM_ADDR_FLAG_SIGNAL, 0};
    check_netlink_error([&] { pm.add(same_address); }, EEXIST,
                        "mptcp_pm: add endpoint 10.9.0.1 signal: ");
    // Only signal endpoints take a port: the kernel's own words come with its errno (extended
    // ACK).
    const MptcpEndpoint subflow_with_port{0, "10.9.0.2", 0, MPTCP_PM_ADDR_FLAG_SUBFLOW, 8080};
    check_netlink_error(
        [&] { pm.add(subflow_with_port); }, EINVAL,
        "mptcp_pm: add endpoint 10.9.0.2 port 8080 subflow: Invalid argument (kernel: ");
    check_netlink_error([&] { pm.remove(42); }, EINVAL, "mptcp_pm: remove endpoint id 42: ");
    check_netlink_error([&] { pm.remove(0); }, EINVAL, "mptcp_pm: remove endpoint id 0: ");
    const MptcpEndpoint bad_address{0, "10.9.0", 0, 0, 0};
    check_netlink_error([&] { pm.add(bad_address); }, EINVAL,
                        "not an IPv4 or IPv6 address: '10.9.0'");
    check_netlink_error([&] { pm.renew("not-an-address"); }, EINVAL,
                        "mptcp_pm: renew not-an-address: not an IPv4 or IPv6 address");

    CHECK_FALSE(pm.renew("10.9.0.99"));
    CHECK_FALSE(pm.renew("fd09::99"));

    // Nothing of the above changed the endpoints.
    const auto listed = pm.endpoints();
    REQUIRE(listed.size() == 1);
    CHECK(listed[0] == first);

    // The family resolver: a family the kernel lacks, and the one this module uses.
    mpsteer::net::Fd fd;
    {
        NetnsGuard in(ns.name());
        fd = mpsteer::net::open_genl_socket();
    }
    check_netlink_error([&] { mpsteer::net::resolve_genl_family(fd.get(), "mps_no_family"); },
                        ENOENT, "generic netlink family mps_no_family: ");
    const auto family = mpsteer::net::resolve_mptcp_pm_family(fd.get());
    CHECK(family.id != 0);
    CHECK(family.multicast_groups.count(MPTCP_PM_EV_GRP_NAME) == 1);
}

TEST_CASE("mptcp_pm: renewing a subflow endpoint re-opens the subflow of a live connection",
          "[e2e][mptcp_pm]") {
    Lab::cleanup_stale();
    LabConfig cfg;
    cfg.tag = "pm" + std::to_string(getpid() % 100000);
    cfg.signal = false;  // the client's subflow endpoint alone makes the join
    cfg.ipv6 = false;
    Lab lab(cfg);
    const uint16_t port = 5301;
    const std::string server = Lab::server_addr(1) + ":" + std::to_string(port);
    const std::string local2 = Lab::client_addr(2);

    Discard sink(lab.server_ns(), port, false);
    MptcpPathManager pm = path_manager_in(lab.client_ns());
    // Bound to path 2's interface, so the join to the server's path-1 address takes path 2.
    pm.add(
        {0, local2, ifindex_in(lab.client_ns(), lab.client_if(2)), MPTCP_PM_ADDR_FLAG_SUBFLOW, 0});
    const auto before_renew = pm.endpoints();
    REQUIRE(before_renew.size() == 1);
    MptcpMonitor monitor(lab.client_ns());
    ConnectionSet conns(lab.client_ns(), Lab::server_addr(1), port, 1);

    std::vector<MptcpEvent> events;
    auto keep_going = [&] {
        conns.send_each(1000);  // data, so both ends are fully established and stay so
        for (auto& ev : monitor.poll(0ms)) events.push_back(ev);
    };
    // The established subflows from the path-2 address: "10.0.2.1%<dev>:<port>" (ss names
    // the interface a socket is bound to, as the endpoint's subflows are).
    auto joins = [&] {
        std::vector<std::string> out;
        for (const auto& sf : tcp_subflows(lab.client_ns()))
            if (sf.remote == server &&
                (sf.local.rfind(local2 + ":", 0) == 0 || sf.local.rfind(local2 + "%", 0) == 0))
                out.push_back(sf.local);
        return out;
    };

    auto report = [&] {
        std::string text = "client events:\n";
        for (const auto& ev : events) text += "  " + to_string(ev) + "\n";
        return text + "client sockets:\n" + lab.ss(lab.client_ns());
    };
    {
        const bool joined = wait_until([&] { return joins().size() == 1; }, 10s, keep_going);
        INFO(report());
        REQUIRE(joined);
    }
    const std::string first_join = joins().at(0);
    CHECK(conns.states().at(0).subflows == 1);

    REQUIRE(pm.renew(local2));
    const bool rejoined = wait_until(
        [&] {
            auto now = joins();
            return now.size() == 1 && now[0] != first_join;
        },
        10s, keep_going);
    INFO(report());
    REQUIRE(rejoined);
    CHECK(pm.endpoints() == before_renew);

    const auto state = conns.states().at(0);
    CHECK(state.subflows == 1);
    CHECK_FALSE(state.fallback);
    CHECK_FALSE(state.closed);
    CHECK(state.error == 0);

    // The kernel's account: the old join closed, a new one from the same address came up.
    const std::string second_join = joins().at(0);
    auto port_of = [](const std::string& local) {
        return uint16_t(std::stoi(local.substr(local.rfind(':') + 1)));
    };
    auto count = [&](uint32_t type, uint16_t sport) {
        return std::count_if(events.begin(), events.end(), [&](const MptcpEvent& ev) {
            return ev.type == type && ev.saddr == local2 && ev.sport == sport;
        });
    };
    wait_until([&] { return count(MPTCP_EVENT_SUB_CLOSED, port_of(first_join)) > 0; }, 2s,
               keep_going);
    CHECK(count(MPTCP_EVENT_SUB_ESTABLISHED, port_of(first_join)) == 1);
    CHECK(count(MPTCP_EVENT_SUB_CLOSED, port_of(first_join)) == 1);
    CHECK(count(MPTCP_EVENT_SUB_ESTABLISHED, port_of(second_join)) == 1);
}
