// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Selectors and actions of one document: each list item parsed into the model with its
// parameters range-checked (addresses, prefixes, ports, sizes, rates, durations).
#include <algorithm>
#include <map>

#include "manifest/checker.h"
#include "mpsteer/abi.h"

namespace mpsteer::manifest::detail {

using nlohmann::json;

namespace {
// 1kbit .. 400Gbit in B/s: the range the datapath clamps hooks' rates to as well.
constexpr uint64_t kMinRate = MPS_RATE_MIN, kMaxRate = MPS_RATE_MAX;
constexpr uint64_t kMaxRtt = 10'000'000;   // 10 s
constexpr uint64_t kMaxWindow = 1u << 30;  // TCP's largest window
}  // namespace

std::optional<IpAddr> Checker::address(const Doc& d, const std::string& ptr, const std::string& s) {
    auto a = parse_ip(s);
    if (!a) error(d, ptr, "'" + s + "' is not an IPv4 or IPv6 address");
    return a;
}

bool Checker::cidr(const Doc& d, const std::string& ptr, const std::string& s, Selector& out) {
    auto slash = s.find('/');
    auto a = address(d, ptr, s.substr(0, slash));
    if (!a) return false;
    unsigned max = a->family == 4 ? 32 : 128, prefix = max;
    if (slash != std::string::npos) {
        prefix = unsigned(std::stoul(s.substr(slash + 1)));  // schema: 1-3 digits
        if (prefix > max) {
            error(d, ptr,
                  "prefix /" + std::to_string(prefix) + " is longer than " + std::to_string(max) +
                      " bits (IPv" + std::to_string(a->family) + ")");
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
        error(d, ptr,
              "'" + s + "' has host bits set; did you mean " + to_string(masked) + "/" +
                  std::to_string(prefix) + "?");
        return false;
    }
    out.addr = masked;
    out.prefix = uint8_t(prefix);
    return true;
}

bool Checker::field_range(const Doc& d, const std::string& ptr, const json& v, unsigned max,
                          const char* what, unsigned& lo, unsigned& hi) {
    if (v.is_number_integer()) {
        lo = hi = unsigned(v.get<int64_t>());  // schema: 0..max
        return true;
    }
    const std::string& s = v.get_ref<const std::string&>();
    auto dash = s.find('-');
    unsigned long a = std::stoul(s.substr(0, dash)), b = std::stoul(s.substr(dash + 1));
    if (a > max || b > max) {
        error(d, ptr,
              std::string(what) + " " + std::to_string(a > max ? a : b) +
                  " is out of range (0 to " + std::to_string(max) + ")");
        return false;
    }
    if (a > b) {
        error(d, ptr,
              std::string(what) + " range '" + s + "' is empty (first " + what + " above last)");
        return false;
    }
    lo = unsigned(a), hi = unsigned(b);
    return true;
}

bool Checker::port_range(const Doc& d, const std::string& ptr, const json& v, uint16_t& lo,
                         uint16_t& hi) {
    unsigned a, b;
    if (!field_range(d, ptr, v, 65535, "port", a, b)) return false;
    lo = uint16_t(a), hi = uint16_t(b);
    return true;
}

std::optional<uint64_t> Checker::size(const Doc& d, const std::string& ptr, const json& v) {
    if (v.is_number_integer()) return v.get<uint64_t>();  // schema: minimum 0
    const std::string& s = v.get_ref<const std::string&>();
    size_t i = 0;
    while (i < s.size() && s[i] >= '0' && s[i] <= '9') ++i;
    std::string unit = s.substr(i);
    uint64_t n = std::stoull(s.substr(0, i)), mul = 1;  // schema: at most 15 digits
    if (unit == "KB")
        mul = 1000;
    else if (unit == "MB")
        mul = 1000000;
    else if (unit == "GB")
        mul = 1000000000;
    else if (unit == "KiB")
        mul = 1ull << 10;
    else if (unit == "MiB")
        mul = 1ull << 20;
    else if (unit == "GiB")
        mul = 1ull << 30;
    if (n > uint64_t(INT64_MAX) / mul) {  // the schema's range for plain integers too
        error(d, ptr, "'" + s + "' is out of range (0 to " + std::to_string(INT64_MAX) + " bytes)");
        return std::nullopt;
    }
    return n * mul;
}

std::optional<uint64_t> Checker::duration(const Doc& d, const std::string& ptr,
                                          const std::string& s, uint64_t min_us, uint64_t max_us,
                                          const char* range) {
    auto us = parse_duration_us(s);
    if (!us || *us < min_us || *us > max_us) {
        error(d, ptr, "'" + s + "' is out of range (" + range + ")");
        return std::nullopt;
    }
    return us;
}

// ---- selectors and actions ----------------------------------------------------------

std::optional<Selector> Checker::selector(const Doc& d, const std::string& ptr, const json& item) {
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
            error(d, pointer_join(vp, "b"),
                  "'b' is IPv" + std::to_string(b->family) + " but 'a' is IPv" +
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
        s.dir = pit.key() == "src"   ? PortDir::src
                : pit.key() == "dst" ? PortDir::dst
                                     : PortDir::either;
        ok = port_range(d, pointer_join(vp, pit.key()), pit.value(), s.port_lo, s.port_hi);
    } else if (key == "ttl" || key == "dscp") {
        const bool ttl = key == "ttl";
        s.kind = ttl ? Selector::Kind::ttl : Selector::Kind::dscp;
        unsigned lo, hi;
        ok = field_range(d, vp, v, ttl ? 255 : 63, ttl ? "TTL" : "DSCP", lo, hi);
        s.ip_lo = uint8_t(lo), s.ip_hi = uint8_t(hi);
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
        if (seq)
            s.seq_kind = v["kind"] == "data" ? SeqKind::data : SeqKind::subflow;
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
            error(d, vp,
                  "empty range: 'from' (" + std::to_string(s.lo) + ") must be below 'to' (" +
                      std::to_string(s.hi) + ")");
            return std::nullopt;
        }
        if (seq && s.seq_kind == SeqKind::subflow && s.hi != UINT64_MAX && s.hi > (1ull << 32)) {
            error(d, pointer_join(vp, "to"),
                  "subflow sequence numbers are 32-bit: 'to' must be at most 4294967296");
            return std::nullopt;
        }
        if (seq && s.seq_kind == SeqKind::subflow && s.lo > UINT32_MAX) {
            error(d, pointer_join(vp, "from"),
                  "subflow sequence numbers are 32-bit: 'from' must be at most 4294967295");
            return std::nullopt;
        }
    } else if (key == "any") {
        s.kind = Selector::Kind::any;
        for (size_t i = 0; i < v.size(); ++i) {
            auto c = selector(d, pointer_join(vp, i), v[i]);
            if (!c)
                ok = false;
            else
                s.children.push_back(std::move(*c));
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

std::optional<std::vector<Selector>> Checker::selectors(const Doc& d, const std::string& ptr) {
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
        if (s)
            out.push_back(std::move(*s));
        else
            ok = false;
    }
    if (!ok) return std::nullopt;
    return out;
}

std::optional<Action> Checker::action(const Doc& d, const std::string& ptr, const json& item) {
    auto it = item.begin();
    const std::string& key = it.key();
    const json& v = it.value();
    std::string vp = pointer_join(ptr, key);
    Action a;
    a.pos = d.key_at(vp);
    a.pointer = vp;
    auto kind = action_kind(key);
    if (!kind) {  // the schema admits none: only a document it refused gets here
        error(d, vp, "unknown action '" + key + "'");
        return std::nullopt;
    }
    a.kind = *kind;
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
                error(
                    d, wp,
                    "min_window " + std::to_string(*w) + " is above the largest TCP window (1GiB)");
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
    case Action::Kind::add_subflow:
        if (v.is_object() && v.contains("after_bytes")) {
            a.after_bytes = size(d, pointer_join(vp, "after_bytes"), v["after_bytes"]);
            if (!a.after_bytes) return std::nullopt;
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

std::optional<std::vector<Action>> Checker::actions(const Doc& d, const std::string& ptr) {
    std::vector<Action> out;
    bool ok = true;
    const json& list = d.json.at(json::json_pointer(ptr));
    for (size_t i = 0; i < list.size(); ++i) {
        auto a = action(d, pointer_join(ptr, i), list[i]);
        if (a)
            out.push_back(std::move(*a));
        else
            ok = false;
    }
    if (!ok) return std::nullopt;
    return out;
}
}  // namespace mpsteer::manifest::detail
