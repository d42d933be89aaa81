// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// From schema-valid documents to the model: names registered, shared building blocks
// checked once where they are defined, policies built and inlined, then the checks that need
// several documents (unique names, priorities per hook, chain length, unused blocks).
#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "manifest/checker.h"
#include "mpsteer/abi.h"

namespace mpsteer::manifest::detail {

using nlohmann::json;
namespace fs = std::filesystem;

std::string fmt_pos(const Position& p) {
    return p.file + ":" + std::to_string(p.line) + ":" + std::to_string(p.col);
}

namespace {

constexpr size_t kMaxChain = MPS_MAX_CHAIN;  // steps one packet may run through

// A problem that depends on the policy an action runs in: at the action, or at the policy's
// `action_chain:` entry that brought it in, with the action's own place as a note.
void context_error(Checker& ck, const Action& a, std::string msg) {
    if (a.via_chain.empty()) return ck.error_at(a.pos, a.pointer, std::move(msg));
    ck.error_at(a.via_pos, a.via_pointer,
                msg + "; note: from action chain '" + a.via_chain + "', the action is at " +
                    fmt_pos(a.pos));
}

// The semantic checks of the parts of a schema-invalid document that the schema accepted:
// each selector, action and interface name with no schema error at or below it.
void check_accepted_parts(Checker& ck, const Doc& d, const std::set<std::string>& bad) {
    auto clean = [&](const std::string& p) {
        if (bad.count(p)) return false;
        auto below = bad.lower_bound(p + "/");  // sorted: anything under p comes next
        return below == bad.end() || !below->starts_with(p + "/");
    };
    auto each = [&](const std::string& list, auto&& check) {
        const json* l = nullptr;
        try {
            l = &d.json.at(json::json_pointer(list));
        } catch (const json::exception&) {
            return;
        }
        if (!l->is_array()) return;
        for (size_t i = 0; i < l->size(); ++i) {
            std::string p = pointer_join(list, i);
            if (clean(p)) check(p, (*l)[i]);
        }
    };
    // Only the lists the kind's schema defines: an item under a property the schema refused
    // (its error is at the parent) was never checked against an item schema.
    const std::string& kind = d.json["kind"].get_ref<const std::string&>();
    if (kind != "ActionChain")
        each("/spec/select", [&](const std::string& p, const json& item) {
            if (item.is_object() && item.size() == 1) ck.selector(d, p, item);
        });
    if (kind != "SelectorSet")
        each("/spec/actions", [&](const std::string& p, const json& item) {
            if (item.is_object() && item.size() == 1) ck.action(d, p, item);
        });
    if (kind == "Policy")
        each("/spec/attach/interfaces", [&](const std::string& p, const json& item) {
            if (item.is_string()) ck.check_interface(d, p, item);
        });
}

json canonical(const Policy& p) {
    json j;
    j["name"] = p.name;
    j["interfaces"] = p.interfaces;
    json hooks = json::array();
    for (auto h : p.hooks) hooks.push_back(std::string(to_string(h)));
    j["hooks"] = hooks;
    j["priority"] = p.priority;
    j["failure_mode"] = p.failure_mode == FailureMode::drop ? "drop" : "pass";
    j["continue"] = p.cont;
    json sel = json::array(), act = json::array();
    for (const auto& s : p.select) sel.push_back(s.describe());
    for (const auto& a : p.actions) act.push_back(a.describe());
    j["select"] = sel;
    j["actions"] = act;
    if (p.lua)
        j["hooks_lua"] = {{"script", p.lua->script},
                          {"every_ms", p.lua->every_ms},
                          {"idle_every_ms", p.lua->idle_every_ms},
                          {"params", p.lua->params}};
    return j;
}

const std::string kScriptPointer = "/spec/hooks/script";

// A Policy's `spec.hooks.script` when it is a string.
const json* script_of(const Doc& d) {
    const json& j = d.json;
    if (!j.is_object() || j.value("kind", json()) != "Policy") return nullptr;
    auto spec = j.find("spec");
    if (spec == j.end() || !spec->is_object()) return nullptr;
    auto hooks = spec->find("hooks");
    if (hooks == spec->end() || !hooks->is_object()) return nullptr;
    auto script = hooks->find("script");
    return script != hooks->end() && script->is_string() ? &*script : nullptr;
}

bool overlap(const std::vector<std::string>& a, const std::vector<std::string>& b) {
    if (a.empty() || b.empty()) return true;  // empty: every interface
    return std::any_of(a.begin(), a.end(), [&](const std::string& x) {
        return std::binary_search(b.begin(), b.end(), x);
    });
}

}  // namespace

Result load_docs(std::vector<Doc> docs, std::vector<Diagnostic> diags,
                 std::vector<std::string> files, const Options& opts, const ScriptReader& scripts) {
    Result result;
    Checker ck{opts, diags, std::nullopt, false};

    // Schema first; a document that fails it still reserves its name so that references to
    // it do not produce a second, misleading error.
    std::map<std::string, Named> policy_names, set_names, chain_names, balancer_names;
    std::set<const Doc*> script_refused;  // by the schema
    for (const auto& d : docs) {
        size_t before = diags.size();
        bool valid = schema_validate(d, diags);
        for (size_t i = before; i < diags.size(); ++i)
            if (diags[i].pointer == kScriptPointer) script_refused.insert(&d);
        const json& j = d.json;
        if (!valid && j.is_object() && j.contains("kind") &&
            (j["kind"] == "Policy" || j["kind"] == "SelectorSet" || j["kind"] == "ActionChain")) {
            std::set<std::string> bad;
            for (size_t i = before; i < diags.size(); ++i) bad.insert(diags[i].pointer);
            check_accepted_parts(ck, d, bad);
        }
        if (!j.is_object() || !j.contains("kind") || !j["kind"].is_string() ||
            !j.contains("metadata") || !j["metadata"].is_object() ||
            !j["metadata"].contains("name") || !j["metadata"]["name"].is_string())
            continue;
        const std::string& kind = j["kind"].get_ref<const std::string&>();
        auto* names = kind == "Policy"        ? &policy_names
                      : kind == "SelectorSet" ? &set_names
                      : kind == "ActionChain" ? &chain_names
                      : kind == "Balancer"    ? &balancer_names
                                              : nullptr;
        if (!names) continue;
        std::string name = j["metadata"]["name"];
        if (names == &balancer_names && !balancer_names.empty() && !balancer_names.count(name)) {
            const auto& first = *balancer_names.begin();
            ck.error(d, "/metadata/name",
                     "a revision runs one balancer; '" + first.first + "' is defined at " +
                         fmt_pos(first.second.doc->root) +
                         " (one balancer takes several services and backends)");
            continue;
        }
        auto [it, fresh] = names->emplace(name, Named{&d, valid});
        if (!fresh) {
            std::string what = kind == "Policy"        ? "policy"
                               : kind == "SelectorSet" ? "selector set"
                               : kind == "ActionChain" ? "action chain"
                                                       : "balancer";
            ck.error(
                d, "/metadata/name",
                what + " '" + name + "' is already defined at " + fmt_pos(it->second.doc->root));
        }
    }

    // Every policy's script, whatever else is wrong with it or with other documents.
    std::map<const Doc*, ScriptFile> found_scripts;
    for (const auto& d : docs) {
        const json* script = script_of(d);
        if (!script || script_refused.count(&d)) continue;
        const std::string& name = script->get_ref<const std::string&>();
        fs::path sp(name);
        if (std::any_of(sp.begin(), sp.end(), [](const fs::path& c) { return c == ".."; })) {
            ck.error(d, kScriptPointer,
                     "script path must stay inside the repository (no '..' components)");
            continue;
        }
        if (!scripts) continue;
        std::string why;
        if (auto f = scripts(d.file, name, why))
            found_scripts.emplace(&d, std::move(*f));
        else
            ck.error(d, kScriptPointer, "script '" + name + "' " + why);
    }

    // Bodies of the shared building blocks, each checked once where it is defined.
    std::map<std::string, std::optional<std::vector<Selector>>> sets;
    std::map<std::string, std::optional<std::vector<Action>>> chains;
    for (auto& [name, n] : set_names)
        sets[name] = n.valid ? ck.selectors(*n.doc, "/spec/select") : std::nullopt;
    for (auto& [name, n] : chain_names)
        chains[name] = n.valid ? ck.actions(*n.doc, "/spec/actions") : std::nullopt;
    Resolver rs{ck, set_names, chain_names, sets, chains};
    for (auto& [name, body] : sets) {
        if (!body) continue;
        std::vector<std::string> stack{name};
        auto copy = *body;
        for (auto& s : copy) rs.selector(s, stack);
        set_names[name].used = false;  // only policies count as users
    }
    for (auto& [name, body] : chains) {
        if (!body) continue;
        std::vector<std::string> stack{name};
        auto copy = *body;
        rs.actions(copy, stack);
    }
    for (auto& [name, n] : set_names) n.used = false;
    for (auto& [name, n] : chain_names) n.used = false;

    // Policies, in name order.
    std::vector<std::pair<Policy, const Doc*>> policies;
    size_t hook_scripts = 0;
    for (auto& [name, n] : policy_names) {
        if (!n.valid) continue;
        const Doc& d = *n.doc;
        auto p = ck.policy(d);
        if (!p) continue;
        if (p->lua) {
            if (auto f = found_scripts.find(&d); f != found_scripts.end()) {
                p->lua->path = f->second.path;
                p->lua->source = std::move(f->second.source);
            }
        }
        bool ok = true;
        std::vector<std::string> stack;
        for (auto& s : p->select) ok = rs.selector(s, stack) && ok;
        ok = rs.actions(p->actions, stack) && ok;
        if (!ok) continue;
        // Flatten included sets at the top level: the list is an AND already.
        std::vector<Selector> flat;
        for (auto& s : p->select) {
            if (s.kind == Selector::Kind::all)
                for (auto& c : s.children) flat.push_back(std::move(c));
            else
                flat.push_back(std::move(s));
        }
        p->select = std::move(flat);

        // Actor applicability and reachability.
        for (size_t i = 0; i < p->actions.size(); ++i) {
            const Action& a = p->actions[i];
            for (auto h : p->hooks) {
                if (applicable(a.kind, h)) continue;
                std::string where;
                for (auto allowed : allowed_hooks(a.kind))
                    where += (where.empty() ? "" : " or ") + std::string(to_string(allowed));
                context_error(ck, a,
                              "action '" + std::string(to_string(a.kind)) +
                                  "' cannot run on hook '" + std::string(to_string(h)) +
                                  "' of policy '" + p->name + "' (use " + where + ")");
                ok = false;
            }
            if (i > 0 && ends_chain(p->actions[i - 1].kind)) {
                context_error(ck, a,
                              "action '" + std::string(to_string(a.kind)) +
                                  "' is never reached: '" +
                                  std::string(to_string(p->actions[i - 1].kind)) +
                                  "' before it ends the chain");
                ok = false;
            }
        }
        if (p->cont && ends_chain(p->actions.back().kind))
            ck.warning(d, "/spec/continue",
                       "'continue' has no effect after '" +
                           std::string(to_string(p->actions.back().kind)) + "'");
        if (p->steps() > kMaxChain) {
            ck.error(d, "/spec",
                     "policy needs " + std::to_string(p->steps()) +
                         " steps; a packet may run through at most " + std::to_string(kMaxChain));
            ok = false;
        }
        if (p->lua && ++hook_scripts > kMaxHookScripts) {
            ck.error(d, "/spec/hooks",
                     "policy '" + p->name + "' has the revision's hook script number " +
                         std::to_string(hook_scripts) + "; a revision may have at most " +
                         std::to_string(kMaxHookScripts) + " (they share one process)");
            ok = false;
        }
        if (!ok) continue;
        p->canonical = canonical(*p).dump();
        policies.emplace_back(std::move(*p), &d);
    }

    // The balancer, and its interfaces' XDP hook: the balancer's alone.
    for (auto& [name, n] : balancer_names) {
        if (!n.valid) continue;
        result.model.balancer = ck.balancer(*n.doc);
        if (!result.model.balancer) continue;
        const auto& lb_ifs = result.model.balancer->interfaces;
        for (const auto& [p, d] : policies) {
            if (!std::binary_search(p.hooks.begin(), p.hooks.end(), Hook::xdp) ||
                p.interfaces.empty())
                continue;  // on every managed interface: the balancer's are left out
            for (const auto& i : p.interfaces)
                if (std::binary_search(lb_ifs.begin(), lb_ifs.end(), i)) {
                    ck.error(*d, "/spec/attach",
                             "policy '" + p.name + "' attaches xdp to '" + i +
                                 "', where balancer '" + name + "' (" +
                                 fmt_pos(result.model.balancer->pos) +
                                 ") runs; use tc_ingress there");
                    break;
                }
        }
    }

    // Priorities: unique among policies that can meet on one hook and interface.
    std::sort(policies.begin(), policies.end(),
              [](const auto& a, const auto& b) { return a.first.pos < b.first.pos; });
    std::set<std::string> conflicted;
    for (size_t i = 0; i < policies.size(); ++i) {
        for (size_t j = 0; j < i; ++j) {
            const Policy& a = policies[j].first;
            const Policy& b = policies[i].first;
            if (a.priority != b.priority || !overlap(a.interfaces, b.interfaces)) continue;
            for (auto h : b.hooks) {
                if (!std::binary_search(a.hooks.begin(), a.hooks.end(), h)) continue;
                ck.error(*policies[i].second, "/spec/priority",
                         "priority " + std::to_string(b.priority) + " on hook '" +
                             std::string(to_string(h)) + "' is already used by policy '" + a.name +
                             "' (" + fmt_pos(a.pos) + ")");
                conflicted.insert(b.name);
                break;
            }
        }
    }

    // Chain length per hook and interface: a miss falls through to the next policy, and a
    // policy with `continue` goes on after its actions.
    std::sort(policies.begin(), policies.end(), [](const auto& a, const auto& b) {
        return std::tie(a.first.priority, a.first.name) < std::tie(b.first.priority, b.first.name);
    });
    for (auto h : kHooks) {
        std::set<std::string> ifnames{""};
        for (const auto& [p, _] : policies)
            if (std::binary_search(p.hooks.begin(), p.hooks.end(), h))
                ifnames.insert(p.interfaces.begin(), p.interfaces.end());
        std::set<std::string> reported;
        for (const auto& ifn : ifnames) {
            std::vector<const std::pair<Policy, const Doc*>*> chain;
            for (const auto& e : policies) {
                const Policy& p = e.first;
                if (!std::binary_search(p.hooks.begin(), p.hooks.end(), h)) continue;
                bool on = p.interfaces.empty() ||
                          std::binary_search(p.interfaces.begin(), p.interfaces.end(), ifn);
                if (on) chain.push_back(&e);
            }
            // A policy that selects everything and ends the chain hides the ones after it.
            for (size_t k = 0; k + 1 < chain.size(); ++k) {
                const Policy& p = chain[k]->first;
                if (!p.select.empty() || (p.cont && !ends_chain(p.actions.back().kind))) continue;
                for (size_t later = k + 1; later < chain.size(); ++later)
                    ck.warning(*chain[later]->second, "/spec/priority",
                               "never runs on hook '" + std::string(to_string(h)) + "': policy '" +
                                   p.name + "' before it selects every packet and ends the chain");
                break;
            }
            size_t longest = 0;
            for (size_t k = chain.size(); k-- > 0;) {
                const Policy& p = chain[k]->first;
                size_t sel = p.steps() - p.actions.size();
                bool goes_on = p.cont && !ends_chain(p.actions.back().kind);
                longest = sel + std::max(p.actions.size() + (goes_on ? longest : 0), longest);
                if (longest > kMaxChain && p.steps() <= kMaxChain && !reported.count(p.name)) {
                    reported.insert(p.name);
                    ck.error(*chain[k]->second, "/spec/priority",
                             "on hook '" + std::string(to_string(h)) + "'" +
                                 (ifn.empty() ? "" : " interface '" + ifn + "'") +
                                 " a packet may run through " + std::to_string(longest) +
                                 " steps from this policy on; at most " +
                                 std::to_string(kMaxChain));
                    break;
                }
            }
        }
    }

    for (auto& [name, n] : set_names)
        if (!n.used && n.valid)
            ck.warning(*n.doc, "/metadata/name",
                       "selector set '" + name + "' is not used by any policy");
    for (auto& [name, n] : chain_names)
        if (!n.used && n.valid)
            ck.warning(*n.doc, "/metadata/name",
                       "action chain '" + name + "' is not used by any policy");

    std::sort(policies.begin(), policies.end(),
              [](const auto& a, const auto& b) { return a.first.name < b.first.name; });
    for (auto& [p, _] : policies) result.model.policies.push_back(std::move(p));
    sort_diagnostics(diags);
    result.diagnostics = std::move(diags);
    result.files = std::move(files);
    // A model is only handed out whole: with any error the caller must not compile it.
    if (!result.ok()) {
        result.model.policies.clear();
        result.model.balancer.reset();
    }
    return result;
}

}  // namespace mpsteer::manifest::detail
