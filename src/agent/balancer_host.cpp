// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
#include "agent/balancer_host.h"

#include <net/if.h>
#include <net/if_arp.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

#include <spdlog/spdlog.h>

#include "agent/status.h"
#include "datapath/datapath.h"
#include "net/fd.h"

namespace mpsteer::agent {

namespace fs = std::filesystem;

namespace {

// This host's MAC on an interface (in the agent's network namespace); nullopt when the
// interface does not exist or has no Ethernet address.
std::optional<lb::Mac> mac_of(const std::string& ifname) {
    net::Fd fd(socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
    if (!fd || ifname.size() >= IFNAMSIZ) return std::nullopt;
    ifreq r{};
    std::memcpy(r.ifr_name, ifname.c_str(), ifname.size());
    if (ioctl(fd.get(), SIOCGIFHWADDR, &r) || r.ifr_hwaddr.sa_family != ARPHRD_ETHER)
        return std::nullopt;
    lb::Mac m;
    std::memcpy(m.data(), r.ifr_hwaddr.sa_data, 6);
    return m;
}

std::string where(const manifest::Balancer& b) {
    return "balancer '" + b.name + "' (" + b.pos.file + ":" + std::to_string(b.pos.line) + ")";
}

}  // namespace

BalancerHost::BalancerHost(std::string pin_dir, std::string state_file)
    : pin_dir_(std::move(pin_dir)), state_file_(std::move(state_file)) {}

BalancerHost::~BalancerHost() {
    stop_learner();
    links_.clear();  // pinned: they keep running the balancer
}

void BalancerHost::detach() {
    stop_learner();
    for (auto& [name, link] : links_) link->detach();
    links_.clear();
    remove_pins(pin_dir_);
    std::error_code ec;
    fs::remove(state_file_, ec);
}

void BalancerHost::remove_pins(const std::string& pin_dir) {
    datapath::detach_pinned_links(pin_dir + "/links");
    std::error_code ec;
    fs::remove_all(pin_dir, ec);
}

std::unique_ptr<lb::Balancer> BalancerHost::load(const manifest::Balancer& spec) {
    lb::Sizes sizes;
    sizes.flows = spec.subflow_table;
    sizes.tokens = spec.token_table;
    std::map<std::string, uint32_t> indices;
    bool fits = false;  // what an earlier agent left, for the same sizes
    try {
        std::ifstream in(state_file_);
        const auto j = nlohmann::json::parse(in);
        fits = j.at("subflows") == spec.subflow_table && j.at("tokens") == spec.token_table;
        indices = j.at("backends").get<std::map<std::string, uint32_t>>();
    } catch (const std::exception&) {
        fits = false;
    }
    if (!fits) remove_pins(pin_dir_);
    auto b = std::make_unique<lb::Balancer>(sizes, pin_dir_);
    if (!b->reused()) return b;
    b->restore_backend_indices(std::move(indices));
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(pin_dir_ + "/links", ec)) {
        const std::string ifname = entry.path().filename().string();
        try {
            links_[ifname] =
                datapath::HookLink::adopt(entry.path().string(), ifname, datapath::Hook::xdp);
        } catch (const std::exception& e) {
            spdlog::warn("balancer: {}", e.what());
        }
    }
    spdlog::info("balancer '{}': took over the tables and {} interface(s) an earlier agent left",
                 spec.name, links_.size());
    return b;
}

void BalancerHost::record() const {
    nlohmann::json j = {{"subflows", spec_->subflow_table},
                        {"tokens", spec_->token_table},
                        {"backends", lb_->backend_indices()}};
    write_atomic(state_file_, j.dump() + "\n", 0600);
}

BalancerHost::Plan BalancerHost::prepare(const std::optional<manifest::Balancer>& spec) const {
    Plan p;
    p.spec = spec;
    if (!spec) return p;
    for (const auto& i : spec->interfaces)
        if (!if_nametoindex(i.c_str()))
            throw std::runtime_error(where(*spec) + ": interface '" + i +
                                     "' does not exist on this host");
    const auto unknown = spec->reset_unknown_tokens ? MPS_LB_UNKNOWN_RESET : MPS_LB_UNKNOWN_DROP;
    for (const auto& s : spec->services) {
        lb::Service svc;
        svc.family = s.vip.family;
        svc.addr = s.vip.bytes;
        svc.port = s.port;
        svc.unknown_token = unknown;
        p.services.push_back(svc);
    }
    for (const auto& b : spec->backends) {
        lb::Target t;
        t.backend = {b.name, b.weight, b.draining};
        t.mac = b.mac;
        t.ifindex = if_nametoindex(b.interface.c_str());
        auto own = mac_of(b.interface);
        if (!t.ifindex || !own)
            throw std::runtime_error(
                where(*spec) + ": backend '" + b.name + "': interface '" + b.interface + "' " +
                (t.ifindex ? "has no Ethernet address" : "does not exist on this host"));
        t.src_mac = *own;
        p.targets.push_back(std::move(t));
    }
    // What set_backends would refuse, refused here, before anything changes.
    std::vector<lb::Backend> backends;
    for (const auto& t : p.targets) backends.push_back(t.backend);
    try {
        lb::maglev_table(backends);
    } catch (const std::invalid_argument& e) {
        throw std::runtime_error(where(*spec) + ": " + e.what());
    }
    return p;
}

const std::vector<std::string>& BalancerHost::interfaces() const {
    static const std::vector<std::string> none;
    return spec_ ? spec_->interfaces : none;
}

void BalancerHost::commit(Plan plan) {
    if (!plan.spec) {
        if (lb_)
            spdlog::info("balancer '{}' removed: leaving {} interface(s)", spec_->name,
                         links_.size());
        detach();  // also what an earlier agent left pinned
        std::lock_guard lock(mu_);
        lb_.reset();
        spec_.reset();
        return;
    }
    const auto& spec = *plan.spec;
    const bool reload = !lb_ || spec_->subflow_table != spec.subflow_table ||
                        spec_->token_table != spec.token_table;
    std::unique_ptr<lb::Balancer> fresh;
    lb::Balancer* target = lb_.get();
    if (reload) {
        if (lb_) {
            spdlog::warn(
                "balancer '{}': new table sizes, so a new balancer; the subflows and "
                "tokens it followed are forgotten",
                spec.name);
            std::error_code ec;  // the running one keeps its maps by descriptor
            for (const auto& e : fs::directory_iterator(pin_dir_, ec))
                if (e.path().filename() != "links") fs::remove(e.path(), ec);
            fs::remove(state_file_, ec);
            fresh = std::make_unique<lb::Balancer>(
                lb::Sizes{spec.subflow_table, spec.token_table, lb::kDefaultTableSize}, pin_dir_);
        } else {
            fresh = load(spec);  // throws: nothing changed yet
        }
        target = fresh.get();
    }
    // A fresh balancer is filled before any interface runs it; a running one keeps serving:
    // services are added before stale ones go, backends switch with one table swap.
    {
        std::lock_guard lock(mu_);
        target->set_services(plan.services);
        target->set_backends(plan.targets);
    }
    // Interfaces: new ones attached, running ones moved to a fresh balancer; undone on failure.
    std::vector<std::string> added;
    std::vector<std::pair<std::string, datapath::Fd>> moved;  // and what each ran before
    try {
        for (const auto& i : spec.interfaces) {
            if (auto it = links_.find(i); it != links_.end()) {
                if (fresh && !it->second->runs(fresh->prog_fd())) {
                    auto before = it->second->program();
                    it->second->update(fresh->prog_fd(), false);
                    moved.emplace_back(i, std::move(before));
                }
                continue;
            }
            auto link = datapath::HookLink::attach(i, datapath::Hook::xdp, target->prog_fd());
            fs::create_directories(pin_dir_ + "/links");
            link->pin(link_pin(i));
            links_[i] = std::move(link);
            added.push_back(i);
            spdlog::info("balancer '{}' attached to {} ({})", spec.name, i, links_[i]->mode());
        }
    } catch (const std::exception& e) {
        for (const auto& [i, before] : moved) try {
                links_[i]->update(before.get(), false);
            } catch (const std::exception& e2) {
                spdlog::error("balancer: putting {} back: {}", i, e2.what());
            }
        for (const auto& i : added) {
            links_[i]->detach();
            links_.erase(i);
        }
        if (lb_ && !fresh) try {  // the running balancer's services and backends as they were
                auto was = prepare(spec_);
                std::lock_guard lock(mu_);
                lb_->set_services(was.services);
                lb_->set_backends(was.targets);
            } catch (const std::exception& e2) {
                spdlog::error("balancer: putting its services and backends back: {}", e2.what());
            }
        throw std::runtime_error("balancer '" + spec.name + "': " + e.what());
    }
    for (auto it = links_.begin(); it != links_.end();) {
        if (std::binary_search(spec.interfaces.begin(), spec.interfaces.end(), it->first)) {
            ++it;
            continue;
        }
        spdlog::info("balancer '{}' left {}", spec.name, it->first);
        it->second->detach();
        it = links_.erase(it);
    }
    if (fresh) {
        stop_learner();
        {
            std::lock_guard lock(mu_);
            lb_ = std::move(fresh);
        }
        start_learner();
    }
    spec_ = std::move(plan.spec);
    try {
        record();
    } catch (const std::exception& e) {  // the balancer runs; the next agent starts afresh
        spdlog::warn("balancer: recording its backends: {}", e.what());
    }
}

void BalancerHost::start_learner() {
    stop_ = false;
    learner_ = std::thread([this] {
        lb::Balancer* lb = lb_.get();  // replaced only while this thread is stopped
        while (!stop_) {
            try {
                learnt_ += lb->learn(std::chrono::milliseconds(100));
            } catch (const std::exception& e) {
                {
                    std::lock_guard lock(mu_);
                    if (learn_error_ != e.what()) spdlog::error("balancer: {}", e.what());
                    learn_error_ = e.what();
                }
                std::this_thread::sleep_for(std::chrono::seconds(1));
            }
        }
    });
}

void BalancerHost::stop_learner() {
    stop_ = true;
    if (learner_.joinable()) learner_.join();
}

nlohmann::json BalancerHost::status() const {
    if (!lb_) return nullptr;
    std::lock_guard lock(mu_);
    nlohmann::json ifs = nlohmann::json::array();
    for (const auto& [name, link] : links_)
        ifs.push_back({{"interface", name}, {"mode", link->mode()}});
    nlohmann::json services = nlohmann::json::array();
    for (const auto& s : spec_->services)
        services.push_back({{"vip", manifest::to_string(s.vip)}, {"port", s.port}});
    nlohmann::json backends = nlohmann::json::array();
    for (const auto& b : spec_->backends)
        backends.push_back({{"name", b.name},
                            {"interface", b.interface},
                            {"weight", b.weight},
                            {"draining", b.draining},
                            {"index", lb_->index_of(b.name)}});
    nlohmann::json counters = nlohmann::json::object();
    try {
        const auto c = lb_->counters();
        for (uint32_t i = 0; i < c.size(); ++i) counters[lb::counter_name(i)] = c[i];
    } catch (const std::exception& e) {
        counters = {{"error", e.what()}};
    }
    nlohmann::json s = {
        {"name", spec_->name},
        {"interfaces", ifs},
        {"services", services},
        {"backends", backends},
        {"unknown_token", spec_->reset_unknown_tokens ? "reset" : "drop"},
        {"tables", {{"subflows", spec_->subflow_table}, {"tokens", spec_->token_table}}},
        {"tokens_learnt", learnt_.load()},
        {"counters", counters}};
    if (!learn_error_.empty()) s["learn_error"] = learn_error_;
    return s;
}

}  // namespace mpsteer::agent
