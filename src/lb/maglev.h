// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Maglev consistent hashing (Eisenbud et al., NSDI 2016, section 3.4): a lookup table of a prime
// size whose slots name backends, filled from a permutation per backend so that every backend
// owns a near-equal share (by weight) and a change of backends moves few other slots. A flow
// picks its slot by a hash of its 5-tuple; the BPF side computes the same hash.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace mpsteer::lb {

// A backend by a stable name (its identity for hashing, e.g. "10.0.3.2") and a weight (1..100).
// A draining backend keeps its place in the list but owns no slots: new flows avoid it.
struct Backend {
    std::string name;
    uint32_t weight = 1;
    bool draining = false;
};

inline constexpr uint32_t kDefaultTableSize = 65537;
inline constexpr uint32_t kMaxWeight = 100;

// A backend's permutation of the slots: slot j of its preference list is
// (offset + j * skip) mod size; skip is in 1..size-1, so with a prime size every slot appears
// once. offset comes from name_hash(name, kOffsetSeed), skip from name_hash(name, kSkipSeed).
struct Permutation {
    uint32_t offset;
    uint32_t skip;
};
Permutation permutation_of(std::string_view name, uint32_t size);

// FNV-1a 64 over the bytes, started from seed instead of the usual offset basis, then MurmurHash3's
// 64-bit finaliser (fmix64) so that every output bit depends on every input bit.
inline constexpr uint64_t kOffsetSeed = 0xcbf29ce484222325;  // FNV-1a's own offset basis
inline constexpr uint64_t kSkipSeed = 0x9e3779b97f4a7c15;    // any other fixed constant
uint64_t name_hash(std::string_view name, uint64_t seed);

// The lookup table: table[i] is the index into backends of the backend owning slot i. Every slot
// is filled when at least one backend is not draining; otherwise every slot is -1. The owner of
// each slot depends only on the backends' names, weights and draining flags, not on their order in
// the list (the fill visits them sorted by name), so two agents with the same set agree.
// Throws std::invalid_argument when size is not a prime or is smaller than the sum of all
// backends' weights (draining ones included, so that ending a drain cannot fail), when a name is
// empty or appears twice, or when a weight is outside 1..100.
std::vector<int32_t> maglev_table(const std::vector<Backend>& backends,
                                  uint32_t size = kDefaultTableSize);

// The hash of a flow: FNV-1a 64 (offset basis 0xcbf29ce484222325, prime 0x100000001b3) over the
// tuple bytes, then fmix64 (x ^= x >> 33; x *= 0xff51afd7ed558ccd; x ^= x >> 33;
// x *= 0xc4ceb9fe1a85ec53; x ^= x >> 33). Only byte loads, xor, 64-bit multiply and shifts, so the
// BPF program computes the same in a bounded loop. The tuple bytes, in this order:
//   version  1 byte: 4 or 6 (the IP version, not an AF_* constant, which differs between systems)
//   saddr    4 or 16 bytes, then daddr the same: network order, as they sit in the packet
//   sport, dport  2 bytes each: network order, as they sit in the packet
//   protocol 1 byte (IPPROTO_TCP is 6)
// 14 bytes for IPv4, 38 for IPv6; flow_tuple builds them.
uint64_t flow_hash(std::span<const uint8_t> tuple_bytes);

// The tuple bytes flow_hash expects. Addresses are in network order (4 bytes each, or 16 each),
// ports in host order (written big-endian here, as the packet carries them). Throws
// std::invalid_argument for other address lengths or lengths that differ.
std::vector<uint8_t> flow_tuple(std::span<const uint8_t> saddr, std::span<const uint8_t> daddr,
                                uint16_t sport, uint16_t dport, uint8_t protocol);

// The slot of a hash in a table of the given size (not 0): hash mod size (BPF has a 64-bit
// unsigned modulo).
inline uint32_t slot_of(uint64_t hash, uint32_t size) {
    return static_cast<uint32_t>(hash % size);
}

}  // namespace mpsteer::lb
