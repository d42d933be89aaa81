// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// References to shared building blocks: `selector_set: NAME` and `action_chain: NAME`
// inlined into the referring list, with unknown names and cycles reported at the reference.
#include <algorithm>

#include "manifest/checker.h"

namespace mpsteer::manifest::detail {

std::string Resolver::suggest(const std::string& name, const std::map<std::string, Named>& names) {
    std::vector<std::string> cands;
    for (const auto& [n, _] : names) cands.push_back(n);
    std::string near = closest(name, cands);
    return near.empty() ? "" : "; did you mean '" + near + "'?";
}

bool Resolver::selector(Selector& s, std::vector<std::string>& stack) {
    if (s.kind == Selector::Kind::ref) {
        auto named = set_names.find(s.ref);
        if (named == set_names.end()) {
            ck.error_at(s.pos, s.pointer,
                        "unknown selector set '" + s.ref + "'" + suggest(s.ref, set_names));
            return false;
        }
        named->second.used = true;
        if (std::find(stack.begin(), stack.end(), s.ref) != stack.end()) {
            std::string path;
            for (const auto& n : stack) path += n + " -> ";
            ck.error_at(s.pos, s.pointer,
                        "selector set '" + s.ref + "' includes itself (" + path + s.ref + ")");
            return false;
        }
        const auto& body = sets[s.ref];
        if (!body) return false;  // its own errors are reported where it is defined
        stack.push_back(s.ref);
        Selector all;
        all.kind = Selector::Kind::all;
        all.pos = s.pos;
        all.children = *body;
        bool ok = true;
        for (auto& c : all.children) ok = selector(c, stack) && ok;
        stack.pop_back();
        s = std::move(all);
        return ok;
    }
    bool ok = true;
    for (auto& c : s.children) ok = selector(c, stack) && ok;
    return ok;
}

bool Resolver::actions(std::vector<Action>& list, std::vector<std::string>& stack) {
    std::vector<Action> out;
    bool ok = true;
    for (auto& a : list) {
        if (a.kind != Action::Kind::ref) {
            out.push_back(std::move(a));
            continue;
        }
        auto named = chain_names.find(a.ref);
        if (named == chain_names.end()) {
            ck.error_at(a.pos, a.pointer,
                        "unknown action chain '" + a.ref + "'" + suggest(a.ref, chain_names));
            ok = false;
            continue;
        }
        named->second.used = true;
        if (std::find(stack.begin(), stack.end(), a.ref) != stack.end()) {
            std::string path;
            for (const auto& n : stack) path += n + " -> ";
            ck.error_at(a.pos, a.pointer,
                        "action chain '" + a.ref + "' includes itself (" + path + a.ref + ")");
            ok = false;
            continue;
        }
        const auto& body = chains[a.ref];
        if (!body) {
            ok = false;
            continue;
        }
        std::vector<Action> inner = *body;
        stack.push_back(a.ref);
        ok = actions(inner, stack) && ok;
        stack.pop_back();
        for (auto& x : inner) {
            x.via_pos = a.pos;
            x.via_pointer = a.pointer;
            x.via_chain = a.ref;
            out.push_back(std::move(x));
        }
    }
    list = std::move(out);
    return ok;
}
}  // namespace mpsteer::manifest::detail
