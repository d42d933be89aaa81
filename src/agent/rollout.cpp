// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
#include "agent/rollout.h"

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <net/if.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <stdexcept>

#include "compile/compile.h"
#include "datapath/actors.h"
#include "datapath/frames.h"
#include "net/fd.h"

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace mpsteer::agent {
using datapath::Generation;
using datapath::Hook;
using datapath::HookLink;

std::set<std::string> present_interfaces() {
    std::set<std::string> out;
    if (auto* list = if_nameindex()) {
        for (auto* i = list; i->if_index; ++i) out.insert(i->if_name);
        if_freenameindex(list);
    }
    return out;
}

std::string Rollout::LinkKey::pin_name() const {
    return ifname + "@" + std::string(to_string(hook));
}

Rollout::Rollout(const Config& cfg, const datapath::StateMaps& state)
    : cfg_(cfg),
      state_(state),
      balancer_(cfg.pin_root + "/lb", cfg.state_dir + "/state/balancer.json") {}
Rollout::~Rollout() = default;

// The loaded programs and the generation slots, per build of the BPF object.
std::string Rollout::dp_dir(const std::string& id) const {
    return cfg_.pin_root + "/dp/" + id;
}
std::string Rollout::dp_dir() const {
    return dp_dir(datapath::Datapath::object_id());
}

void Rollout::owner_only(const char* what) const {
    if (std::this_thread::get_id() != owner_)
        throw std::logic_error(std::string("Rollout::") + what +
                               " called off the agent's thread (a generation has one writer)");
}

std::optional<Rollout::Adopted> Rollout::adopt() {
    owner_only("adopt");
    // The generation: only from pins of this very BPF object (an upgrade loads anew), and
    // only with its record (a state directory wiped under pinned links adopts the links alone).
    std::optional<Adopted> adopted;
    if (std::ifstream in(gen_state_path()); in) try {
            nlohmann::json g;
            in >> g;
            const uint32_t n = g.at("number");
            next_gen_ = n + 1;
            auto model = compile::read_applied(applied_path(cfg_.state_dir));
            if (model && g.value("datapath", "") == datapath::Datapath::object_id()) {
                dp_ = datapath::Datapath::adopt(dp_dir());
                current_ = Generation::adopt(dp_, g.at("slot"), model->chains, n);
                // Killed between the flip and this record: go back to what the record says
                // (that slot is intact; the flip's revision is applied again by the next
                // reconcile).
                if (!current_->active()) current_->activate();
                adopted = Adopted{g.at("revision"), g.at("content")};
                for (const auto& d : g.at("interfaces"))
                    built_with_ifaces_.insert(d.get<std::string>());
            }
        } catch (const std::exception& e) {
            spdlog::warn("not adopting the previous generation from {} ({}); building a new one",
                         gen_state_path(), e.what());
            current_.reset();
            dp_.reset();
            built_with_ifaces_.clear();
            adopted.reset();
        }
    // Links always: they hold the hooks, which a new attach could not take. Without an adopted
    // datapath the first apply moves them onto a new one.
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(link_dir(), ec)) {
        auto name = entry.path().filename().string();
        auto at = name.rfind('@');
        auto hook = at == std::string::npos ? std::nullopt : hook_from_string(name.substr(at + 1));
        if (!hook) continue;
        LinkKey key{name.substr(0, at), *hook};
        try {
            links_[key] = HookLink::adopt(entry.path(), key.ifname, key.hook);
        } catch (const std::exception& e) {
            spdlog::warn("link {}: {}", name, e.what());
        }
    }
    if (current_)
        spdlog::info("adopted generation {} (revision {}) with {} links", current_->number(),
                     adopted->revision, links_.size());
    else if (!links_.empty())
        spdlog::info("adopted {} pinned links without a generation: the first apply moves them",
                     links_.size());
    return adopted;
}

std::set<Rollout::LinkKey> Rollout::desired_links(
    const datapath::ChainSet& c, const std::set<std::string>& present,
    const std::vector<std::string>& balancer_interfaces) const {
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
                if (present.count(i) &&
                    !(a.hook == Hook::xdp && std::binary_search(balancer_interfaces.begin(),
                                                                balancer_interfaces.end(), i)))
                    out.insert({i, a.hook});
        } else if (present.count(a.ifname) &&
                   (cfg_.interfaces.empty() || managed.count(a.ifname))) {
            // -i bounds what a policy may name: the operator's choice, not the committer's.
            out.insert({a.ifname, a.hook});
        }
    }
    return out;
}

bool Rollout::interfaces_changed(const std::set<std::string>& present) const {
    if (!current_) return false;
    auto want = desired_links(current_->chains(), present, balancer_.interfaces());
    std::set<LinkKey> have;
    for (const auto& [k, l] : links_) have.insert(k);
    return want != have || present != built_with_ifaces_;
}

void Rollout::preflight(const Generation& g) {
    // A TEST-NET-1 flow (RFC 5737) that no real traffic uses; its state is removed after.
    datapath::FrameSpec spec;
    spec.saddr = 0xc0000201;
    spec.daddr = 0xc0000202;
    auto frame = datapath::mptcp_data_frame(spec);
    const auto before = g.gen_counters().values[MPS_GC_MISSED_TAIL_CALL];
    for (const auto& [h, r] : g.preflight(frame)) {
        bool ok = h == Hook::xdp ? (r.retval <= 4) : (r.retval == uint32_t(-1) || r.retval <= 7);
        if (!ok)
            throw datapath::Error("pre-flight: " + std::string(to_string(h)) + " returned " +
                                  std::to_string(r.retval));
    }
    if (g.gen_counters().values[MPS_GC_MISSED_TAIL_CALL] != before)
        throw datapath::Error("pre-flight: a tail call missed on the canned packet");
    mps_flow_key k{};
    k.family = 4;
    k.a[0] = htonl(spec.saddr);
    k.b[0] = htonl(spec.daddr);
    k.port_a = spec.sport;
    k.port_b = spec.dport;
    state_.remove_flow(k);
}

Rollout::Outcome Rollout::apply(const Revision& rev) {
    owner_only("apply");
    const auto t0 = Clock::now();
    Outcome o;
    auto failed = [&](Stall why, std::string message) {
        o.failure = why;
        o.message = std::move(message);
        return o;
    };
    manifest::Options mo;
    mo.repo_root = rev.root;
    mo.known_interfaces = present_interfaces();
    manifest::Result res;
    try {
        res = manifest::load_paths({rev.root}, mo);
        if (res.ok()) {  // the datapath's limits at a file and line, as `mpsteer validate` has them
            auto limits = compile::check_limits(res.model);
            res.diagnostics.insert(res.diagnostics.end(), limits.begin(), limits.end());
        }
    } catch (const std::exception& e) {
        // A validator bug must cost the revision, never the agent (a crash would loop on it).
        o.errors.push_back(std::string("the manifest loader failed: ") + e.what());
        return failed(Stall::validation_failed, o.errors.back());
    }
    for (const auto& d : res.diagnostics) {
        auto text = d.format();
        if (text.rfind(rev.root + "/", 0) == 0) text = text.substr(rev.root.size() + 1);
        (d.severity == manifest::Severity::error ? o.errors : o.warnings).push_back(text);
    }
    if (!res.ok())
        return failed(Stall::validation_failed,
                      std::to_string(o.errors.size()) + " error(s) in the manifests");
    compile::Output out;
    try {
        out = compile::compile(res.model);
    } catch (const std::exception& e) {
        o.errors.push_back(e.what());
        return failed(Stall::compile_failed, e.what());
    }
    auto present = present_interfaces();
    for (const auto& a : out.chains.attachments)
        if (!a.ifname.empty() && !cfg_.interfaces.empty() &&
            std::find(cfg_.interfaces.begin(), cfg_.interfaces.end(), a.ifname) ==
                cfg_.interfaces.end())
            o.warnings.push_back("interface '" + a.ifname + "' (" +
                                 std::string(datapath::to_string(a.hook)) +
                                 ") is named by a policy but not managed by this agent "
                                 "(-i): not attached");
    datapath::ChainSet chains = out.chains;
    std::erase_if(chains.entries,
                  [&](const auto& e) { return !e.ifname.empty() && !present.count(e.ifname); });
    std::unique_ptr<Generation> gen;
    const uint32_t n = next_gen_++;
    BalancerHost::Plan balancer;
    try {
        balancer = balancer_.prepare(res.model.balancer);
    } catch (const std::exception& e) {
        o.errors.push_back(e.what());
        return failed(Stall::build_failed, e.what());
    }
    std::optional<BalancerHost::Plan> balancer_before;  // what a failed switch puts back
    try {
        balancer_before = balancer_.prepare(balancer_.spec());
    } catch (const std::exception& e) {
        spdlog::warn("the running balancer could not be put back if this apply fails: {}",
                     e.what());
    }
    const std::vector<std::string> no_interfaces;
    auto desired =
        desired_links(chains, present, balancer.spec ? balancer.spec->interfaces : no_interfaces);
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
        o.errors.push_back(e.what());
        return failed(Stall::build_failed, e.what());
    }

    // Switch: one store makes every hook of this datapath run the new generation. Then attach
    // new hooks (and, after an upgrade, move old links onto this datapath); on any failure
    // flip back and undo.
    gen->activate();
    std::vector<std::pair<LinkKey, datapath::Fd>> moved;  // and the program each ran before
    std::vector<LinkKey> added;
    std::vector<std::pair<LinkKey, datapath::Fd>> yielded;  // XDP hooks the balancer now takes
    bool balancer_changed = false;
    try {
        if (balancer.spec)
            for (const auto& i : balancer.spec->interfaces)
                if (auto it = links_.find({i, Hook::xdp}); it != links_.end()) {
                    yielded.emplace_back(it->first, it->second->program());
                    it->second->detach();
                    links_.erase(it);
                }
        balancer_changed = true;
        balancer_.commit(balancer);  // puts itself back when it throws
        for (const auto& key : desired) {
            int fd = gen->entry_fd(key.hook, key.ifname);
            if (auto it = links_.find(key); it != links_.end()) {
                if (it->second->runs(fd)) continue;
                auto old = it->second->program();
                it->second->update(fd);
                moved.emplace_back(key, std::move(old));
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
        for (const auto& [key, old] : moved) try {
                links_[key]->update(old.get(), false);
            } catch (const std::exception& e2) {
                spdlog::error("rolling back {}: {}", key.pin_name(), e2.what());
            }
        for (const auto& key : added) {
            links_[key]->detach();
            links_.erase(key);
        }
        if (balancer_changed && balancer_before) try {
                balancer_.commit(*balancer_before);
            } catch (const std::exception& e2) {
                spdlog::error("putting the balancer back: {}", e2.what());
            }
        for (auto& [key, prog] : yielded) try {
                auto link = HookLink::attach(key.ifname, key.hook, prog.get());
                link->pin(link_dir() + "/" + key.pin_name());
                links_[key] = std::move(link);
            } catch (const std::exception& e2) {
                spdlog::error("re-attaching {}: {}", key.pin_name(), e2.what());
            }
        o.errors.push_back(e.what());
        return failed(Stall::switch_failed, e.what());
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
    built_with_ifaces_ = present;
    auto model = compile::make_plan_model(res.model, out, rev.id);
    model.chains = chains;
    write_atomic(applied_path(cfg_.state_dir), json_text(compile::to_json(model), 1) + "\n");
    nlohmann::json g = {{"number", n},
                        {"slot", current_->slot()},
                        {"datapath", datapath::Datapath::object_id()},
                        {"revision", rev.id},
                        {"content", rev.content},
                        {"interfaces", std::vector<std::string>(present.begin(), present.end())}};
    write_atomic(gen_state_path(), json_text(g) + "\n");
    if (!moved.empty()) remove_stale_datapaths();
    o.generation = n;
    o.model = std::move(res.model);
    o.duration_ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    spdlog::info(
        "generation {} active on {} hook(s): revision {}, {} policies, {} steps ({:.0f} ms)", n,
        links_.size(), rev.id, out.chains.policies.size(), chains.steps.size(), o.duration_ms);
    return o;
}

// Loading the compiled entries takes milliseconds per chain, and enforcement does not wait for
// them (the entry programs run the generation until the links move).
void Rollout::compile_entries() {
    owner_only("compile_entries");
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
        if (auto why = current_->refusal(key.hook, key.ifname); !why.empty())
            spdlog::warn(
                "{}: the kernel refused the compiled entry, the entry program runs the "
                "chain: {}",
                key.pin_name(), why);
        const int fd = current_->entry_fd(key.hook, key.ifname);
        if (!current_->compiled(key.hook, key.ifname) || link->runs(fd)) continue;
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

void Rollout::write_steps(const std::vector<lua::StepWrite>& writes) {
    owner_only("write_steps");
    for (const auto& w : writes) {
        if (!current_ || w.generation != current_->number()) continue;  // replaced since
        const auto& steps = current_->chains().steps;
        if (w.pc >= steps.size() || steps[w.pc].prog != MPS_ACT_SET_BACKUP) continue;
        mps_step st = steps[w.pc];
        st.p.backup.backup = w.backup;
        try {
            current_->write_step(w.pc, st);
        } catch (const std::exception& e) {
            spdlog::error("generation {}: writing step {}: {}", w.generation, w.pc, e.what());
            continue;
        }
        // Subflows quiet for 200 ms carry no pure ACK the actor could grow: send the MP_PRIO
        // from the actor's template (bpf/ACTORS.md); busy ones get it from the datapath.
        try {
            datapath::ActorMaps::of(*current_).signal_prio(uint16_t(w.pc), w.backup, 200'000'000);
        } catch (const std::exception& e) {
            spdlog::warn("set_policy_backup: signalling idle subflows: {}", e.what());
        }
    }
}

std::optional<lua::RunningGeneration> Rollout::running_generation() const {
    if (!current_) return std::nullopt;
    return lua::RunningGeneration{current_->number(), current_->chains()};
}

void Rollout::retire(std::unique_ptr<Generation>& g) {
    if (!g) return;
    for (const auto& [name, c] : policy_counters(*g)) retired_[name] += c;
    try {
        auto gc = g->gen_counters();
        for (int i = 0; i < MPS_GC_MAX; ++i) retired_gen_.values[i] += gc.values[i];
    } catch (const std::exception&) {}
    g.reset();
}

// After an upgrade moved every link onto this build's datapath: once no packet can still be
// inside the old programs, drop their pins (and with them the old prog arrays).
void Rollout::remove_stale_datapaths() {
    dp_->quiesce(true);
    std::error_code ec;
    for (const auto& entry : fs::directory_iterator(cfg_.pin_root + "/dp", ec))
        if (entry.path() != dp_dir()) fs::remove_all(entry.path(), ec);
}

std::map<std::string, PolicyCounters> Rollout::policy_counters(const Generation& g) const {
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

// Totals since the agent started (earlier generations included); missed_tail_calls (the
// Degraded condition) is the running generation's only.
void Rollout::start_balancer(const std::optional<manifest::Balancer>& spec) {
    owner_only("start_balancer");
    auto plan = balancer_.prepare(spec);
    for (const auto& i : plan.spec ? plan.spec->interfaces : std::vector<std::string>{})
        if (links_.count({i, Hook::xdp}))
            throw std::runtime_error("balancer '" + spec->name + "': " + i +
                                     " runs the policies' XDP entry");
    balancer_.commit(std::move(plan));
}

DatapathStatus Rollout::report() const {
    DatapathStatus r;
    r.balancer = balancer_.status();
    r.running = current_ != nullptr;
    r.generation = current_ ? current_->number() : 0;
    std::map<std::string, PolicyCounters> pols = retired_;
    r.totals = retired_gen_;
    if (current_) {
        for (const auto* gen : {current_.get(), previous_.get()}) {
            if (!gen) continue;
            for (const auto& [name, c] : policy_counters(*gen)) pols[name] += c;
            try {
                auto gc = gen->gen_counters();
                for (int i = 0; i < MPS_GC_MAX; ++i) r.totals.values[i] += gc.values[i];
                if (gen == current_.get()) r.missed_tail_calls = gc.values[MPS_GC_MISSED_TAIL_CALL];
            } catch (const std::exception&) {}
        }
        std::set<std::string> active(current_->chains().policies.begin(),
                                     current_->chains().policies.end());
        for (auto& [name, c] : pols)
            if (active.count(name)) r.policies[name] = c;
    }
    for (const auto& [k, l] : links_) {
        auto& link = r.links.emplace_back();
        link.interface = k.ifname;
        link.hook = datapath::to_string(k.hook);
        link.mode = l->mode();
        if (current_) {
            link.compiled = current_->compiled(k.hook, k.ifname) &&
                            l->runs(current_->entry_fd(k.hook, k.ifname));
            link.refused = current_->refusal(k.hook, k.ifname);
        }
    }
    const auto now = std::chrono::steady_clock::now();
    if (tables_.empty() || now - tables_counted_ >= kTableCountPeriod) {
        tables_counted_ = now;
        try {
            auto counted = state_.tables(true);
            // Evictions never go backwards (an insert made during a walk may be read late).
            for (auto& t : counted)
                for (const auto& was : tables_)
                    if (was.name == t.name && was.evictions && t.evictions)
                        t.evictions = std::max(*t.evictions, *was.evictions);
            tables_ = std::move(counted);
        } catch (const std::exception& e) {
            spdlog::warn("counting the state tables: {}", e.what());
        }
    }
    r.tables = tables_;
    return r;
}

void Rollout::release_links(bool detach) {
    owner_only("release_links");
    if (detach) {
        for (auto& [k, l] : links_) l->detach();
        links_.clear();
        balancer_.detach();
    } else {
        for (auto& [k, l] : links_) l->release();  // pinned: the datapath keeps running
    }
}

void Rollout::remove_pins(const std::string& pin_root) {
    BalancerHost::remove_pins(pin_root + "/lb");
    for (const auto& name : datapath::detach_pinned_links(pin_root + "/links"))
        spdlog::info("detached {}", name);
    std::error_code ec;
    fs::remove_all(pin_root, ec);
}

}  // namespace mpsteer::agent
