// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Maglev's lookup table (pinned small tables, balance, weights, disruption when backends come and
// go, the errors) and the flow hash the BPF side shares (pinned values, spread).
#include <catch2/catch.hpp>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <map>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "lb/maglev.h"

using namespace mpsteer::lb;
using Catch::Matchers::Contains;

namespace {

std::vector<Backend> equal_backends(int n) {
    std::vector<Backend> backends;
    for (int i = 0; i < n; ++i) backends.push_back({"10.0.3." + std::to_string(i + 2)});
    return backends;
}

// Slots by owner name, so that tables over different backend lists compare.
std::vector<std::string> owners(const std::vector<Backend>& backends,
                                const std::vector<int32_t>& table) {
    std::vector<std::string> names;
    names.reserve(table.size());
    for (int32_t i : table) names.push_back(i < 0 ? "" : backends.at(i).name);
    return names;
}

std::map<std::string, size_t> shares(const std::vector<std::string>& owners) {
    std::map<std::string, size_t> count;
    for (const auto& o : owners) ++count[o];
    return count;
}

std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const std::invalid_argument& e) {
        return e.what();
    }
    return "no error";
}

// Of the slots that the joining or leaving backend owns in neither table, the fraction whose owner
// differs between the two tables: what Maglev moves beyond the necessary.
double others_moved(const std::vector<std::string>& before, const std::vector<std::string>& after,
                    const std::string& changed) {
    size_t others = 0, moved = 0;
    for (size_t i = 0; i < before.size(); ++i) {
        if (before[i] == changed || after[i] == changed) continue;
        ++others;
        if (before[i] != after[i]) ++moved;
    }
    return double(moved) / double(others);
}

}  // namespace

TEST_CASE("backend names hash to pinned offsets and skips", "[maglev]") {
    // FNV-1a 64 from the seed, then fmix64 (maglev.h); the values come from a separate Python
    // implementation of the same two functions.
    CHECK(name_hash("10.0.3.2", kOffsetSeed) == 0x226c2849edbf7be2);
    CHECK(name_hash("10.0.3.2", kSkipSeed) == 0x1ef0dae32f7c6c6d);
    // offset = hash mod 13, skip = hash mod 12 + 1.
    CHECK(permutation_of("10.0.3.2", 13).offset == 0x226c2849edbf7be2 % 13);
    CHECK(permutation_of("10.0.3.2", 13).skip == 0x1ef0dae32f7c6c6d % 12 + 1);
    auto p = permutation_of("10.0.3.2", 13);
    CHECK((p.offset == 6 && p.skip == 6));
    p = permutation_of("10.0.3.3", 13);
    CHECK((p.offset == 11 && p.skip == 10));
    p = permutation_of("10.0.3.4", 13);
    CHECK((p.offset == 4 && p.skip == 2));
}

TEST_CASE("a 13-slot table is exactly the paper's fill of the pinned permutations", "[maglev]") {
    // Permutations (offset + j * skip) mod 13, from the offsets and skips pinned above:
    //   A 10.0.3.2  6 12  5 11  4 10  3  9  2  8  1  7  0
    //   B 10.0.3.3 11  8  5  2 12  9  6  3  0 10  7  4  1
    //   C 10.0.3.4  4  6  8 10 12  1  3  5  7  9 11  0  2
    // Round robin A, B, C, each taking its first slot not yet taken:
    //   round 1: A 6, B 11, C 4
    //   round 2: A 12, B 8, C 10 (6 and 8 are taken)
    //   round 3: A 5, B 2 (5 is taken), C 1 (12 is taken)
    //   round 4: A 3 (11, 4, 10 are taken), B 9 (12 is taken), C 7 (3 and 5 are taken)
    //   round 5: A 0 (9, 2, 8, 1, 7 are taken): 13 slots filled.
    const std::vector<int32_t> expected{0, 2, 1, 0, 2, 0, 0, 2, 1, 1, 2, 1, 0};
    CHECK(maglev_table(equal_backends(3), 13) == expected);

    // The order of the list does not matter: the fill goes by name.
    const std::vector<Backend> shuffled{{"10.0.3.4"}, {"10.0.3.2"}, {"10.0.3.3"}};
    CHECK(owners(shuffled, maglev_table(shuffled, 13)) ==
          owners(equal_backends(3), maglev_table(equal_backends(3), 13)));
}

TEST_CASE("a weighted 7-slot table takes weight turns per round", "[maglev]") {
    // A 10.0.3.2 weight 1: offset 0, skip 6: 0 6 5 4 3 2 1
    // B 10.0.3.3 weight 2: offset 6, skip 4: 6 3 0 4 1 5 2
    // round 1: A 0; B 6, B 3.  round 2: A 5 (6 is taken); B 4 (0 is taken), B 1.
    // round 3: A 2 (4, 3 are taken): 7 slots filled, A 3 and B 4.
    CHECK(permutation_of("10.0.3.2", 7).offset == 0);
    CHECK(permutation_of("10.0.3.2", 7).skip == 6);
    CHECK(permutation_of("10.0.3.3", 7).offset == 6);
    CHECK(permutation_of("10.0.3.3", 7).skip == 4);
    const std::vector<Backend> backends{{"10.0.3.2", 1}, {"10.0.3.3", 2}};
    CHECK(maglev_table(backends, 7) == std::vector<int32_t>{0, 1, 0, 1, 1, 0, 1});
}

TEST_CASE("every slot is filled by a backend that is not draining", "[maglev]") {
    std::vector<Backend> backends = equal_backends(7);
    backends[1].weight = 3;
    backends[4].weight = 100;
    backends[2].draining = true;
    backends[5].draining = true;
    for (uint32_t size : {113u, 251u, 65537u}) {  // the weight sum is 108
        const auto table = maglev_table(backends, size);
        REQUIRE(table.size() == size);
        size_t bad = 0;
        for (int32_t owner : table) bad += owner < 0 || owner >= 7 || backends[owner].draining;
        INFO(size << " slots");
        CHECK(bad == 0);
    }
    // One backend owns everything, even at the smallest prime.
    CHECK(maglev_table({{"only", 2}}, 2) == std::vector<int32_t>{0, 0});
}

TEST_CASE("with no usable backend every slot is -1", "[maglev]") {
    CHECK(maglev_table({}, 13) == std::vector<int32_t>(13, -1));
    CHECK(maglev_table({{"a", 1, true}, {"b", 5, true}}, 13) == std::vector<int32_t>(13, -1));
}

TEST_CASE("equal backends own equal shares of 65537 slots", "[maglev]") {
    for (int n : {3, 5, 10}) {
        const auto backends = equal_backends(n);
        const auto count = shares(owners(backends, maglev_table(backends)));
        REQUIRE(count.size() == size_t(n));
        const double fair = 65537.0 / n;
        for (const auto& [name, slots] : count) {
            INFO(n << " backends: " << name << " owns " << slots << " slots");
            CHECK(std::abs(double(slots) - fair) <= 0.01 * fair);
        }
    }
}

TEST_CASE("weights 1:2:3 own 1/6, 2/6 and 3/6 of the slots", "[maglev]") {
    const std::vector<Backend> backends{{"10.0.3.2", 1}, {"10.0.3.3", 2}, {"10.0.3.4", 3}};
    const auto count = shares(owners(backends, maglev_table(backends)));
    for (const auto& b : backends) {
        const double share = double(count.at(b.name)) / 65537.0;
        const double target = b.weight / 6.0;
        INFO(b.name << " weight " << b.weight << " owns " << share);
        CHECK(std::abs(share - target) <= 0.02 * target);
    }
}

TEST_CASE("a fourth backend takes its share and moves few other slots", "[maglev]") {
    auto backends = equal_backends(3);
    const auto before = owners(backends, maglev_table(backends));
    backends.push_back({"10.0.3.5"});
    const auto after = owners(backends, maglev_table(backends));

    size_t moved = 0;
    for (size_t i = 0; i < before.size(); ++i) moved += before[i] != after[i];
    const double moved_share = double(moved) / double(before.size());
    const double elsewhere = others_moved(before, after, "10.0.3.5");
    INFO("moved " << moved_share << ", of the slots the new backend did not take " << elsewhere);
    CHECK(moved_share >= 0.25 - 0.01);  // at least the new backend's share
    CHECK(moved_share <= 0.30);
    CHECK(elsewhere < 0.03);
}

TEST_CASE("removing or draining one of four reassigns its slots and few others", "[maglev]") {
    const auto four = equal_backends(4);
    const auto before = owners(four, maglev_table(four));
    const std::string gone = "10.0.3.3";

    std::vector<Backend> removed;
    for (const auto& b : four)
        if (b.name != gone) removed.push_back(b);
    const auto after_remove = owners(removed, maglev_table(removed));

    auto drained = four;
    drained[1].draining = true;
    REQUIRE(drained[1].name == gone);
    const auto after_drain = owners(drained, maglev_table(drained));

    // Draining skips the backend entirely, so the table is the same as without it.
    CHECK(after_drain == after_remove);
    const auto count = shares(after_remove);
    CHECK(count.size() == 3);
    CHECK(count.count(gone) == 0);
    CHECK(count.count("") == 0);
    const double elsewhere = others_moved(before, after_remove, gone);
    INFO("of the slots the removed backend did not own, moved " << elsewhere);
    CHECK(elsewhere < 0.03);
}

TEST_CASE("bad tables are refused with the problem named", "[maglev]") {
    const auto three = equal_backends(3);
    CHECK_THAT(error_of([&] {
                   maglev_table({{"10.0.3.2"}, {"10.0.3.3"}, {"10.0.3.2"}});
               }),
               Contains("duplicate backend \"10.0.3.2\""));
    CHECK_THAT(error_of([&] { maglev_table(three, 65536); }),
               Contains("table size 65536 is not a prime"));
    CHECK_THAT(error_of([&] { maglev_table(three, 9); }), Contains("table size 9 is not a prime"));
    CHECK_THAT(error_of([&] { maglev_table(three, 1); }), Contains("table size 1 is not a prime"));
    CHECK_THAT(error_of([&] { maglev_table(three, 0); }), Contains("table size 0 is not a prime"));
    CHECK_THAT(error_of([&] {
                   maglev_table({{"10.0.3.2", 0}});
               }),
               Contains("backend \"10.0.3.2\" has weight 0, outside 1..100"));
    CHECK_THAT(error_of([&] {
                   maglev_table({{"10.0.3.2", 101}});
               }),
               Contains("backend \"10.0.3.2\" has weight 101, outside 1..100"));
    CHECK_THAT(error_of([&] {
                   maglev_table({{"a"}, {""}});
               }),
               Contains("backend #1 has an empty name"));
    // 4 + 4 weight in 7 slots; draining ones count, so that ending the drain cannot fail.
    CHECK_THAT(error_of([&] {
                   maglev_table({{"a", 4}, {"b", 4, true}}, 7);
               }),
               Contains("table size 7 is smaller than the backends' weight sum 8"));
    CHECK(error_of([&] { maglev_table({{"a", 4}, {"b", 3}}, 7); }) == "no error");
}

TEST_CASE("flow tuples have the documented layout and a pinned hash", "[maglev][flow]") {
    const uint8_t client[] = {10, 0, 3, 2}, server[] = {10, 0, 3, 9};
    const auto tuple = flow_tuple(client, server, 40000, 443, 6);
    // version 4, saddr, daddr, sport 40000 = 0x9c40, dport 443 = 0x01bb, TCP.
    CHECK(tuple == std::vector<uint8_t>{4, 10, 0, 3, 2, 10, 0, 3, 9, 0x9c, 0x40, 0x01, 0xbb, 6});
    // From the separate Python implementation of FNV-1a 64 and fmix64.
    CHECK(flow_hash(tuple) == 0xe1ac37887db0d51b);

    const uint8_t client6[16] = {0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2};
    const uint8_t server6[16] = {0x20, 0x01, 0x0d, 0xb8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 9};
    const auto tuple6 = flow_tuple(client6, server6, 40000, 443, 6);
    CHECK(tuple6.size() == 38);
    CHECK(tuple6[0] == 6);
    CHECK(flow_hash(tuple6) == 0x035b539479bfe425);

    CHECK_THAT(error_of([&] { flow_tuple(client, server6, 1, 2, 6); }),
               Contains("both must be 4 (IPv4) or 16 (IPv6)"));
}

TEST_CASE("the flow hash tells directions and ports apart", "[maglev][flow]") {
    const uint8_t a[] = {10, 0, 3, 2}, b[] = {10, 0, 3, 9};
    const uint64_t h = flow_hash(flow_tuple(a, b, 40000, 443, 6));
    CHECK(h != flow_hash(flow_tuple(a, b, 443, 40000, 6)));
    CHECK(h != flow_hash(flow_tuple(b, a, 40000, 443, 6)));
    CHECK(h != flow_hash(flow_tuple(a, b, 40000, 443, 17)));
    CHECK(h != flow_hash(flow_tuple(a, b, 40001, 443, 6)));
}

TEST_CASE("100 000 random flows spread evenly over 3 backends", "[maglev][flow]") {
    const auto backends = equal_backends(3);
    const auto table = maglev_table(backends);
    // mt19937_64's output is fixed by the standard, so the flows are the same everywhere.
    std::mt19937_64 random(20160316);
    std::vector<size_t> count(3);
    const int flows = 100000;
    for (int i = 0; i < flows; ++i) {
        const uint64_t r1 = random(), r2 = random();
        uint8_t saddr[4], daddr[4];
        for (int k = 0; k < 4; ++k) {
            saddr[k] = uint8_t(r1 >> (8 * k));
            daddr[k] = uint8_t(r1 >> (32 + 8 * k));
        }
        const auto tuple = flow_tuple(saddr, daddr, uint16_t(r2), uint16_t(r2 >> 16), 6);
        ++count.at(table[slot_of(flow_hash(tuple), uint32_t(table.size()))]);
    }
    for (size_t k = 0; k < count.size(); ++k) {
        INFO(backends[k].name << " gets " << count[k] << " flows");
        CHECK(std::abs(double(count[k]) - flows / 3.0) <= 0.02 * flows / 3.0);
    }
}
