// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The plan model (what a generation runs, stored in applied.json) and the diff `mpsteer plan`
// prints: policies (and the balancer) added, changed and removed, and per hook the chain of
// steps.
#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "compile/compile.h"

namespace mpsteer::compile {

using nlohmann::json;

namespace {

std::string hex(const void* p, size_t n) {
    static const char* digits = "0123456789abcdef";
    std::string out;
    for (size_t i = 0; i < n; ++i) {
        uint8_t b = static_cast<const uint8_t*>(p)[i];
        out += digits[b >> 4];
        out += digits[b & 15];
    }
    return out;
}

bool unhex(const std::string& s, void* p, size_t n) {
    if (s.size() != 2 * n) return false;
    auto val = [](char c) -> int {
        if (c >= '0' && c <= '9') return c - '0';
        if (c >= 'a' && c <= 'f') return c - 'a' + 10;
        return -1;
    };
    for (size_t i = 0; i < n; ++i) {
        int hi = val(s[2 * i]), lo = val(s[2 * i + 1]);
        if (hi < 0 || lo < 0) return false;
        static_cast<uint8_t*>(p)[i] = uint8_t(hi << 4 | lo);
    }
    return true;
}

datapath::Hook hook_of(const json& j) {
    auto h = hook_from_string(j.get<std::string>());
    if (!h) throw Error("unknown hook " + j.dump());
    return *h;
}

std::string rel(uint16_t pc, uint16_t base) {
    return pc == MPS_PC_END ? "end" : "+" + std::to_string(int(pc) - int(base));
}

json balancer_json(const manifest::Balancer& b) {
    json services = json::array(), backends = json::array();
    for (const auto& s : b.services)
        services.push_back(manifest::to_string(s.vip) + " port " + std::to_string(s.port));
    for (const auto& be : b.backends)
        backends.push_back({{"name", be.name},
                            {"mac", hex(be.mac.data(), be.mac.size())},
                            {"interface", be.interface},
                            {"weight", be.weight},
                            {"draining", be.draining}});
    return {{"name", b.name},
            {"interfaces", b.interfaces},
            {"services", services},
            {"backends", backends},
            {"unknown_token", b.reset_unknown_tokens ? "reset" : "drop"},
            {"tables", {{"subflows", b.subflow_table}, {"tokens", b.token_table}}}};
}

}  // namespace

PlanModel make_plan_model(const manifest::Model& model, const Output& out, std::string revision) {
    PlanModel m;
    m.revision = std::move(revision);
    if (model.balancer) m.balancer = balancer_json(*model.balancer).dump();
    for (const auto& p : model.policies) {
        PlanPolicy pp{p.name, p.canonical, {}, p.priority};
        for (auto h : p.hooks) pp.hooks.emplace_back(to_string(h));
        m.policies.push_back(std::move(pp));
    }
    std::sort(m.policies.begin(), m.policies.end(),
              [](const auto& a, const auto& b) { return a.name < b.name; });
    m.chains = out.chains;
    m.step_text = out.step_text;
    return m;
}

json to_json(const PlanModel& m) {
    json j;
    j["format"] = 1;
    j["revision"] = m.revision;
    j["policies"] = json::array();
    for (const auto& p : m.policies)
        j["policies"].push_back({{"name", p.name},
                                 {"priority", p.priority},
                                 {"hooks", p.hooks},
                                 {"canonical", p.canonical}});
    if (!m.balancer.empty()) j["balancer"] = json::parse(m.balancer);
    j["policy_table"] = m.chains.policies;
    j["steps"] = json::array();
    for (size_t pc = 0; pc < m.chains.steps.size(); ++pc) {
        const auto& s = m.chains.steps[pc];
        j["steps"].push_back({{"pc", pc},
                              {"prog", datapath::prog_name(mps_prog(s.prog))},
                              {"on_match", s.on_match},
                              {"on_miss", s.on_miss},
                              {"policy", s.policy},
                              {"flags", s.flags},
                              {"text", pc < m.step_text.size() ? m.step_text[pc] : ""},
                              {"raw", hex(&s, sizeof s)}});
    }
    j["entries"] = json::array();
    for (const auto& e : m.chains.entries)
        j["entries"].push_back({{"hook", to_string(e.hook)}, {"ifname", e.ifname}, {"pc", e.pc}});
    j["attachments"] = json::array();
    for (const auto& a : m.chains.attachments)
        j["attachments"].push_back({{"hook", datapath::to_string(a.hook)}, {"ifname", a.ifname}});
    j["learning_hooks"] = json::array();
    for (auto h : m.chains.learning_hooks) j["learning_hooks"].push_back(to_string(h));
    j["step_ifnames"] = json::array();
    for (const auto& [pc, name] : m.chains.step_ifnames)
        j["step_ifnames"].push_back({{"pc", pc}, {"ifname", name}});
    return j;
}

PlanModel plan_model_from_json(const json& j) {
    try {
        if (j.at("format").get<int>() != 1) throw Error("unsupported applied-state format");
        PlanModel m;
        m.revision = j.at("revision").get<std::string>();
        for (const auto& p : j.at("policies"))
            m.policies.push_back({p.at("name"), p.at("canonical"),
                                  p.at("hooks").get<std::vector<std::string>>(),
                                  p.at("priority").get<uint32_t>()});
        if (j.contains("balancer")) m.balancer = j.at("balancer").dump();
        m.chains.policies = j.at("policy_table").get<std::vector<std::string>>();
        for (const auto& s : j.at("steps")) {
            mps_step st;
            if (!unhex(s.at("raw").get<std::string>(), &st, sizeof st))
                throw Error("step " + s.at("pc").dump() + ": bad raw encoding");
            m.chains.steps.push_back(st);
            m.step_text.push_back(s.at("text"));
        }
        for (const auto& e : j.at("entries"))
            m.chains.entries.push_back({hook_of(e.at("hook")), e.at("ifname"), e.at("pc")});
        for (const auto& a : j.at("attachments"))
            m.chains.attachments.push_back({a.at("ifname"), hook_of(a.at("hook"))});
        for (const auto& h : j.value("learning_hooks", json::array()))
            m.chains.learning_hooks.push_back(hook_of(h));
        for (const auto& s : j.at("step_ifnames"))
            m.chains.step_ifnames.emplace_back(s.at("pc").get<uint16_t>(), s.at("ifname"));
        return m;
    } catch (const json::exception& e) {
        throw Error(std::string("malformed applied state: ") + e.what());
    }
}

std::optional<PlanModel> read_applied(const std::string& path) {
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) return std::nullopt;
    std::ifstream in(path);
    if (!in) throw Error("cannot read " + path);
    try {
        return plan_model_from_json(json::parse(in));
    } catch (const json::exception& e) {
        throw Error(path + ": " + e.what());
    } catch (const Error& e) {
        throw Error(path + ": " + e.what());
    }
}

std::vector<std::string> entry_lines(const PlanModel& m, const datapath::EntryPoint& e) {
    // The steps reachable from the entry, in pc order (an entry's steps are contiguous).
    const auto& steps = m.chains.steps;
    std::set<uint16_t> seen;
    std::vector<uint16_t> todo{e.pc};
    while (!todo.empty()) {
        uint16_t pc = todo.back();
        todo.pop_back();
        if (pc == MPS_PC_END || pc >= steps.size() || !seen.insert(pc).second) continue;
        todo.push_back(steps[pc].on_match);
        if (!MPS_PROG_IS_ACTOR(steps[pc].prog)) todo.push_back(steps[pc].on_miss);
    }
    std::vector<std::string> lines;
    for (uint16_t pc : seen) {
        const auto& s = steps[pc];
        std::string l = rel(pc, e.pc) + " " + std::string(datapath::prog_name(mps_prog(s.prog)));
        if (pc < m.step_text.size() && !m.step_text[pc].empty()) l += " (" + m.step_text[pc] + ")";
        l += " match->" + rel(s.on_match, e.pc);
        if (!MPS_PROG_IS_ACTOR(s.prog)) l += " miss->" + rel(s.on_miss, e.pc);
        if (s.flags & MPS_STEPF_FAIL_DROP) l += " fail=drop";
        if (s.policy < m.chains.policies.size()) l += " [" + m.chains.policies[s.policy] + "]";
        lines.push_back(std::move(l));
    }
    return lines;
}

PlanDiff diff(const PlanModel& running, const PlanModel& next) {
    PlanDiff d;
    std::map<std::string, const PlanPolicy*> old_p, new_p;
    for (const auto& p : running.policies) old_p[p.name] = &p;
    for (const auto& p : next.policies) new_p[p.name] = &p;
    for (const auto& [name, p] : new_p) {
        auto it = old_p.find(name);
        if (it == old_p.end())
            d.added.push_back(name);
        else if (it->second->canonical != p->canonical)
            d.changed.push_back(name);
        else
            d.unchanged.push_back(name);
    }
    for (const auto& [name, p] : old_p)
        if (!new_p.count(name)) d.removed.push_back(name);
    if (!running.balancer.empty() || !next.balancer.empty()) {
        d.balancer = running.balancer.empty()            ? "added"
                     : next.balancer.empty()             ? "removed"
                     : running.balancer == next.balancer ? "unchanged"
                                                         : "changed";
        d.balancer_name =
            json::parse(next.balancer.empty() ? running.balancer : next.balancer).value("name", "");
    }

    using Key = std::pair<uint8_t, std::string>;
    std::map<Key, const datapath::EntryPoint*> old_e, new_e;
    for (const auto& e : running.chains.entries) old_e[{uint8_t(e.hook), e.ifname}] = &e;
    for (const auto& e : next.chains.entries) new_e[{uint8_t(e.hook), e.ifname}] = &e;
    std::set<Key> keys;
    for (const auto& [k, _] : old_e) keys.insert(k);
    for (const auto& [k, _] : new_e) keys.insert(k);
    for (const auto& k : keys) {
        HookPlan h;
        h.hook = std::string(datapath::to_string(datapath::Hook(k.first)));
        h.ifname = k.second;
        auto o = old_e.find(k);
        auto n = new_e.find(k);
        if (o == old_e.end()) {
            h.status = "added";
            h.steps = entry_lines(next, *n->second);
        } else if (n == new_e.end()) {
            h.status = "removed";
            h.steps = entry_lines(running, *o->second);
        } else {
            h.steps = entry_lines(next, *n->second);
            auto before = entry_lines(running, *o->second);
            h.status = before == h.steps ? "unchanged" : "changed";
            if (h.status == "changed") h.old_steps = std::move(before);
        }
        d.hooks.push_back(std::move(h));
    }
    const auto& learn = next.chains.learning_hooks;
    for (const auto& a : next.chains.attachments)
        if (std::find(learn.begin(), learn.end(), a.hook) != learn.end() &&
            !new_e.count({uint8_t(a.hook), a.ifname}))
            d.learning.push_back(a);
    return d;
}

std::string to_text(const PlanDiff& d) {
    std::ostringstream o;
    auto list = [&](const char* sign, const char* what, const std::vector<std::string>& names) {
        for (const auto& n : names) o << sign << " policy " << n << " (" << what << ")\n";
    };
    list("+", "added", d.added);
    list("~", "changed", d.changed);
    list("-", "removed", d.removed);
    if (!d.balancer.empty() && d.balancer != "unchanged")
        o << (d.balancer == "added"     ? "+"
              : d.balancer == "removed" ? "-"
                                        : "~")
          << " balancer " << d.balancer_name << " (" << d.balancer << ")\n";
    if (d.empty()) o << "no policy changes\n";
    for (const auto& h : d.hooks) {
        o << "\nhook " << h.hook << " on " << (h.ifname.empty() ? "every interface" : h.ifname)
          << ": " << h.status << " (" << h.steps.size() << " steps)\n";
        if (h.status == "changed") {
            for (const auto& l : h.old_steps) o << "  - " << l << '\n';
            for (const auto& l : h.steps) o << "  + " << l << '\n';
        } else {
            const char* sign = h.status == "added"     ? "  + "
                               : h.status == "removed" ? "  - "
                                                       : "    ";
            for (const auto& l : h.steps) o << sign << l << '\n';
        }
    }
    for (const auto& a : d.learning)
        o << "\nhook " << datapath::to_string(a.hook) << " on "
          << (a.ifname.empty() ? "every interface" : a.ifname)
          << ": learns handshakes only (rate_limit reads both SYNs' window scale)\n";
    o << "\n"
      << d.added.size() << " to add, " << d.changed.size() << " to change, " << d.removed.size()
      << " to remove, " << d.unchanged.size() << " unchanged\n";
    return o.str();
}

json to_json(const PlanDiff& d) {
    json j;
    j["added"] = d.added;
    j["changed"] = d.changed;
    j["removed"] = d.removed;
    j["unchanged"] = d.unchanged;
    if (!d.balancer.empty()) j["balancer"] = {{"name", d.balancer_name}, {"status", d.balancer}};
    j["hooks"] = json::array();
    for (const auto& h : d.hooks) {
        json x = {{"hook", h.hook}, {"ifname", h.ifname}, {"status", h.status}, {"steps", h.steps}};
        if (h.status == "changed") x["old_steps"] = h.old_steps;
        j["hooks"].push_back(std::move(x));
    }
    j["learning"] = json::array();
    for (const auto& a : d.learning)
        j["learning"].push_back({{"hook", datapath::to_string(a.hook)}, {"ifname", a.ifname}});
    return j;
}

}  // namespace mpsteer::compile
