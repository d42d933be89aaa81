// From schema-valid documents to the model: parameters parsed and range-checked, references
// to selector sets and action chains inlined, then the checks that need several documents
// (unique names, priorities per hook, chain length, interfaces, scripts).
#include <algorithm>
#include <filesystem>
#include <map>
#include <set>

#include "manifest/internal.h"

namespace mpsteer::manifest::detail {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

constexpr size_t kMaxChain = 32;  // MPS_MAX_CHAIN: steps one packet may run through
constexpr uint64_t kMinRate = 125, kMaxRate = 50'000'000'000;  // 1kbit .. 400Gbit, in B/s
constexpr uint64_t kMaxRtt = 10'000'000;                       // 10 s
constexpr uint64_t kMinEvery = 10'000, kMaxEvery = 3'600'000'000;  // 10 ms .. 1 h
constexpr uint64_t kMaxWindow = 1u << 30;                       // TCP's largest window

std::string fmt_pos(const Position& p) {
    return p.file + ":" + std::to_string(p.line) + ":" + std::to_string(p.col);
}

struct Named {
    const Doc* doc = nullptr;
    bool valid = false;  // passed the schema
    bool used = false;
};

struct Checker {
    const Options& opts;
    std::vector<Diagnostic>& diags;

    void error(const Doc& d, const std::string& ptr, std::string msg) {
        diags.push_back({Severity::error, d.at(ptr), ptr.empty() ? "/" : ptr, std::move(msg)});
    }
    void error_at(const Position& p, const std::string& ptr, std::string msg) {
        diags.push_back({Severity::error, p, ptr.empty() ? "/" : ptr, std::move(msg)});
    }
    void warning(const Doc& d, const std::string& ptr, std::string msg) {
        diags.push_back({Severity::warning, d.at(ptr), ptr.empty() ? "/" : ptr, std::move(msg)});
    }

    // ---- parameters ---------------------------------------------------------------------

    std::optional<IpAddr> address(const Doc& d, const std::string& ptr, const std::string& s) {
        auto a = parse_ip(s);
        if (!a) error(d, ptr, "'" + s + "' is not an IPv4 or IPv6 address");
        return a;
    }

    bool cidr(const Doc& d, const std::string& ptr, const std::string& s, Selector& out) {
        auto slash = s.find('/');
        auto a = address(d, ptr, s.substr(0, slash));
        if (!a) return false;
        unsigned max = a->family == 4 ? 32 : 128, prefix = max;
        if (slash != std::string::npos) {
            prefix = unsigned(std::stoul(s.substr(slash + 1)));  // schema: 1-3 digits
            if (prefix > max) {
                error(d, ptr, "prefix /" + std::to_string(prefix) + " is longer than " +
                                  std::to_string(max) + " bits (IPv" +
                                  std::to_string(a->family) + ")");
                return false;
            }
        }
        IpAddr masked = *a;
        size_t len = a->family == 4 ? 4 : 16;
        for (size_t i = 0; i < len; ++i) {
            unsigned bits = prefix > i * 8 ? std::min(8u, unsigned(prefix - i * 8)) : 0;
            masked.bytes[i] &= uint8_t(0xff00u >> bits);
        }
        if (masked != *a) {
            error(d, ptr, "'" + s + "' has host bits set; did you mean " + to_string(masked) +
                              "/" + std::to_string(prefix) + "?");
            return false;
        }
        out.addr = masked;
        out.prefix = uint8_t(prefix);
        return true;
    }

    bool port_range(const Doc& d, const std::string& ptr, const json& v, uint16_t& lo,
                    uint16_t& hi) {
        if (v.is_number_integer()) {
            lo = hi = uint16_t(v.get<int64_t>());  // schema: 0..65535
            return true;
        }
        const std::string& s = v.get_ref<const std::string&>();
        auto dash = s.find('-');
        unsigned long a = std::stoul(s.substr(0, dash)), b = std::stoul(s.substr(dash + 1));
        if (a > 65535 || b > 65535) {
            error(d, ptr, "port " + std::to_string(a > 65535 ? a : b) +
                              " is out of range (0 to 65535)");
            return false;
        }
        if (a > b) {
            error(d, ptr, "port range '" + s + "' is empty (first port above last)");
            return false;
        }
        lo = uint16_t(a), hi = uint16_t(b);
        return true;
    }

    std::optional<uint64_t> size(const Doc& d, const std::string& ptr, const json& v) {
        if (v.is_number_integer()) return v.get<uint64_t>();  // schema: minimum 0
        const std::string& s = v.get_ref<const std::string&>();
        size_t i = 0;
        while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
        std::string unit = s.substr(i);
        uint64_t n = std::stoull(s.substr(0, i)), mul = 1;  // schema: at most 15 digits
        if (unit == "KB") mul = 1000;
        else if (unit == "MB") mul = 1000000;
        else if (unit == "GB") mul = 1000000000;
        else if (unit == "KiB") mul = 1ull << 10;
        else if (unit == "MiB") mul = 1ull << 20;
        else if (unit == "GiB") mul = 1ull << 30;
        if (n > UINT64_MAX / mul) {
            error(d, ptr, "'" + s + "' is too large");
            return std::nullopt;
        }
        return n * mul;
    }

    std::optional<uint64_t> duration(const Doc& d, const std::string& ptr, const std::string& s,
                                     uint64_t min_us, uint64_t max_us, const char* range) {
        auto us = parse_duration_us(s);
        if (!us || *us < min_us || *us > max_us) {
            error(d, ptr, "'" + s + "' is out of range (" + range + ")");
            return std::nullopt;
        }
        return us;
    }

    // ---- selectors and actions ----------------------------------------------------------

    std::optional<Selector> selector(const Doc& d, const std::string& ptr, const json& item) {
        // Schema: an object with exactly one known key.
        auto it = item.begin();
        const std::string& key = it.key();
        const json& v = it.value();
        std::string vp = pointer_join(ptr, key);
        Selector s;
        s.pos = d.key_at(vp);
        s.pointer = vp;
        bool ok = true;
        if (key == "src" || key == "dst") {
            s.kind = key == "src" ? Selector::Kind::src : Selector::Kind::dst;
            ok = cidr(d, vp, v, s);
        } else if (key == "ip_pair" || key == "subflow") {
            bool sub = key == "subflow";
            s.kind = sub ? Selector::Kind::subflow : Selector::Kind::ip_pair;
            auto addr_of = [&](const char* end) -> std::optional<IpAddr> {
                std::string p = pointer_join(vp, end);
                const json& e = v[end];
                if (sub) return address(d, pointer_join(p, "address"), e["address"]);
                return address(d, p, e);
            };
            auto a = addr_of("a"), b = addr_of("b");
            if (!a || !b) return std::nullopt;
            if (a->family != b->family) {
                error(d, pointer_join(vp, "b"), "'b' is IPv" + std::to_string(b->family) +
                                                    " but 'a' is IPv" +
                                                    std::to_string(a->family));
                return std::nullopt;
            }
            s.a = *a, s.b = *b;
            if (sub) {
                s.port_a = uint16_t(v["a"]["port"].get<int64_t>());
                s.port_b = uint16_t(v["b"]["port"].get<int64_t>());
            }
        } else if (key == "port") {
            s.kind = Selector::Kind::port;
            auto pit = v.begin();
            s.dir = pit.key() == "src" ? PortDir::src
                    : pit.key() == "dst" ? PortDir::dst
                                         : PortDir::either;
            ok = port_range(d, pointer_join(vp, pit.key()), pit.value(), s.port_lo, s.port_hi);
        } else if (key == "packet_type") {
            s.kind = Selector::Kind::packet_type;
            for (const auto& t : v) s.packet_types.push_back(t);
            std::sort(s.packet_types.begin(), s.packet_types.end());
        } else if (key == "token") {
            s.kind = Selector::Kind::token;
            s.token = uint32_t(v.get<uint64_t>());
        } else if (key == "sequence" || key == "flow_bytes") {
            bool seq = key == "sequence";
            s.kind = seq ? Selector::Kind::sequence : Selector::Kind::flow_bytes;
            if (seq) s.seq_kind = v["kind"] == "data" ? SeqKind::data : SeqKind::subflow;
            else if (v.contains("scope") && v["scope"] == "connection")
                s.scope = BytesScope::connection;
            for (const char* bound : {"from", "to"}) {
                if (!v.contains(bound)) continue;
                std::string bp = pointer_join(vp, bound);
                std::optional<uint64_t> n =
                    seq ? std::optional<uint64_t>(v[bound].get<uint64_t>()) : size(d, bp, v[bound]);
                if (!n) return std::nullopt;
                (std::string_view(bound) == "from" ? s.lo : s.hi) = *n;
            }
            if (s.lo >= s.hi) {
                error(d, vp, "empty range: 'from' (" + std::to_string(s.lo) +
                                 ") must be below 'to' (" + std::to_string(s.hi) + ")");
                return std::nullopt;
            }
            if (seq && s.seq_kind == SeqKind::subflow && s.hi != UINT64_MAX &&
                s.hi > (1ull << 32)) {
                error(d, pointer_join(vp, "to"),
                      "subflow sequence numbers are 32-bit: 'to' must be at most 4294967296");
                return std::nullopt;
            }
        } else if (key == "any") {
            s.kind = Selector::Kind::any;
            for (size_t i = 0; i < v.size(); ++i) {
                auto c = selector(d, pointer_join(vp, i), v[i]);
                if (!c) ok = false;
                else s.children.push_back(std::move(*c));
            }
        } else if (key == "not") {
            s.kind = Selector::Kind::not_;
            auto c = selector(d, vp, v);
            if (!c) return std::nullopt;
            s.children.push_back(std::move(*c));
        } else if (key == "selector_set") {
            s.kind = Selector::Kind::ref;
            s.ref = v;
        }
        if (!ok) return std::nullopt;
        return s;
    }

    std::optional<std::vector<Selector>> selectors(const Doc& d, const std::string& ptr) {
        std::vector<Selector> out;
        bool ok = true;
        const json* list = nullptr;
        try {
            list = &d.json.at(json::json_pointer(ptr));
        } catch (const json::exception&) {
            return out;
        }
        for (size_t i = 0; i < list->size(); ++i) {
            auto s = selector(d, pointer_join(ptr, i), (*list)[i]);
            if (s) out.push_back(std::move(*s));
            else ok = false;
        }
        if (!ok) return std::nullopt;
        return out;
    }

    std::optional<Action> action(const Doc& d, const std::string& ptr, const json& item) {
        auto it = item.begin();
        const std::string& key = it.key();
        const json& v = it.value();
        std::string vp = pointer_join(ptr, key);
        Action a;
        a.pos = d.key_at(vp);
        a.pointer = vp;
        static const std::map<std::string, Action::Kind> kinds = {
            {"pass", Action::Kind::pass},
            {"drop", Action::Kind::drop},
            {"record", Action::Kind::record},
            {"get_connect", Action::Kind::get_connect},
            {"get_subflow", Action::Kind::get_subflow},
            {"rate_limit", Action::Kind::rate_limit},
            {"blk_subflow", Action::Kind::blk_subflow},
            {"add_subflow", Action::Kind::add_subflow},
            {"set_backup", Action::Kind::set_backup},
            {"no_subflows", Action::Kind::no_subflows},
            {"redirect", Action::Kind::redirect},
            {"action_chain", Action::Kind::ref},
        };
        a.kind = kinds.at(key);
        switch (a.kind) {
        case Action::Kind::record:
            if (v.is_object() && v.contains("metrics"))
                for (const auto& m : v["metrics"]) a.metrics.push_back(m);
            std::sort(a.metrics.begin(), a.metrics.end());
            break;
        case Action::Kind::rate_limit: {
            std::string rp = pointer_join(vp, "rate");
            const std::string& rate = v["rate"].get_ref<const std::string&>();
            auto bps = parse_rate_bytes_per_sec(rate);
            if (!bps || *bps < kMinRate || *bps > kMaxRate) {
                error(d, rp, "rate '" + rate + "' is out of range (1kbit to 400Gbit)");
                return std::nullopt;
            }
            a.rate_bytes_per_sec = *bps;
            if (v.contains("rtt")) {
                auto us = duration(d, pointer_join(vp, "rtt"), v["rtt"], 1, kMaxRtt, "1us to 10s");
                if (!us) return std::nullopt;
                a.rtt_us = uint32_t(*us);
            }
            if (v.contains("min_window")) {
                std::string wp = pointer_join(vp, "min_window");
                auto w = size(d, wp, v["min_window"]);
                if (!w) return std::nullopt;
                if (*w > kMaxWindow) {
                    error(d, wp, "min_window " + std::to_string(*w) +
                                     " is above the largest TCP window (1GiB)");
                    return std::nullopt;
                }
                a.min_window = uint32_t(*w);
            }
            break;
        }
        case Action::Kind::set_backup:
            if (v.is_object()) {
                if (v.contains("backup")) a.backup = v["backup"];
                if (v.contains("once")) a.once = v["once"];
            }
            break;
        case Action::Kind::redirect:
            a.interface = v["interface"];
            check_interface(d, pointer_join(vp, "interface"), a.interface);
            break;
        case Action::Kind::ref: a.ref = v; break;
        default: break;
        }
        return a;
    }

    std::optional<std::vector<Action>> actions(const Doc& d, const std::string& ptr) {
        std::vector<Action> out;
        bool ok = true;
        const json& list = d.json.at(json::json_pointer(ptr));
        for (size_t i = 0; i < list.size(); ++i) {
            auto a = action(d, pointer_join(ptr, i), list[i]);
            if (a) out.push_back(std::move(*a));
            else ok = false;
        }
        if (!ok) return std::nullopt;
        return out;
    }

    // ---- host facts ---------------------------------------------------------------------

    std::optional<std::set<std::string>> interfaces_cache;
    bool interfaces_loaded = false;
    const std::optional<std::set<std::string>>& known_interfaces() {
        if (!interfaces_loaded) {
            interfaces_loaded = true;
            if (opts.known_interfaces) {
                interfaces_cache = opts.known_interfaces;
            } else {
                std::error_code ec;
                std::set<std::string> names;
                for (fs::directory_iterator it("/sys/class/net", ec), end; !ec && it != end;
                     it.increment(ec))
                    names.insert(it->path().filename().string());
                if (!ec && !names.empty()) interfaces_cache = std::move(names);
            }
        }
        return interfaces_cache;
    }
    void check_interface(const Doc& d, const std::string& ptr, const std::string& name) {
        const auto& known = known_interfaces();
        if (known && !known->count(name)) {
            std::string msg = "interface '" + name + "' does not exist on this host";
            std::string near = closest(name, {known->begin(), known->end()});
            if (!near.empty()) msg += "; did you mean '" + near + "'?";
            warning(d, ptr, msg);
        }
    }

    // Finds `script` next to the manifest or in a parent directory, up to the repository root.
    std::optional<std::string> find_script(const Doc& d, const std::string& script) {
        std::error_code ec;
        fs::path dir = fs::absolute(fs::path(d.file), ec).parent_path();
        fs::path stop = opts.repo_root.empty() ? fs::path() : fs::absolute(opts.repo_root, ec);
        for (;;) {
            fs::path candidate = dir / script;
            if (fs::is_regular_file(candidate, ec)) return candidate.lexically_normal().string();
            bool at_root = (!stop.empty() && dir.lexically_normal() == stop.lexically_normal()) ||
                           (stop.empty() && fs::exists(dir / ".git", ec)) ||
                           dir == dir.parent_path();
            if (at_root) return std::nullopt;
            dir = dir.parent_path();
        }
    }

    // ---- one policy ---------------------------------------------------------------------

    std::optional<Policy> policy(const Doc& d) {
        const json& spec = d.json["spec"];
        Policy p;
        p.name = d.json["metadata"]["name"];
        p.pos = d.root;
        bool ok = true;
        const json& attach = spec["attach"];
        if (attach.contains("interfaces")) {
            for (size_t i = 0; i < attach["interfaces"].size(); ++i) {
                std::string name = attach["interfaces"][i];
                check_interface(d, pointer_join("/spec/attach/interfaces", i), name);
                p.interfaces.push_back(name);
            }
        }
        std::sort(p.interfaces.begin(), p.interfaces.end());
        for (const auto& h : attach["hooks"]) {
            p.hooks.push_back(h == "xdp" ? HookPoint::xdp
                              : h == "tc_egress" ? HookPoint::tc_egress
                                                 : HookPoint::tc_ingress);
        }
        std::sort(p.hooks.begin(), p.hooks.end());
        p.priority = spec["priority"].get<uint32_t>();
        if (spec.contains("failure_mode") && spec["failure_mode"] == "drop")
            p.failure_mode = FailureMode::drop;
        if (spec.contains("continue")) p.cont = spec["continue"];
        if (spec.contains("select")) {
            auto s = selectors(d, "/spec/select");
            if (s) p.select = std::move(*s);
            else ok = false;
        }
        auto a = actions(d, "/spec/actions");
        if (a) p.actions = std::move(*a);
        else ok = false;
        if (spec.contains("hooks")) {
            const json& h = spec["hooks"];
            LuaHook lua;
            lua.script = h["script"];
            fs::path sp(lua.script);
            bool escapes = std::any_of(sp.begin(), sp.end(), [](const fs::path& c) {
                return c == "..";
            });
            if (escapes) {
                error(d, "/spec/hooks/script", "script path must stay inside the repository "
                                               "(no '..' components)");
                ok = false;
            } else if (opts.check_scripts) {
                auto found = find_script(d, lua.script);
                if (!found) {
                    error(d, "/spec/hooks/script",
                          "script '" + lua.script + "' not found next to the manifest or in a "
                          "parent directory up to the repository root");
                    ok = false;
                } else {
                    lua.path = *found;
                }
            }
            if (h.contains("every")) {
                auto us = duration(d, "/spec/hooks/every", h["every"], kMinEvery, kMaxEvery,
                                   "10ms to 1h");
                if (!us) ok = false;
                else if (*us % 1000) {
                    error(d, "/spec/hooks/every", "must be a whole number of milliseconds");
                    ok = false;
                } else {
                    lua.every_ms = uint32_t(*us / 1000);
                }
            }
            if (h.contains("params")) lua.params = h["params"];
            p.lua = std::move(lua);
        }
        if (!ok) return std::nullopt;
        return p;
    }
};

// Inlines selector_set references; false (with a diagnostic) on an unknown name or a cycle.
struct Resolver {
    Checker& ck;
    std::map<std::string, Named>& set_names;
    std::map<std::string, Named>& chain_names;
    std::map<std::string, std::optional<std::vector<Selector>>>& sets;
    std::map<std::string, std::optional<std::vector<Action>>>& chains;

    std::string suggest(const std::string& name, const std::map<std::string, Named>& names) {
        std::vector<std::string> cands;
        for (const auto& [n, _] : names) cands.push_back(n);
        std::string near = closest(name, cands);
        return near.empty() ? "" : "; did you mean '" + near + "'?";
    }

    bool selector(Selector& s, std::vector<std::string>& stack) {
        if (s.kind == Selector::Kind::ref) {
            auto named = set_names.find(s.ref);
            if (named == set_names.end()) {
                ck.error_at(s.pos, s.pointer, "unknown selector set '" + s.ref + "'" +
                                           suggest(s.ref, set_names));
                return false;
            }
            named->second.used = true;
            if (std::find(stack.begin(), stack.end(), s.ref) != stack.end()) {
                std::string path;
                for (const auto& n : stack) path += n + " -> ";
                ck.error_at(s.pos, s.pointer, "selector set '" + s.ref + "' includes itself (" + path +
                                           s.ref + ")");
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

    bool actions(std::vector<Action>& list, std::vector<std::string>& stack) {
        std::vector<Action> out;
        bool ok = true;
        for (auto& a : list) {
            if (a.kind != Action::Kind::ref) {
                out.push_back(std::move(a));
                continue;
            }
            auto named = chain_names.find(a.ref);
            if (named == chain_names.end()) {
                ck.error_at(a.pos, a.pointer, "unknown action chain '" + a.ref + "'" +
                                           suggest(a.ref, chain_names));
                ok = false;
                continue;
            }
            named->second.used = true;
            if (std::find(stack.begin(), stack.end(), a.ref) != stack.end()) {
                std::string path;
                for (const auto& n : stack) path += n + " -> ";
                ck.error_at(a.pos, a.pointer, "action chain '" + a.ref + "' includes itself (" + path +
                                           a.ref + ")");
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
            for (auto& x : inner) out.push_back(std::move(x));
        }
        list = std::move(out);
        return ok;
    }
};

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
    if (p.lua) j["hooks_lua"] = {{"script", p.lua->script}, {"every_ms", p.lua->every_ms},
                                 {"params", p.lua->params}};
    return j;
}

bool overlap(const std::vector<std::string>& a, const std::vector<std::string>& b) {
    if (a.empty() || b.empty()) return true;  // empty: every interface
    return std::any_of(a.begin(), a.end(),
                       [&](const std::string& x) { return std::binary_search(b.begin(), b.end(), x); });
}

bool terminal(Action::Kind k) { return k == Action::Kind::pass || k == Action::Kind::drop; }

}  // namespace

Result load_docs(std::vector<Doc> docs, std::vector<Diagnostic> diags,
                 std::vector<std::string> files, const Options& opts) {
    Result result;
    Checker ck{opts, diags, std::nullopt, false};

    // Schema first; a document that fails it still reserves its name so that references to
    // it do not produce a second, misleading error.
    std::map<std::string, Named> policy_names, set_names, chain_names;
    for (const auto& d : docs) {
        bool valid = schema_validate(d, diags);
        const json& j = d.json;
        if (!j.is_object() || !j.contains("kind") || !j["kind"].is_string() ||
            !j.contains("metadata") || !j["metadata"].is_object() ||
            !j["metadata"].contains("name") || !j["metadata"]["name"].is_string())
            continue;
        const std::string& kind = j["kind"].get_ref<const std::string&>();
        auto* names = kind == "Policy"        ? &policy_names
                      : kind == "SelectorSet" ? &set_names
                      : kind == "ActionChain" ? &chain_names
                                              : nullptr;
        if (!names) continue;
        std::string name = j["metadata"]["name"];
        auto [it, fresh] = names->emplace(name, Named{&d, valid});
        if (!fresh) {
            std::string what = kind == "Policy" ? "policy" : kind == "SelectorSet"
                                                                ? "selector set"
                                                                : "action chain";
            ck.error(d, "/metadata/name", what + " '" + name + "' is already defined at " +
                                             fmt_pos(it->second.doc->root));
        }
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
    for (auto& [name, n] : policy_names) {
        if (!n.valid) continue;
        const Doc& d = *n.doc;
        auto p = ck.policy(d);
        if (!p) continue;
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
                std::string where = a.kind == Action::Kind::set_backup ||
                                            a.kind == Action::Kind::no_subflows
                                        ? "tc_egress"
                                    : a.kind == Action::Kind::redirect ? "xdp or tc_egress"
                                                                       : "xdp or tc_ingress";
                ck.error_at(a.pos, a.pointer, "action '" + std::string(to_string(a.kind)) +
                                                 "' cannot run on hook '" +
                                                 std::string(to_string(h)) + "' of policy '" +
                                                 p->name + "' (use " + where + ")");
                ok = false;
            }
            if (i > 0 && terminal(p->actions[i - 1].kind)) {
                ck.error_at(a.pos, a.pointer, "action '" + std::string(to_string(a.kind)) +
                                           "' is never reached: '" +
                                           std::string(to_string(p->actions[i - 1].kind)) +
                                           "' before it ends the chain");
                ok = false;
            }
        }
        if (p->cont && terminal(p->actions.back().kind))
            ck.warning(d, "/spec/continue", "'continue' has no effect after '" +
                                                std::string(to_string(p->actions.back().kind)) +
                                                "'");
        if (p->steps() > kMaxChain) {
            ck.error(d, "/spec", "policy needs " + std::to_string(p->steps()) +
                                     " steps; a packet may run through at most " +
                                     std::to_string(kMaxChain));
            ok = false;
        }
        if (!ok) continue;
        p->canonical = canonical(*p).dump();
        policies.emplace_back(std::move(*p), &d);
    }

    // Priorities: unique among policies that can meet on one hook and interface.
    std::sort(policies.begin(), policies.end(), [](const auto& a, const auto& b) {
        return a.first.pos < b.first.pos;
    });
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
                             std::string(to_string(h)) + "' is already used by policy '" +
                             a.name + "' (" + fmt_pos(a.pos) + ")");
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
    for (auto h : {HookPoint::xdp, HookPoint::tc_egress, HookPoint::tc_ingress}) {
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
                if (!p.select.empty() || (p.cont && !terminal(p.actions.back().kind))) continue;
                for (size_t later = k + 1; later < chain.size(); ++later)
                    ck.warning(*chain[later]->second, "/spec/priority",
                               "never runs on hook '" + std::string(to_string(h)) +
                                   "': policy '" + p.name +
                                   "' before it selects every packet and ends the chain");
                break;
            }
            size_t longest = 0;
            for (size_t k = chain.size(); k-- > 0;) {
                const Policy& p = chain[k]->first;
                size_t sel = p.steps() - p.actions.size();
                bool goes_on = p.cont && !terminal(p.actions.back().kind);
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
            ck.warning(*n.doc, "/metadata/name", "selector set '" + name + "' is not used by any policy");
    for (auto& [name, n] : chain_names)
        if (!n.used && n.valid)
            ck.warning(*n.doc, "/metadata/name", "action chain '" + name + "' is not used by any policy");

    std::sort(policies.begin(), policies.end(),
              [](const auto& a, const auto& b) { return a.first.name < b.first.name; });
    for (auto& [p, _] : policies) result.model.policies.push_back(std::move(p));
    sort_diagnostics(diags);
    result.diagnostics = std::move(diags);
    result.files = std::move(files);
    // A model is only handed out whole: with any error the caller must not compile it.
    if (!result.ok()) result.model.policies.clear();
    return result;
}

}  // namespace mpsteer::manifest::detail
