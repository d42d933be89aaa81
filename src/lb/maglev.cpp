// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
#include "lb/maglev.h"

#include <algorithm>
#include <stdexcept>
#include <unordered_set>

namespace mpsteer::lb {

namespace {

constexpr uint64_t kFnvPrime = 0x100000001b3;

uint64_t fnv1a(std::span<const uint8_t> bytes, uint64_t seed) {
    uint64_t h = seed;
    for (uint8_t b : bytes) {
        h ^= b;
        h *= kFnvPrime;
    }
    return h;
}

// FNV-1a leaves its low bits weak (bit 0 is the parity of the bytes' bit 0); the finaliser mixes
// them, which matters because slots are taken modulo the table size.
uint64_t fmix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccd;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53;
    x ^= x >> 33;
    return x;
}

bool is_prime(uint32_t n) {
    if (n < 2) return false;
    if (n % 2 == 0) return n == 2;
    for (uint64_t d = 3; d * d <= n; d += 2)
        if (n % d == 0) return false;
    return true;
}

std::string quoted(const std::string& name) {
    return "\"" + name + "\"";
}

void check(const std::vector<Backend>& backends, uint32_t size) {
    std::unordered_set<std::string_view> seen;
    uint64_t weight_sum = 0;
    for (size_t i = 0; i < backends.size(); ++i) {
        const Backend& b = backends[i];
        if (b.name.empty())
            throw std::invalid_argument("maglev: backend #" + std::to_string(i) +
                                        " has an empty name");
        if (b.weight == 0 || b.weight > kMaxWeight)
            throw std::invalid_argument("maglev: backend " + quoted(b.name) + " has weight " +
                                        std::to_string(b.weight) + ", outside 1.." +
                                        std::to_string(kMaxWeight));
        if (!seen.insert(b.name).second)
            throw std::invalid_argument("maglev: duplicate backend " + quoted(b.name));
        weight_sum += b.weight;
    }
    if (!is_prime(size))
        throw std::invalid_argument("maglev: table size " + std::to_string(size) +
                                    " is not a prime");
    if (size < weight_sum)
        throw std::invalid_argument("maglev: table size " + std::to_string(size) +
                                    " is smaller than the backends' weight sum " +
                                    std::to_string(weight_sum));
}

}  // namespace

uint64_t name_hash(std::string_view name, uint64_t seed) {
    const auto* bytes = reinterpret_cast<const uint8_t*>(name.data());
    return fmix64(fnv1a({bytes, name.size()}, seed));
}

Permutation permutation_of(std::string_view name, uint32_t size) {
    // size 1 would leave no valid skip; maglev_table never asks (1 is not a prime).
    if (size < 2) throw std::invalid_argument("maglev: permutation of fewer than 2 slots");
    return {static_cast<uint32_t>(name_hash(name, kOffsetSeed) % size),
            static_cast<uint32_t>(name_hash(name, kSkipSeed) % (size - 1) + 1)};
}

std::vector<int32_t> maglev_table(const std::vector<Backend>& backends, uint32_t size) {
    check(backends, size);
    std::vector<int32_t> table(size, -1);

    // The fill order decides who wins a contested slot; sorting by name makes the table a function
    // of the set of backends, not of the order the caller lists them in.
    std::vector<int32_t> order;
    for (size_t i = 0; i < backends.size(); ++i)
        if (!backends[i].draining) order.push_back(static_cast<int32_t>(i));
    if (order.empty()) return table;
    std::sort(order.begin(), order.end(),
              [&](int32_t a, int32_t b) { return backends[a].name < backends[b].name; });

    // Each backend walks its own permutation; walks[k].next is the paper's next[i], kept as the
    // slot itself rather than an index into the permutation, which saves a multiplication.
    struct Walk {
        uint32_t next;
        uint32_t skip;
    };
    std::vector<Walk> walks;
    walks.reserve(order.size());
    for (int32_t i : order) {
        const Permutation p = permutation_of(backends[i].name, size);
        walks.push_back({p.offset, p.skip});
    }

    // Round robin as in the paper's Pseudocode 1, except that a backend takes `weight` turns per
    // round: each turn claims the first slot of its permutation not taken yet.
    uint32_t filled = 0;
    while (true) {
        for (size_t k = 0; k < order.size(); ++k) {
            Walk& w = walks[k];
            for (uint32_t turn = 0; turn < backends[order[k]].weight; ++turn) {
                while (table[w.next] >= 0)
                    w.next = static_cast<uint32_t>((uint64_t{w.next} + w.skip) % size);
                table[w.next] = order[k];
                w.next = static_cast<uint32_t>((uint64_t{w.next} + w.skip) % size);
                if (++filled == size) return table;
            }
        }
    }
}

std::vector<uint8_t> flow_tuple(std::span<const uint8_t> saddr, std::span<const uint8_t> daddr,
                                uint16_t sport, uint16_t dport, uint8_t protocol) {
    if (saddr.size() != daddr.size() || (saddr.size() != 4 && saddr.size() != 16))
        throw std::invalid_argument("maglev: flow addresses of " + std::to_string(saddr.size()) +
                                    " and " + std::to_string(daddr.size()) +
                                    " bytes; both must be 4 (IPv4) or 16 (IPv6)");
    std::vector<uint8_t> bytes;
    bytes.reserve(1 + 2 * saddr.size() + 5);
    bytes.push_back(saddr.size() == 4 ? 4 : 6);
    bytes.insert(bytes.end(), saddr.begin(), saddr.end());
    bytes.insert(bytes.end(), daddr.begin(), daddr.end());
    for (uint16_t port : {sport, dport}) {
        bytes.push_back(static_cast<uint8_t>(port >> 8));
        bytes.push_back(static_cast<uint8_t>(port & 0xff));
    }
    bytes.push_back(protocol);
    return bytes;
}

uint64_t flow_hash(std::span<const uint8_t> tuple_bytes) {
    return fmix64(fnv1a(tuple_bytes, kOffsetSeed));
}

}  // namespace mpsteer::lb
