// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The agent against live MPTCP between two namespaces, run as a child process the
// way an operator runs it (`mpsteer run --netns <server> ...`):
//  (1) a long transfer (at least 500 MB, content checksum) while 200 revisions are published
//      the git-sync way: policies added, modified and removed, invalid revisions in between.
//      Every valid revision becomes the running generation (applied.json equals what
//      `mpsteer plan` compiles), every invalid one leaves the previous generation running,
//      no tail call ever misses, and the transfer arrives intact over MPTCP.
//  (2) `kill -9` of the agent at random points of an apply, 20 times, with one transfer
//      running throughout: every restart adopts the pins and converges to the current
//      revision, and the transfer survives.
// MPSTEER_AGENT_REVISIONS / MPSTEER_AGENT_KILLS override 200 / 20 (quick local runs);
// MPSTEER_AGENT_SEED fixes the random policy sequence (printed on every run).
#include <catch2/catch.hpp>
#include <bpf/bpf.h>

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <thread>

#include "agent_harness.h"
#include "lab/lab.h"
#include "net/stats.h"

using namespace mpsteer;
using namespace mpsteer::lab;
using mpsteer::net::quantile;
using namespace mpsteer::agent_e2e;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

namespace {

LabConfig config(const char* what) {
    Lab::cleanup_stale();
    LabConfig cfg;
    cfg.tag = what + std::to_string(getpid() % 100000);
    // 40 Mbit/s per path (tbf): 500 MB in about 50 s, and CPU left for the verifier.
    cfg.path[0] = cfg.path[1] = PathShape{0, 40000};
    return cfg;
}

int env_int(const char* name, int dflt) {
    const char* v = getenv(name);
    return v && *v ? std::atoi(v) : dflt;
}

uint64_t seed() {
    const char* v = getenv("MPSTEER_AGENT_SEED");
    uint64_t s = v && *v ? std::strtoull(v, nullptr, 0)
                         : static_cast<uint64_t>(Clock::now().time_since_epoch().count());
    std::printf("agent e2e: seed %llu (MPSTEER_AGENT_SEED)\n", static_cast<unsigned long long>(s));
    return s;
}

uint64_t missed(const json& s) {
    uint64_t m = 0;
    if (s.contains("datapath") && s["datapath"].is_object())
        m += s["datapath"].value("missed_tail_calls", uint64_t{0});
    return m;
}

uint64_t policy_missed(const json& s) {
    uint64_t m = 0;
    for (const auto& p : s.value("policies", json::array()))
        m += p.value("missed_tail_calls", uint64_t{0});
    return m;
}

std::set<std::string> status_policies(const json& s) {
    std::set<std::string> out;
    for (const auto& p : s.value("policies", json::array())) out.insert(p.value("name", ""));
    return out;
}

// A transfer from the client to the server's path-1 address that runs until stopped.
struct Transfer {
    explicit Transfer(const Lab& lab) : sink(lab.server_ns(), 5201) {
        sender = std::thread([this, &lab] {
            try {
                sent = send_stream(lab.client_ns(), Lab::server_addr(1), 5201,
                                   SendOptions::of_time(std::chrono::hours(1), &stop));
            } catch (const std::exception& e) {
                error = e.what();
            }
            done = true;
        });
    }
    ~Transfer() {
        stop = true;
        if (sender.joinable()) sender.join();
    }
    // Waits until at least `bytes` arrived (false on timeout or when the sender failed).
    bool wait_bytes(uint64_t bytes, std::chrono::seconds timeout) {
        auto until = Clock::now() + timeout;
        while (sink.bytes_so_far() < bytes) {
            if (done || Clock::now() > until) return false;
            std::this_thread::sleep_for(20ms);
        }
        return true;
    }
    std::pair<TrafficStats, TrafficStats> finish() {
        stop = true;
        sender.join();
        if (!error.empty()) throw Error(error);
        return {sent, sink.wait(60s)};
    }
    Sink sink;
    std::atomic<bool> stop{false}, done{false};
    std::string error;
    TrafficStats sent;
    std::thread sender;
};

void check_transfer(Transfer& t, uint64_t at_least) {
    INFO("sender error: " << t.error);
    REQUIRE(t.wait_bytes(at_least, 180s));
    auto [sent, got] = t.finish();
    std::printf("agent e2e: transfer %.1f MB in %.1f s, %u extra subflow(s), fallback %d\n",
                sent.bytes / 1e6, sent.seconds, sent.subflows, int(sent.fallback));
    CHECK(sent.bytes >= at_least);
    CHECK(got.bytes == sent.bytes);        // no reset: everything sent arrived
    CHECK(got.checksum == sent.checksum);  // and not one byte changed
    CHECK_FALSE(sent.fallback);
    CHECK_FALSE(got.fallback);
    CHECK(sent.token != 0);
}

size_t count_dir(const std::string& d) {
    size_t n = 0;
    std::error_code ec;
    for (auto it = std::filesystem::directory_iterator(d, ec); !ec && it != end(it); ++it) ++n;
    return n;
}

}  // namespace

// Names of the programs the pinned links run (compiled entries are fast_xdp / fast_tc).
std::vector<std::string> link_programs(const std::string& dir) {
    std::vector<std::string> out;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
        int link = bpf_obj_get(e.path().c_str());
        if (link < 0) continue;
        bpf_link_info li{};
        uint32_t len = sizeof li;
        if (bpf_obj_get_info_by_fd(link, &li, &len) == 0) {
            int prog = bpf_prog_get_fd_by_id(li.prog_id);
            bpf_prog_info pi{};
            uint32_t plen = sizeof pi;
            if (prog >= 0 && bpf_obj_get_info_by_fd(prog, &pi, &plen) == 0) out.push_back(pi.name);
            if (prog >= 0) close(prog);
        }
        close(link);
    }
    return out;
}

TEST_CASE("agent: 200 revisions (valid and invalid) under a live 500 MB MPTCP transfer",
          "[e2e][agent]") {
    const int kRevisions = env_int("MPSTEER_AGENT_REVISIONS", 200);
    constexpr uint64_t kBytes = 500'000'000;
    Lab lab(config("ar"));
    AgentHarness h(lab, "agent-test");
    PolicyGen gen(lab, seed());

    auto first = gen.valid(0);
    std::string last_valid = h.publish(first.files);
    auto last_policies = first.policies;
    h.start();
    auto converged = [&](const std::string& id) {
        return [id](const json& s) {
            return s.value("applied_revision", "") == id && s.value("ready", false);
        };
    };
    // The first apply loads the datapath (minutes under emulation: the VM rig runs this test).
    if (!h.wait_status(converged(last_valid), 300s))
        FAIL("first revision not applied; agent log (tail):\n" << h.log_tail());
    CHECK(h.applied_mismatch(last_valid) == "");

    Transfer t(lab);
    REQUIRE(t.wait_bytes(1'000'000, 20s));
    const auto t0 = Clock::now();
    const uint64_t bytes0 = t.sink.bytes_so_far();

    int valid = 1, invalid = 0, added = 0, removed = 0, modified = 0, unchanged = 0;
    uint64_t gen_no = h.status().value("generation", 0u);
    uint64_t max_missed = 0;
    std::vector<double> apply_ms;
    for (int i = 1; i <= kRevisions; ++i) {
        // Invalid revisions in between: every 7th, sometimes two in a row.
        const bool bad = i % 7 == 3 || i % 29 == 4;
        auto rev = bad ? gen.invalid(i) : gen.valid(i);
        const auto id = h.publish(rev.files);
        INFO("revision " << i << " (" << id << ")" << (bad ? " invalid: " + rev.broken : ""));
        if (!bad) {
            for (const auto& p : rev.policies) {
                if (!last_policies.count(p))
                    ++added;
                else
                    ++modified;  // a policy kept is regenerated (new selectors, hooks, ...)
            }
            for (const auto& p : last_policies)
                if (!rev.policies.count(p)) ++removed;
            if (!h.wait_status(converged(id), 60s))
                FAIL("not applied within 60 s; agent log (tail):\n" << h.log_tail());
            auto s = h.status();
            ++valid;
            last_valid = id;
            last_policies = rev.policies;
            CHECK(s.value("attempted_revision", "") == id);
            CHECK(s["errors"].empty());
            CHECK(h.applied_mismatch(id) == "");
            CHECK(status_policies(s) == rev.policies);
            const uint64_t g = s.value("generation", 0u);
            if (g == gen_no) ++unchanged;  // same content as what runs: nothing to build
            CHECK(g >= gen_no);
            gen_no = g;
            apply_ms.push_back(s["applies"].value("last_duration_ms", 0.0));
            max_missed = std::max({max_missed, missed(s), policy_missed(s)});
            CHECK(missed(s) == 0);
        } else {
            ++invalid;
            if (!h.wait_status(
                    [&](const json& s) { return s.value("attempted_revision", "") == id; }, 60s))
                FAIL("not attempted within 60 s; agent log (tail):\n" << h.log_tail());
            auto s = h.status();
            // The previous generation keeps running and says why the new one is not applied.
            CHECK(s.value("applied_revision", "") == last_valid);
            CHECK(s.value("generation", 0u) == gen_no);
            CHECK_FALSE(s.value("ready", true));
            CHECK_FALSE(s["errors"].empty());
            CHECK(h.applied_mismatch(last_valid) == "");
            max_missed = std::max({max_missed, missed(s), policy_missed(s)});
        }
        REQUIRE(h.alive());
    }
    const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    const uint64_t during = t.sink.bytes_so_far() - bytes0;

    // The end state: the last valid revision is what runs (if the last one was invalid,
    // publishing the last valid content again makes the agent ready on it without a build).
    // The status is rewritten every second: by then the last generation has counted the
    // transfer's packets on its hooks (it is the one enforcing).
    std::this_thread::sleep_for(1500ms);
    auto s = h.status();
    INFO("final status: " << s.dump(1));
    CHECK(h.applied_mismatch(last_valid) == "");
    CHECK(s.value("applied_revision", "") == last_valid);
    CHECK(missed(s) == 0);
    CHECK(policy_missed(s) == 0);
    // A revision may hold no policy at all (random sets of 0..7): then no hook has a chain and
    // nothing is counted. Otherwise the running generation counts the live transfer.
    if (!s["policies"].empty()) {
        for (int i = 0; i < 5 && s["datapath"].value("packets", uint64_t{0}) == 0; ++i) {
            std::this_thread::sleep_for(1s);
            s = h.status();
        }
        CHECK(s["datapath"].value("packets", uint64_t{0}) > 0);
    }
    // One loaded datapath, reused by every generation.
    CHECK(count_dir(h.pin_root() + "/dp") == 1);
    // Revisions quiet: the hooks move onto the last generation's compiled entries, and the
    // transfer goes on through them.
    if (!s["policies"].empty()) {
        auto compiled = [&] {
            int n = 0;
            for (const auto& name : link_programs(h.pin_root() + "/links"))
                n += name == "fast_xdp" || name == "fast_tc";
            return n;
        };
        for (int i = 0; i < 30 && compiled() == 0; ++i) std::this_thread::sleep_for(100ms);
        CHECK(compiled() > 0);
        INFO(h.log_tail());
        CHECK(h.log_tail().find("compiled entries on") != std::string::npos);
    }

    std::printf(
        "agent e2e: %d revisions in %.1f s (%d valid, %d invalid; policies added %d, "
        "modified %d, removed %d; %d without a build), apply p50 %.0f ms p99 %.0f ms, "
        "%.1f MB transferred meanwhile, max missed tail calls %llu\n",
        kRevisions, secs, valid - 1, invalid, added, modified, removed, unchanged,
        quantile(apply_ms, 0.5), quantile(apply_ms, 0.99), during / 1e6,
        static_cast<unsigned long long>(max_missed));
    CHECK(invalid > 0);
    CHECK(added > 0);
    CHECK(removed > 0);
    CHECK(during > 0);  // the transfer was live the whole time
    check_transfer(t, kBytes);
}

TEST_CASE("agent: kill -9 at random points of an apply, 20 times, every restart converges",
          "[e2e][agent]") {
    const int kKills = env_int("MPSTEER_AGENT_KILLS", 20);
    Lab lab(config("ak"));
    AgentHarness h(lab, "agent-test");
    PolicyGen gen(lab, seed());
    std::uniform_real_distribution<double> unit(0, 1);

    auto first = gen.valid(0);
    std::string current = h.publish(first.files);
    h.start();
    auto converged = [&](const std::string& id) {
        return [id](const json& s) {
            return s.value("applied_revision", "") == id && s.value("ready", false);
        };
    };
    if (!h.wait_status(converged(current), 60s))
        FAIL("first revision not applied; agent log (tail):\n" << h.log_tail());
    double apply_ms = h.status()["applies"].value("last_duration_ms", 1000.0);

    Transfer t(lab);
    REQUIRE(t.wait_bytes(1'000'000, 20s));
    int before_apply = 0, mid_apply = 0, after_apply = 0;
    std::vector<double> converge_ms;
    for (int k = 1; k <= kKills; ++k) {
        auto rev = gen.valid(k);
        const auto id = h.publish(rev.files);
        // One kill in five lands before the apply starts (inside the debounce); the others
        // are aimed from the moment the run logs the apply's start, somewhere in
        // [0, 1.2 x apply time]: while the generation is validated, staged, pre-flighted and
        // switched, sometimes just after it is recorded. Aiming from the publish instead
        // missed every apply once applies got faster than noticing a revision.
        std::chrono::microseconds delay{0};
        if (unit(gen.rng()) < 0.2) {
            delay = std::chrono::microseconds(static_cast<int64_t>(unit(gen.rng()) * 10'000));
        } else {
            REQUIRE(h.wait_log("applying revision " + id, 10s));
            delay = std::chrono::microseconds(
                static_cast<int64_t>(unit(gen.rng()) * 1.2 * apply_ms * 1000));
        }
        std::this_thread::sleep_for(delay);
        const int run = h.starts();
        h.kill9();
        const auto log = h.log(run);
        const bool started = log.find("applying revision " + id) != std::string::npos;
        const bool finished = log.find("revision " + id + ",") != std::string::npos;
        (started ? (finished ? after_apply : mid_apply) : before_apply)++;
        // The killed run's own apply time ("... (N ms)") aims the next kill: a restart that
        // adopts reports no apply of its own.
        if (finished) {
            std::smatch m;
            static const std::regex took(R"(revision [0-9a-f]+, .*\(([0-9]+) ms\))");
            if (std::regex_search(log, m, took)) apply_ms = std::stod(m[1]);
        }
        const uint64_t bytes_at_kill = t.sink.bytes_so_far();

        const auto t0 = Clock::now();
        h.start();
        INFO("kill " << k << " after " << delay.count() / 1000 << " ms (revision " << id << ", "
                     << (started ? (finished ? "after the apply" : "during the apply")
                                 : "before the apply")
                     << ")\nkilled run's log (tail):\n"
                     << log.substr(log.size() > 3000 ? log.size() - 3000 : 0));
        if (!h.wait_status(converged(id), 60s))
            FAIL("no convergence within 60 s; restarted run's log (tail):\n" << h.log_tail());
        converge_ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - t0).count());
        auto s = h.status();
        CHECK(h.applied_mismatch(id) == "");
        CHECK(status_policies(s) == rev.policies);
        CHECK(missed(s) == 0);
        CHECK(policy_missed(s) == 0);
        CHECK(s["errors"].empty());
        // Every hook the generation needs is attached and pinned, and no more.
        CHECK(count_dir(h.pin_root() + "/links") == s["attachments"].size());
        CHECK(count_dir(h.pin_root() + "/dp") == 1);
        // The transfer goes on.
        CHECK(t.wait_bytes(bytes_at_kill + 1'000'000, 20s));
        current = id;
    }
    std::printf(
        "agent e2e: %d kills (%d before an apply started, %d during one, %d after it), "
        "restart-to-converged p50 %.0f ms, max %.0f ms\n",
        kKills, before_apply, mid_apply, after_apply, quantile(converge_ms, 0.5),
        quantile(converge_ms, 1.0));
    CHECK(mid_apply > 0);
    check_transfer(t, 100'000'000);
}
