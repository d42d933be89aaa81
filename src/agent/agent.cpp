// The reconcile loop. One thread owns everything below but the Lua hooks; the metrics server
// only reads a rendered text under a mutex. The hooks (their Lua states and DatapathBackend)
// belong to the event thread (lua/event_thread.h): datapath events and on_tick run there, and
// this thread reaches them only through EventThread::call() (configure, status), so an event
// never waits for an apply, a status write or the event log.
#include "agent/agent.h"

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <fcntl.h>
#include <sched.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

#include "compile/compile.h"
#include "datapath/datapath.h"
#include "datapath/frames.h"
#include "lua/datapath_backend.h"
#include "lua/event_thread.h"
#include "manifest/manifest.h"

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace mpsteer::agent {
namespace {
using datapath::Generation;
using datapath::Hook;
using datapath::HookLink;

struct LinkKey {
    std::string ifname;
    Hook hook;
    auto operator<=>(const LinkKey&) const = default;
    std::string pin_name() const { return ifname + "@" + std::string(datapath::to_string(hook)); }
};

struct PolicyCounters {
    uint64_t selected = 0, applied = 0, drops = 0, missed_tail_calls = 0;
    PolicyCounters& operator+=(const PolicyCounters& o) {
        selected += o.selected, applied += o.applied, drops += o.drops;
        missed_tail_calls += o.missed_tail_calls;
        return *this;
    }
};

std::string now_iso() {
    auto t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
    char buf[32];
    std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
    return buf;
}

void write_atomic(const std::string& path, const std::string& text) {
    fs::create_directories(fs::path(path).parent_path());
    std::string tmp = path + ".tmp";
    {
        std::ofstream out(tmp, std::ios::trunc);
        out << text;
        if (!out) throw std::runtime_error("writing " + tmp);
    }
    fs::rename(tmp, path);
}

std::set<std::string> present_interfaces() {
    std::set<std::string> out;
    if (auto* list = if_nameindex()) {
        for (auto* i = list; i->if_index; ++i) out.insert(i->if_name);
        if_freenameindex(list);
    }
    return out;
}

std::string flow_text(const mps_flow_key& k) {
    char a[INET6_ADDRSTRLEN], b[INET6_ADDRSTRLEN];
    int af = k.family == 6 ? AF_INET6 : AF_INET;
    inet_ntop(af, k.a, a, sizeof a);
    inet_ntop(af, k.b, b, sizeof b);
    return std::string(a) + ":" + std::to_string(k.port_a) + " <-> " + b + ":" +
           std::to_string(k.port_b);
}

std::string hex32(uint32_t v) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%08x", v);
    return buf;
}

// A tiny HTTP server for GET /metrics on 127.0.0.1.
class MetricsServer {
public:
    explicit MetricsServer(int port) {
        fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int one = 1;
        setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        sockaddr_in sa{};
        sa.sin_family = AF_INET;
        sa.sin_port = htons(static_cast<uint16_t>(port));
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (bind(fd_, reinterpret_cast<sockaddr*>(&sa), sizeof sa) || listen(fd_, 16)) {
            int err = errno;
            close(fd_);
            throw std::runtime_error("metrics on 127.0.0.1:" + std::to_string(port) + ": " +
                                     std::strerror(err));
        }
        thread_ = std::thread([this] { serve(); });
    }
    ~MetricsServer() {
        stop_ = true;
        shutdown(fd_, SHUT_RDWR);
        thread_.join();
        close(fd_);
    }
    void set(std::string text) {
        std::lock_guard lock(mu_);
        text_ = std::move(text);
    }

private:
    void serve() {
        while (!stop_) {
            int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
            if (c < 0) {
                if (stop_) return;
                continue;
            }
            timeval tv{2, 0};
            setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
            char req[2048];
            ssize_t n = recv(c, req, sizeof req - 1, 0);
            std::string head(req, n > 0 ? static_cast<size_t>(n) : 0);
            std::string body, status = "200 OK";
            if (head.rfind("GET /metrics", 0) == 0) {
                std::lock_guard lock(mu_);
                body = text_;
            } else {
                status = "404 Not Found";
                body = "try /metrics\n";
            }
            std::string resp = "HTTP/1.1 " + status +
                               "\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: " +
                               std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
            send(c, resp.data(), resp.size(), MSG_NOSIGNAL);
            close(c);
        }
    }
    int fd_ = -1;
    std::atomic<bool> stop_{false};
    std::mutex mu_;
    std::string text_;
    std::thread thread_;
};

class Agent {
public:
    explicit Agent(const Config& cfg) : cfg_(cfg), state_(datapath::StateMaps::open(cfg.pin_root)) {}
    int run();

private:
    // The loaded programs and the generation slots, per build of the BPF object.
    std::string dp_dir(const std::string& id = datapath::Datapath::object_id()) const {
        return cfg_.pin_root + "/dp/" + id;
    }
    std::string link_dir() const { return cfg_.pin_root + "/links"; }
    std::string gen_state_path() const { return cfg_.state_dir + "/state/generation.json"; }

    void adopt_previous();
    void rewatch(const std::string& root);
    bool relevant_inotify();
    void reconcile(bool force);
    void apply(const Revision& rev);
    void fail(const std::string& reason, const std::string& message);
    void preflight(const Generation& g);
    std::set<LinkKey> desired_links(const datapath::ChainSet& c,
                                    const std::set<std::string>& present) const;
    std::map<std::string, PolicyCounters> policy_counters(const Generation& g) const;
    void retire(std::unique_ptr<Generation>& g);
    void remove_stale_datapaths();
    void log_event(const datapath::Event& ev);  // after the hooks saw it (event thread)
    void write_status();
    void compile_entries();
    // Lua hooks (issue 6): the scripts of the running revision's policies.
    void configure_hooks(const manifest::Model& model, const std::string& revision);
    void configure_hooks_from_dir();

    Config cfg_;
    datapath::StateMaps state_;
    std::shared_ptr<datapath::Datapath> dp_;  // loaded (or adopted) once per process
    // current_ runs; previous_ is the rollback target in the other slot until the next apply.
    std::unique_ptr<Generation> current_, previous_;
    std::map<LinkKey, std::unique_ptr<HookLink>> links_;
    std::set<std::string> built_with_ifaces_;  // interfaces present when current_ was built
    std::string applied_id_, applied_content_, attempted_id_, watched_root_;
    std::string stalled_reason_, stalled_message_, degraded_message_;
    std::vector<std::string> errors_, warnings_;
    bool suspended_ = false, pending_ = false, recovering_ = false;
    // When to load the current generation's compiled entries: once revisions have been quiet
    // this long after an apply (a burst of commits compiles only the last one).
    Clock::time_point compile_due_ = Clock::time_point::max();
    uint32_t next_gen_ = 1;
    // Counters of generations gone from their slot, so totals never go backwards.
    std::map<std::string, PolicyCounters> retired_;
    datapath::GenCounters retired_gen_;
    uint64_t applies_ok_ = 0, applies_failed_ = 0, events_[5] = {};
    double last_apply_ms_ = 0;
    int inotify_ = -1, epoll_ = -1, state_wd_ = -1, parent_wd_ = -1;
    std::string link_name_;
    std::string failed_content_;  // content of the last revision that failed: not retried
    std::string attempting_content_;
    std::ofstream events_log_;
    std::unique_ptr<MetricsServer> metrics_;
    // ---- Lua hooks (issue 6): fed events, ticks and on_apply; their state goes into status.
    // Touched only by events_ (EventThread::call() from here), which goes first when the
    // agent is destroyed.
    lua::DatapathBackend lua_backend_{state_};
    lua::HookSet hooks_{lua_backend_};
    bool hooks_configured_ = false;
    std::unique_ptr<lua::EventThread> event_thread_;
};

void Agent::configure_hooks(const manifest::Model& model, const std::string& revision) {
    std::vector<lua::ScriptSpec> specs;
    for (const auto& p : model.policies) {
        if (!p.lua) continue;
        try {
            specs.push_back(lua::read_spec(p.name, p.lua->script, p.lua->path, p.lua->every_ms,
                                           p.lua->params));
        } catch (const std::exception& e) {
            spdlog::error("lua {}: {}", p.name, e.what());
        }
    }
    // Synchronous: the backend points at current_ before the next apply can retire the
    // generation it pointed at before.
    Generation* gen = current_.get();
    event_thread_->call([&] {
        lua_backend_.set_generation(gen);
        hooks_.configure(specs, revision, gen ? gen->number() : 0);
    });
    hooks_configured_ = true;
}

// After a restart that adopted the running generation without an apply.
void Agent::configure_hooks_from_dir() {
    try {
        auto rev = snapshot(cfg_.policies_dir);
        manifest::Options mo;
        mo.repo_root = rev.root;
        mo.known_interfaces = present_interfaces();
        auto res = manifest::load_paths({rev.root}, mo);
        if (res.ok()) configure_hooks(res.model, applied_id_);
    } catch (const std::exception& e) {
        spdlog::warn("lua hooks: {}", e.what());
    }
}

void Agent::adopt_previous() {
    std::ifstream in(gen_state_path());
    if (!in) return;
    nlohmann::json g;
    try {
        in >> g;
        next_gen_ = g.at("number").get<uint32_t>() + 1;
    } catch (const std::exception& e) {
        spdlog::warn("ignoring {} ({})", gen_state_path(), e.what());
        return;
    }
    // The generation: only from pins of this very BPF object (an upgrade loads anew).
    try {
        auto model = compile::read_applied(applied_path(cfg_.state_dir));
        const uint32_t n = g.at("number");
        if (model && g.value("datapath", "") == datapath::Datapath::object_id()) {
            dp_ = datapath::Datapath::adopt(dp_dir());
            current_ = Generation::adopt(dp_, g.at("slot"), model->chains, n);
            // Killed between the flip and this record: go back to what the record says (that
            // slot is intact; the flip's revision is applied again below).
            if (!current_->active()) current_->activate();
            applied_id_ = g.at("revision");
            applied_content_ = g.at("content");
            for (const auto& d : g.at("interfaces"))
                built_with_ifaces_.insert(d.get<std::string>());
        }
    } catch (const std::exception& e) {
        spdlog::warn("not adopting the previous generation ({}); building a new one", e.what());
        current_.reset();
        dp_.reset();
        applied_content_.clear();
    }
    // Links always: they hold the hooks, which a new attach could not take. Without an adopted
    // datapath the first apply moves them onto a new one.
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(link_dir(), ec)) {
        auto name = entry.path().filename().string();
        auto at = name.rfind('@');
        auto hook = at == std::string::npos ? std::nullopt
                                            : datapath::hook_from_string(name.substr(at + 1));
        if (!hook) continue;
        LinkKey key{name.substr(0, at), *hook};
        try {
            links_[key] = HookLink::adopt(entry.path(), key.ifname, key.hook,
                                          dp_ ? dp_->entry_fd(key.hook) : -1);
        } catch (const std::exception& e) {
            spdlog::warn("link {}: {}", name, e.what());
        }
    }
    // A link may run programs we did not adopt: the first switch does not insist on the
    // program it expects to replace.
    recovering_ = true;
    if (current_)
        spdlog::info("adopted generation {} (revision {}) with {} links", current_->number(),
                     applied_id_, links_.size());
}

// Drains the inotify queue; true when something that matters changed. In the state
// directory only the suspend flag matters (the agent writes its status there itself).
bool Agent::relevant_inotify() {
    alignas(inotify_event) char buf[16384];
    bool relevant = false;
    for (;;) {
        ssize_t n = read(inotify_, buf, sizeof buf);
        if (n <= 0) break;
        for (char* p = buf; p < buf + n;) {
            auto* ev = reinterpret_cast<inotify_event*>(p);
            std::string name = ev->len ? ev->name : "";
            if (ev->wd == state_wd_)
                relevant |= name == "suspended";
            else if (ev->wd == parent_wd_)
                relevant |= name == link_name_;
            else
                relevant = true;
            p += sizeof(inotify_event) + ev->len;
        }
    }
    return relevant;
}

void Agent::rewatch(const std::string& root) {
    if (inotify_ >= 0) {
        epoll_ctl(epoll_, EPOLL_CTL_DEL, inotify_, nullptr);
        close(inotify_);
    }
    inotify_ = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    epoll_event ev{EPOLLIN, {.fd = inotify_}};
    epoll_ctl(epoll_, EPOLL_CTL_ADD, inotify_, &ev);
    // The parent sees a symlink flip (git-sync renames a new link over the old one).
    auto abs = fs::absolute(cfg_.policies_dir).lexically_normal();
    if (!abs.has_filename()) abs = abs.parent_path();
    link_name_ = abs.filename().string();
    parent_wd_ = inotify_add_watch(inotify_, abs.parent_path().c_str(),
                                   IN_CREATE | IN_MOVED_TO | IN_MOVED_FROM | IN_DELETE | IN_ATTRIB);
    state_wd_ = inotify_add_watch(inotify_, cfg_.state_dir.c_str(), IN_CREATE | IN_DELETE);
    const uint32_t mask = IN_CLOSE_WRITE | IN_MOVED_TO | IN_MOVED_FROM | IN_CREATE | IN_DELETE |
                          IN_DELETE_SELF | IN_MOVE_SELF | IN_ATTRIB;
    std::error_code ec;
    if (inotify_add_watch(inotify_, root.c_str(), mask) < 0) return;
    for (auto it = fs::recursive_directory_iterator(root, ec); !ec && it != fs::end(it);
         it.increment(ec))
        if (it->is_directory()) inotify_add_watch(inotify_, it->path().c_str(), mask);
    watched_root_ = root;
}

std::set<LinkKey> Agent::desired_links(const datapath::ChainSet& c,
                                       const std::set<std::string>& present) const {
    std::set<std::string> managed;
    if (!cfg_.interfaces.empty()) {
        managed.insert(cfg_.interfaces.begin(), cfg_.interfaces.end());
    } else {
        for (const auto& i : present)
            if (i != "lo") managed.insert(i);
    }
    std::set<LinkKey> out;
    for (const auto& a : c.attachments) {
        if (a.ifname.empty()) {
            for (const auto& i : managed)
                if (present.count(i)) out.insert({i, a.hook});
        } else if (present.count(a.ifname)) {
            out.insert({a.ifname, a.hook});
        }
    }
    return out;
}

void Agent::reconcile(bool force) {
    Revision rev;
    try {
        rev = snapshot(cfg_.policies_dir);
    } catch (const std::exception& e) {
        fail("SourceUnavailable", e.what());
        return;
    }
    if (rev.root != watched_root_) rewatch(rev.root);
    auto present = present_interfaces();
    bool ifaces_changed = false;
    if (current_) {
        auto want = desired_links(current_->chains(), present);
        std::set<LinkKey> have;
        for (const auto& [k, l] : links_) have.insert(k);
        ifaces_changed = want != have || present != built_with_ifaces_;
    }
    if (!force && !ifaces_changed && rev.content == failed_content_) {
        attempted_id_ = rev.id;  // a new commit of the same broken content: still not applied
        return;
    }
    if (!force && current_ && rev.content == applied_content_ && !ifaces_changed) {
        // Back to (or still at) what runs: a new commit with the same content, or a broken
        // revision reverted. Nothing to build; the running generation is the answer.
        applied_id_ = attempted_id_ = rev.id;
        if (!stalled_reason_.empty()) spdlog::info("revision {} is what runs already", rev.id);
        stalled_reason_.clear();
        stalled_message_.clear();
        errors_.clear();
        failed_content_.clear();
        return;
    }
    if (suspended_) {
        pending_ = true;
        spdlog::info("suspended: not applying revision {}", rev.id);
        return;
    }
    pending_ = false;
    apply(rev);
}

void Agent::fail(const std::string& reason, const std::string& message) {
    ++applies_failed_;
    failed_content_ = attempting_content_;
    stalled_reason_ = reason;
    stalled_message_ = message;
    spdlog::error("revision {} not applied ({}): {}", attempted_id_, reason, message);
    if (current_) spdlog::info("generation {} keeps running", current_->number());
}

void Agent::preflight(const Generation& g) {
    // A TEST-NET-1 flow (RFC 5737) that no real traffic uses; its state is removed after.
    datapath::FrameSpec spec;
    spec.saddr = 0xc0000201;
    spec.daddr = 0xc0000202;
    auto frame = datapath::mptcp_data_frame(spec);
    const auto before = g.gen_counters().values[MPS_GC_MISSED_TAIL_CALL];
    for (const auto& [h, r] : g.preflight(frame)) {
        bool ok = h == Hook::xdp ? (r.retval <= 4) : (r.retval == uint32_t(-1) || r.retval <= 7);
        if (!ok)
            throw datapath::Error("pre-flight: " + std::string(datapath::to_string(h)) +
                                  " returned " + std::to_string(r.retval));
    }
    if (g.gen_counters().values[MPS_GC_MISSED_TAIL_CALL] != before)
        throw datapath::Error("pre-flight: a tail call missed on the canned packet");
    mps_flow_key k{};
    k.family = 4;
    k.a[0] = htonl(spec.saddr);
    k.b[0] = htonl(spec.daddr);
    k.port_a = spec.sport;
    k.port_b = spec.dport;
    bpf_map_delete_elem(state_.flows(), &k);
}

void Agent::apply(const Revision& rev) {
    const auto t0 = Clock::now();
    attempted_id_ = rev.id;
    attempting_content_ = rev.content;
    errors_.clear();
    warnings_.clear();
    spdlog::info("applying revision {}", rev.id);

    manifest::Options mo;
    mo.repo_root = rev.root;
    // The interfaces of this network namespace: /sys/class/net shows the mount namespace's,
    // which differ under --netns.
    mo.known_interfaces = present_interfaces();
    auto res = manifest::load_paths({rev.root}, mo);
    for (const auto& d : res.diagnostics) {
        auto text = d.format();
        if (text.rfind(rev.root + "/", 0) == 0) text = text.substr(rev.root.size() + 1);
        (d.severity == manifest::Severity::error ? errors_ : warnings_).push_back(text);
    }
    for (const auto& w : warnings_) spdlog::warn("{}", w);
    if (!res.ok()) {
        for (const auto& e : errors_) spdlog::error("{}", e);
        fail("ValidationFailed", std::to_string(errors_.size()) + " error(s) in the manifests");
        return;
    }
    compile::Output out;
    try {
        out = compile::compile(res.model);
    } catch (const std::exception& e) {
        errors_.push_back(e.what());
        fail("CompileFailed", e.what());
        return;
    }
    auto present = present_interfaces();
    datapath::ChainSet chains = out.chains;
    std::erase_if(chains.entries,
                  [&](const auto& e) { return !e.ifname.empty() && !present.count(e.ifname); });
    auto desired = desired_links(chains, present);

    std::unique_ptr<Generation> gen;
    const uint32_t n = next_gen_++;
    try {
        if (!dp_) {  // once per process (verifying every program takes about a second)
            auto dp = datapath::Datapath::load(state_);
            fs::remove_all(dp_dir());
            dp->pin(dp_dir());
            dp_ = std::move(dp);
        }
        // The slot to write is the previous generation's: count it out first.
        retire(previous_);
        gen = Generation::stage(dp_, chains, n);
        preflight(*gen);
    } catch (const std::exception& e) {
        errors_.push_back(e.what());
        fail("BuildFailed", e.what());
        return;
    }

    // Switch: one store makes every hook of this datapath run the new generation. Then attach
    // new hooks (and, after an upgrade, move old links onto this datapath); on any failure
    // flip back and undo.
    gen->activate();
    std::vector<std::pair<LinkKey, int>> moved;  // and the program each ran before
    std::vector<LinkKey> added;
    try {
        for (const auto& key : desired) {
            int fd = gen->entry_fd(key.hook, key.ifname);
            if (auto it = links_.find(key); it != links_.end()) {
                if (it->second->prog_fd() == fd) continue;
                int old = it->second->prog_fd();
                it->second->update(fd, !recovering_);
                moved.emplace_back(key, old);
            } else {
                auto link = HookLink::attach(key.ifname, key.hook, fd);
                link->pin(link_dir() + "/" + key.pin_name());
                spdlog::info("attached {} {} ({})", key.ifname, datapath::to_string(key.hook),
                             link->mode());
                links_[key] = std::move(link);
                added.push_back(key);
            }
        }
    } catch (const std::exception& e) {
        if (current_) current_->activate();
        for (const auto& [key, old] : moved)
            if (old >= 0) try {
                    links_[key]->update(old, false);
                } catch (const std::exception& e2) {
                    spdlog::error("rolling back {}: {}", key.pin_name(), e2.what());
                }
        for (const auto& key : added) {
            links_[key]->detach();
            links_.erase(key);
        }
        errors_.push_back(e.what());
        fail("SwitchFailed", e.what());
        return;
    }
    for (auto it = links_.begin(); it != links_.end();) {
        if (desired.count(it->first)) {
            ++it;
            continue;
        }
        spdlog::info("detaching {} {}", it->first.ifname, datapath::to_string(it->first.hook));
        it->second->detach();
        it = links_.erase(it);
    }

    // Commit: the previous generation keeps its slot (the rollback target) until the next apply.
    previous_ = std::move(current_);
    current_ = std::move(gen);
    recovering_ = false;
    compile_due_ = Clock::now() + 250ms;
    applied_id_ = rev.id;
    applied_content_ = rev.content;
    built_with_ifaces_ = present;
    auto model = compile::make_plan_model(res.model, out, rev.id);
    model.chains = chains;
    write_atomic(applied_path(cfg_.state_dir), compile::to_json(model).dump(1) + "\n");
    nlohmann::json g = {{"number", n},
                        {"slot", current_->slot()},
                        {"datapath", datapath::Datapath::object_id()},
                        {"revision", rev.id},
                        {"content", rev.content},
                        {"interfaces", std::vector<std::string>(present.begin(), present.end())}};
    write_atomic(gen_state_path(), g.dump() + "\n");
    if (!moved.empty()) remove_stale_datapaths();
    stalled_reason_.clear();
    stalled_message_.clear();
    failed_content_.clear();
    ++applies_ok_;
    last_apply_ms_ = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    spdlog::info("generation {} active on {} hook(s): revision {}, {} policies, {} steps ({:.0f} ms)",
                 n, links_.size(), rev.id, out.chains.policies.size(), chains.steps.size(),
                 last_apply_ms_);
    configure_hooks(res.model, rev.id);  // Lua hooks follow the revision (issue 6)
}

// The compiled entries (bpf/README.md) of the running generation, once revisions have been
// quiet for a moment: loading them takes milliseconds per chain, and enforcement does not wait
// for them (the entry programs run the generation until the links move). Any failure leaves
// the entry programs.
void Agent::compile_entries() {
    compile_due_ = Clock::time_point::max();
    if (!current_) return;
    const auto t0 = Clock::now();
    try {
        current_->emit_entries();
        preflight(*current_);
    } catch (const std::exception& e) {
        spdlog::warn("generation {} stays on the entry programs: {}", current_->number(), e.what());
        return;
    }
    int compiled = 0;
    for (auto& [key, link] : links_) {
        const int fd = current_->entry_fd(key.hook, key.ifname);
        if (!current_->compiled(key.hook, key.ifname) || fd == link->prog_fd()) continue;
        try {
            link->update(fd);
            ++compiled;
        } catch (const std::exception& e) {
            spdlog::warn("{}: {}", key.pin_name(), e.what());
        }
    }
    spdlog::info("generation {}: compiled entries on {} of {} hook(s) ({:.0f} ms)",
                 current_->number(), compiled, links_.size(),
                 std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
}

void Agent::retire(std::unique_ptr<Generation>& g) {
    if (!g) return;
    for (const auto& [name, c] : policy_counters(*g)) retired_[name] += c;
    try {
        auto gc = g->gen_counters();
        for (int i = 0; i < MPS_GC_MAX; ++i) retired_gen_.values[i] += gc.values[i];
    } catch (const std::exception&) {
    }
    g.reset();
}

// After an upgrade moved every link onto this build's datapath: once no packet can still be
// inside the old programs, drop their pins (and with them the old prog arrays).
void Agent::remove_stale_datapaths() {
    dp_->quiesce(true);
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(cfg_.pin_root + "/dp", ec))
        if (entry.path() != dp_dir()) fs::remove_all(entry.path(), ec);
    fs::remove_all(cfg_.pin_root + "/gen", ec);  // generations pinned by builds before 0.2
}

std::map<std::string, PolicyCounters> Agent::policy_counters(const Generation& g) const {
    std::map<std::string, PolicyCounters> out;
    const auto& c = g.chains();
    std::vector<datapath::StepCounters> sc;
    try {
        sc = g.step_counters();
    } catch (const std::exception&) {
        return out;
    }
    for (size_t pc = 0; pc < c.steps.size() && pc < sc.size(); ++pc) {
        const auto& st = c.steps[pc];
        if (st.policy >= c.policies.size()) continue;
        auto& pcn = out[c.policies[st.policy]];
        pcn.missed_tail_calls += sc[pc].missed_tail_calls;
        if (!MPS_PROG_IS_ACTOR(st.prog)) continue;
        pcn.applied += sc[pc].matched;
        pcn.drops += sc[pc].drops;
        // The first action of a policy's run of actions counts the packets it selected.
        bool first = pc == 0 || !MPS_PROG_IS_ACTOR(c.steps[pc - 1].prog) ||
                     c.steps[pc - 1].policy != st.policy;
        if (first) pcn.selected += sc[pc].runs;
    }
    return out;
}

void Agent::log_event(const datapath::Event& ev) {
    const auto& r = ev.raw;
    nlohmann::json j = {{"time", now_iso()}, {"flow", flow_text(r.flow)},
                        {"hook", std::string(datapath::to_string(static_cast<Hook>(r.hook)))}};
    if (r.type < 5) ++events_[r.type];
    if (r.type == MPS_EV_MP_CAPABLE) {
        j["type"] = "mp_capable";
        j["version"] = r.version;
        if (ev.token_a) j["token_a"] = hex32(ev.token_a);
        if (ev.token_b) j["token_b"] = hex32(ev.token_b);
    } else if (r.type == MPS_EV_MP_JOIN) {
        j["type"] = "mp_join";
        j["token"] = hex32(r.token);
        j["backup"] = bool(r.flags & 1);
        j["addr_id"] = r.addr_id;
    } else if (r.type == MPS_EV_ADD_ADDR_BLOCKED) {
        j["type"] = "add_addr_blocked";
        char addr[INET6_ADDRSTRLEN];
        inet_ntop(r.flags == 6 ? AF_INET6 : AF_INET, r.key, addr, sizeof addr);
        j["address"] = addr;
        j["addr_id"] = r.addr_id;
        if (r.nonce) j["port"] = r.nonce;
    } else {
        j["type"] = "flow_closed";
    }
    events_log_ << j.dump() << '\n';
}

void Agent::write_status() {
    nlohmann::json s;
    bool ready = current_ && stalled_reason_.empty() && !suspended_;
    nlohmann::json conds = nlohmann::json::array();
    conds.push_back({{"type", "Ready"},
                     {"status", ready},
                     {"reason", ready ? "Applied" : suspended_ ? "Suspended"
                                        : !current_         ? "NothingApplied"
                                                            : stalled_reason_},
                     {"message", ready ? "revision " + applied_id_ + " is active"
                                 : suspended_ ? "applying is suspended (mpsteer resume)"
                                              : stalled_message_}});
    conds.push_back({{"type", "Stalled"},
                     {"status", !stalled_reason_.empty()},
                     {"reason", stalled_reason_},
                     {"message", stalled_message_}});
    // Totals since the agent started (earlier generations included); the Degraded condition
    // looks at the running generation only.
    uint64_t missed = 0;
    std::map<std::string, PolicyCounters> pols = retired_;
    datapath::GenCounters g = retired_gen_;
    if (current_) {
        for (const auto* gen : {current_.get(), previous_.get()}) {
            if (!gen) continue;
            for (const auto& [name, c] : policy_counters(*gen)) pols[name] += c;
            try {
                auto gc = gen->gen_counters();
                for (int i = 0; i < MPS_GC_MAX; ++i) g.values[i] += gc.values[i];
                if (gen == current_.get()) missed = gc.values[MPS_GC_MISSED_TAIL_CALL];
            } catch (const std::exception&) {
            }
        }
    }
    nlohmann::json gen_counters = {{"packets", g.values[MPS_GC_PACKETS]},
                                   {"not_tcp", g.values[MPS_GC_NOT_TCP]},
                                   {"malformed", g.values[MPS_GC_MALFORMED]},
                                   {"missed_tail_calls", g.values[MPS_GC_MISSED_TAIL_CALL]},
                                   {"chain_too_long", g.values[MPS_GC_CHAIN_TOO_LONG]},
                                   {"no_meta", g.values[MPS_GC_NO_META]},
                                   {"events_lost", g.values[MPS_GC_EVENTS_LOST]}};
    // Lua hooks (issue 6), read on their thread.
    auto [hook_status, hook_json, thread_stats] = event_thread_->call([this] {
        return std::make_tuple(hooks_.status(), hooks_.status_json(), event_thread_->stats());
    });
    std::string hook_off;  // a disabled script degrades the agent
    for (const auto& h : hook_status)
        if (h.disabled) hook_off += (hook_off.empty() ? "" : ", ") + h.policy + " (" + h.script + ")";
    bool degraded = missed > 0 || !warnings_.empty() || !hook_off.empty();
    conds.push_back({{"type", "Degraded"},
                     {"status", degraded},
                     {"reason", missed ? "MissedTailCalls" : !warnings_.empty() ? "Warnings"
                                : !hook_off.empty() ? "LuaHookDisabled" : ""},
                     {"message", missed ? std::to_string(missed) + " missed tail calls"
                                 : !warnings_.empty() ? warnings_.front()
                                 : !hook_off.empty() ? "Lua hook disabled: " + hook_off : ""}});
    nlohmann::json policies = nlohmann::json::array();
    std::set<std::string> active;
    if (current_)
        for (const auto& p : current_->chains().policies) active.insert(p);
    for (const auto& [name, c] : pols) {
        if (!active.count(name)) continue;
        policies.push_back({{"name", name},
                            {"selected", c.selected},
                            {"applied", c.applied},
                            {"drops", c.drops},
                            {"missed_tail_calls", c.missed_tail_calls}});
    }
    nlohmann::json links = nlohmann::json::array();
    for (const auto& [k, l] : links_)
        links.push_back({{"interface", k.ifname},
                         {"hook", std::string(datapath::to_string(k.hook))},
                         {"mode", l->mode()}});
    s = {{"ready", ready},
         {"suspended", suspended_},
         {"pending", pending_},
         {"conditions", conds},
         {"applied_revision", applied_id_},
         {"attempted_revision", attempted_id_},
         {"generation", current_ ? current_->number() : 0},
         {"policies", policies},
         {"attachments", links},
         {"datapath", gen_counters},
         {"errors", errors_},
         {"warnings", warnings_},
         {"applies", {{"succeeded", applies_ok_}, {"failed", applies_failed_},
                      {"last_duration_ms", last_apply_ms_}}},
         {"events", {{"mp_capable", events_[MPS_EV_MP_CAPABLE]},
                     {"mp_join", events_[MPS_EV_MP_JOIN]},
                     {"flow_closed", events_[MPS_EV_FLOW_CLOSED]},
                     {"add_addr_blocked", events_[MPS_EV_ADD_ADDR_BLOCKED]}}},
         {"lua_hooks", hook_json},
         {"event_thread", thread_stats.to_json()},
         {"pid", getpid()},
         {"policies_dir", cfg_.policies_dir},
         {"updated", now_iso()}};
    write_atomic(status_path(cfg_.state_dir), s.dump(1) + "\n");
    auto text = to_prometheus(s);
    if (metrics_) metrics_->set(text);
    if (!cfg_.metrics_textfile.empty()) {
        try {
            write_atomic(cfg_.metrics_textfile, text);
        } catch (const std::exception& e) {
            spdlog::warn("metrics textfile: {}", e.what());
        }
    }
}

int Agent::run() {
    fs::create_directories(cfg_.state_dir + "/state");
    int lock = open((cfg_.state_dir + "/agent.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock < 0 || flock(lock, LOCK_EX | LOCK_NB)) {
        spdlog::error("another mpsteer agent runs with state in {}", cfg_.state_dir);
        return 1;
    }
    events_log_.open(events_path(cfg_.state_dir), std::ios::app);
    suspended_ = fs::exists(suspended_path(cfg_.state_dir));
    if (cfg_.metrics_port > 0) try {
            metrics_ = std::make_unique<MetricsServer>(cfg_.metrics_port);
        } catch (const std::exception& e) {
            spdlog::error("{} (carrying on without the metrics endpoint)", e.what());
        }

    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    sigprocmask(SIG_BLOCK, &sigs, nullptr);
    int sigfd = signalfd(-1, &sigs, SFD_CLOEXEC | SFD_NONBLOCK);
    int nl = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, NETLINK_ROUTE);
    sockaddr_nl snl{};
    snl.nl_family = AF_NETLINK;
    snl.nl_groups = RTMGRP_LINK;
    bind(nl, reinterpret_cast<sockaddr*>(&snl), sizeof snl);
    lua::EventThreadOptions eo;
    eo.mode = *lua::poll_mode_from_string(cfg_.events_mode);  // checked by the CLI
    eo.spin = cfg_.events_spin;
    eo.rt_priority = cfg_.events_rt_priority;
    eo.cpu = cfg_.events_cpu;
    event_thread_ = std::make_unique<lua::EventThread>(state_, lua_backend_, hooks_, eo);
    const int events_fd = event_thread_->notify_fd();

    epoll_ = epoll_create1(EPOLL_CLOEXEC);
    for (int fd : {sigfd, nl, events_fd}) {
        epoll_event ev{EPOLLIN, {.fd = fd}};
        epoll_ctl(epoll_, EPOLL_CTL_ADD, fd, &ev);
    }
    adopt_previous();
    spdlog::info("watching {} (state {}, pins {})", cfg_.policies_dir, cfg_.state_dir,
                 cfg_.pin_root);
    reconcile(false);
    if (!hooks_configured_ && current_) configure_hooks_from_dir();
    write_status();

    auto due = Clock::time_point::max();  // debounced reconcile
    auto next_status = Clock::now() + 1s, next_resync = Clock::now() + cfg_.resync;
    for (;;) {
        auto wake = std::min({due, next_status, next_resync, compile_due_});
        int timeout = static_cast<int>(std::max<int64_t>(
            0, std::chrono::duration_cast<std::chrono::milliseconds>(wake - Clock::now()).count()));
        epoll_event evs[8];
        int n = epoll_wait(epoll_, evs, 8, timeout);
        bool stop = false;
        for (int i = 0; i < n; ++i) {
            int fd = evs[i].data.fd;
            if (fd == sigfd) {
                stop = true;
            } else if (fd == events_fd) {
                for (const auto& e : event_thread_->take_events()) log_event(e);
                events_log_.flush();
            } else if (fd == inotify_) {
                if (relevant_inotify()) due = Clock::now() + cfg_.debounce;
            } else {
                char buf[8192];
                while (read(fd, buf, sizeof buf) > 0) {
                }
                due = Clock::now() + cfg_.debounce;  // quiet for `debounce`, then reconcile
            }
        }
        if (stop) break;
        auto now = Clock::now();
        if (now >= due) {
            due = Clock::time_point::max();
            bool was = suspended_;
            suspended_ = fs::exists(suspended_path(cfg_.state_dir));
            if (was != suspended_) spdlog::info(suspended_ ? "suspended" : "resumed");
            reconcile(false);
            write_status();
        }
        if (now >= next_resync) {
            next_resync = now + cfg_.resync;
            reconcile(false);
        }
        if (now >= compile_due_ && due == Clock::time_point::max()) compile_entries();
        if (now >= next_status) {
            next_status = now + 1s;
            write_status();
        }
    }
    spdlog::info("stopping");
    event_thread_->stop();  // the hooks' last event runs to its end
    for (const auto& e : event_thread_->take_events()) log_event(e);
    events_log_.flush();
    if (cfg_.detach_on_exit) {
        for (auto& [k, l] : links_) l->detach();
        links_.clear();
    } else {
        for (auto& [k, l] : links_) l->release();  // pinned: the datapath keeps running
    }
    write_status();
    close(nl);
    close(sigfd);
    return 0;
}
}  // namespace

int run(const Config& cfg) {
    datapath::init_libbpf_logging();
    if (!cfg.netns.empty()) {
        int fd = open(("/run/netns/" + cfg.netns).c_str(), O_RDONLY | O_CLOEXEC);
        if (fd < 0 || setns(fd, CLONE_NEWNET)) {
            spdlog::error("entering network namespace {}: {}", cfg.netns, std::strerror(errno));
            return 1;
        }
        close(fd);
    }
    try {
        Agent a(cfg);
        return a.run();
    } catch (const std::exception& e) {
        spdlog::error("{}", e.what());
        return 1;
    }
}

void reset(const std::string& pin_root, const std::string& state_dir) {
    fs::create_directories(state_dir);
    int lock = open((state_dir + "/agent.lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (lock < 0 || flock(lock, LOCK_EX | LOCK_NB))
        throw std::runtime_error("an agent is running (stop it first)");
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(pin_root + "/links", ec)) {
        int fd = bpf_obj_get(entry.path().c_str());
        if (fd >= 0) {
            bpf_link_detach(fd);
            close(fd);
        }
        spdlog::info("detached {}", entry.path().filename().string());
    }
    fs::remove_all(pin_root, ec);
    for (auto p : {status_path(state_dir), events_path(state_dir), suspended_path(state_dir),
                   state_dir + "/state"})
        fs::remove_all(p, ec);
    close(lock);
}

nlohmann::json read_status(const std::string& state_dir) {
    std::ifstream in(status_path(state_dir));
    if (!in) throw std::runtime_error("no status in " + state_dir + " (has an agent run here?)");
    nlohmann::json s;
    in >> s;
    int lock = open((state_dir + "/agent.lock").c_str(), O_RDWR | O_CLOEXEC);
    bool running = lock >= 0 && flock(lock, LOCK_EX | LOCK_NB) != 0;
    if (lock >= 0) close(lock);
    s["agent_running"] = running;
    if (!running) {
        s["ready"] = false;
        s["conditions"].push_back({{"type", "AgentRunning"},
                                   {"status", false},
                                   {"reason", "NotRunning"},
                                   {"message", "no agent runs; the datapath keeps the last generation"}});
    }
    return s;
}

std::string to_prometheus(const nlohmann::json& s) {
    std::string out;
    auto esc = [](std::string v) {
        std::string r;
        for (char c : v) {
            if (c == '\\' || c == '"') r += '\\';
            if (c == '\n') {
                r += "\\n";
                continue;
            }
            r += c;
        }
        return r;
    };
    auto metric = [&](const std::string& name, const std::string& type, const std::string& help) {
        out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
    };
    auto num = [](const nlohmann::json& v) { return v.is_number() ? v.dump() : "0"; };
    metric("mpsteer_ready", "gauge", "1 when the last revision is applied and running");
    out += "mpsteer_ready " + std::string(s.value("ready", false) ? "1" : "0") + "\n";
    metric("mpsteer_generation", "gauge", "Number of the active datapath generation");
    out += "mpsteer_generation " + num(s["generation"]) + "\n";
    metric("mpsteer_revision_info", "gauge", "Applied and last attempted revision");
    out += "mpsteer_revision_info{applied=\"" + esc(s.value("applied_revision", "")) +
           "\",attempted=\"" + esc(s.value("attempted_revision", "")) + "\"} 1\n";
    metric("mpsteer_errors", "gauge", "Errors in the last attempted revision");
    out += "mpsteer_errors " + std::to_string(s["errors"].size()) + "\n";
    const std::pair<const char*, const char*> pol[] = {
        {"selected", "Packets that reached the policy's actions"},
        {"applied", "Actions that changed or reported a packet"},
        {"drops", "Packets the policy dropped"},
        {"missed_tail_calls", "Tail calls that missed in the policy's chain"}};
    for (auto [key, help] : pol) {
        std::string name = std::string("mpsteer_policy_") + key + "_total";
        metric(name, "counter", help);
        for (const auto& p : s["policies"])
            out += name + "{policy=\"" + esc(p.value("name", "")) + "\"} " + num(p[key]) + "\n";
    }
    metric("mpsteer_datapath_packets_total", "counter",
           "Packets seen by the active generation's entry programs, by outcome");
    for (const auto& [k, v] : s["datapath"].items())
        out += "mpsteer_datapath_packets_total{outcome=\"" + k + "\"} " + num(v) + "\n";
    metric("mpsteer_applies_total", "counter", "Revisions applied, by result");
    out += "mpsteer_applies_total{result=\"success\"} " + num(s["applies"]["succeeded"]) + "\n";
    out += "mpsteer_applies_total{result=\"failure\"} " + num(s["applies"]["failed"]) + "\n";
    metric("mpsteer_last_apply_duration_seconds", "gauge", "Time the last successful apply took");
    out += "mpsteer_last_apply_duration_seconds " +
           std::to_string(s["applies"].value("last_duration_ms", 0.0) / 1000.0) + "\n";
    metric("mpsteer_events_total", "counter", "Datapath events, by type");
    for (const auto& [k, v] : s["events"].items())
        out += "mpsteer_events_total{type=\"" + k + "\"} " + num(v) + "\n";
    if (s.contains("lua_hooks") && !s["lua_hooks"].empty()) {  // Lua hooks (issue 6)
        const std::pair<const char*, const char*> lh[] = {
            {"calls", "Lua hook calls"}, {"failures", "Lua hook calls that failed"},
            {"writes", "Map writes requested by Lua hooks"}};
        for (auto [key, help] : lh) {
            std::string name = std::string("mpsteer_lua_hook_") + key + "_total";
            metric(name, "counter", help);
            for (const auto& h : s["lua_hooks"])
                out += name + "{policy=\"" + esc(h.value("policy", "")) + "\"} " + num(h[key]) + "\n";
        }
        metric("mpsteer_lua_hook_disabled", "gauge", "1 when the policy's Lua hook is disabled");
        for (const auto& h : s["lua_hooks"])
            out += "mpsteer_lua_hook_disabled{policy=\"" + esc(h.value("policy", "")) + "\"} " +
                   (h.value("state", "") == "disabled" ? "1" : "0") + "\n";
    }
    if (s.contains("event_thread") && s["event_thread"].contains("latency_us")) {
        const auto& e = s["event_thread"];
        const auto& l = e["latency_us"];
        auto sec = [&](const char* k) { return std::to_string(l.value(k, 0.0) / 1e6); };
        metric("mpsteer_lua_event_latency_seconds", "summary",
               "Datapath event (its BPF timestamp) to the end of the Lua hooks it reached");
        out += "mpsteer_lua_event_latency_seconds{quantile=\"0.5\"} " + sec("p50") + "\n";
        out += "mpsteer_lua_event_latency_seconds{quantile=\"0.99\"} " + sec("p99") + "\n";
        out += "mpsteer_lua_event_latency_seconds_sum " + sec("sum") + "\n";
        out += "mpsteer_lua_event_latency_seconds_count " + num(l["count"]) + "\n";
        metric("mpsteer_event_thread_events_total", "counter",
               "Datapath events taken by the event thread, by how it found them");
        const uint64_t all = e.value("events", uint64_t(0)),
                       polled = e.value("events_while_polling", uint64_t(0));
        out += "mpsteer_event_thread_events_total{found=\"polling\"} " + std::to_string(polled) + "\n";
        out += "mpsteer_event_thread_events_total{found=\"after_wakeup\"} " +
               std::to_string(all - std::min(all, polled)) + "\n";
        metric("mpsteer_event_thread_wakeups_total", "counter",
               "Times the event thread slept in epoll and was woken");
        out += "mpsteer_event_thread_wakeups_total " + num(e["wakeups"]) + "\n";
    }
    return out;
}

}  // namespace mpsteer::agent
