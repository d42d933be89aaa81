// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// One Balancer document into the model: its VIPs and ports, its backends, what the schema
// cannot say (addresses that parse, a VIP and port once, a backend name once, a VIP that is
// not a network's unspecified, loopback or multicast address).
#include <algorithm>
#include <map>

#include "manifest/checker.h"
#include "mpsteer/lb.h"

namespace mpsteer::manifest::detail {

using nlohmann::json;

namespace {

constexpr size_t kMaxBalancerServices = MPS_LB_MAX_VIPS;

// An address no client reaches a service at.
std::string unusable_vip(const IpAddr& a) {
    const auto& b = a.bytes;
    if (a.family == 4) {
        if (b[0] == 0) return "is in 0.0.0.0/8 (this network)";
        if (b[0] == 127) return "is a loopback address";
        if (b[0] >= 224) return "is a multicast or reserved address";
        return "";
    }
    if (std::all_of(b.begin(), b.end() - 1, [](uint8_t x) { return x == 0; }) && b[15] <= 1)
        return b[15] ? "is the loopback address" : "is the unspecified address";
    if (b[0] == 0xff) return "is a multicast address";
    return "";
}

std::array<uint8_t, 6> mac_of(const std::string& s) {  // the schema's pattern holds
    std::array<uint8_t, 6> m{};
    for (size_t i = 0; i < 6; ++i) m[i] = uint8_t(std::stoul(s.substr(i * 3, 2), nullptr, 16));
    return m;
}

}  // namespace

std::optional<Balancer> Checker::balancer(const Doc& d) {
    const json& spec = d.json["spec"];
    Balancer b;
    b.name = d.json["metadata"]["name"];
    b.pos = d.root;
    bool ok = true;
    for (size_t i = 0; i < spec["interfaces"].size(); ++i) {
        std::string name = spec["interfaces"][i];
        check_interface(d, pointer_join("/spec/interfaces", i), name);
        b.interfaces.push_back(name);
    }
    std::sort(b.interfaces.begin(), b.interfaces.end());

    std::map<Balancer::Service, std::string> services;  // -> the pointer of its first port
    for (size_t i = 0; i < spec["services"].size(); ++i) {
        const json& s = spec["services"][i];
        const std::string at = pointer_join("/spec/services", i);
        auto vip = address(d, at + "/vip", s["vip"]);
        if (!vip) {
            ok = false;
            continue;
        }
        if (auto why = unusable_vip(*vip); !why.empty()) {
            error(d, at + "/vip", "VIP " + to_string(*vip) + " " + why);
            ok = false;
            continue;
        }
        for (size_t k = 0; k < s["ports"].size(); ++k) {
            const std::string pp = pointer_join(at + "/ports", k);
            Balancer::Service svc{*vip, s["ports"][k].get<uint16_t>()};
            auto [it, fresh] = services.emplace(svc, pp);
            if (!fresh) {
                error(d, pp,
                      "VIP " + to_string(*vip) + " port " + std::to_string(svc.port) +
                          " is already a service at " + fmt_pos(d.at(it->second)));
                ok = false;
            }
        }
    }
    if (services.size() > kMaxBalancerServices) {
        error(d, "/spec/services",
              std::to_string(services.size()) + " VIP-port pairs; a balancer takes at most " +
                  std::to_string(kMaxBalancerServices));
        ok = false;
    }
    for (const auto& [svc, _] : services) b.services.push_back(svc);

    std::map<std::string, std::string> names;  // -> the pointer of its first definition
    for (size_t i = 0; i < spec["backends"].size(); ++i) {
        const json& j = spec["backends"][i];
        const std::string at = pointer_join("/spec/backends", i);
        Balancer::Backend be;
        be.name = j["name"];
        be.mac = mac_of(j["mac"]);
        be.interface = j["interface"];
        be.weight = j.value("weight", 1u);
        be.draining = j.value("draining", false);
        if (auto [it, fresh] = names.emplace(be.name, at + "/name"); !fresh) {
            error(d, at + "/name",
                  "backend '" + be.name + "' is already defined at " + fmt_pos(d.at(it->second)));
            ok = false;
        }
        if (be.mac[0] & 1) {
            error(d, at + "/mac",
                  "'" + j["mac"].get<std::string>() + "' is a multicast MAC address");
            ok = false;
        }
        check_interface(d, at + "/interface", be.interface);  // may be a client-side one (XDP_TX)
        b.backends.push_back(std::move(be));
    }
    if (spec.contains("unknown_token")) b.reset_unknown_tokens = spec["unknown_token"] == "reset";
    if (spec.contains("tables")) {
        b.subflow_table = spec["tables"].value("subflows", b.subflow_table);
        b.token_table = spec["tables"].value("tokens", b.token_table);
    }
    if (!ok) return std::nullopt;
    return b;
}

}  // namespace mpsteer::manifest::detail
