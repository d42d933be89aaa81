// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Commit-to-enforced latency of the agent: from the rename(2) that publishes a revision (the
// git-sync way) to the moment the agent reports the new generation active on every hook
// (status.json's applied_revision == the revision, polled every 2 ms; the agent writes it
// right after the last hook is switched). Runs the built `mpsteer run` in a two-namespace lab
// with the policies on the server's interfaces, publishes N valid revisions (default 100) one
// after the other, and prints JSON: {"n", "p50_ms", "p99_ms", ...}. Root required.
//
//   apply_latency_bench [--revisions N] [--debounce-ms MS] [--seed S]
//
// Figures only; the target (p99 <= 200 ms) is not asserted here.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <iostream>
#include <thread>

#include "agent_harness.h"
#include "lab/lab.h"
#include "net/stats.h"

using namespace mpsteer;
using namespace mpsteer::agent_e2e;
using mpsteer::net::quantile;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
    int n = 100, debounce = 50;  // the agent's default debounce
    uint64_t seed = static_cast<uint64_t>(Clock::now().time_since_epoch().count());
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!std::strcmp(argv[i], "--revisions"))
            n = std::atoi(argv[i + 1]);
        else if (!std::strcmp(argv[i], "--debounce-ms"))
            debounce = std::atoi(argv[i + 1]);
        else if (!std::strcmp(argv[i], "--seed"))
            seed = std::strtoull(argv[i + 1], nullptr, 0);
        else {
            std::cerr
                << "usage: apply_latency_bench [--revisions N] [--debounce-ms MS] [--seed S]\n";
            return 2;
        }
    }
    try {
        lab::Lab::cleanup_stale();
        lab::LabConfig cfg;
        cfg.tag = "ab" + std::to_string(getpid() % 100000);
        lab::Lab lab(cfg);
        AgentHarness h(lab, "agent-bench", debounce);
        PolicyGen gen(lab, seed);
        auto id = h.publish(gen.valid(0).files);
        h.start();
        auto applied = [&](const std::string& want) {
            return [want](const nlohmann::json& s) {
                return s.value("applied_revision", "") == want && s.value("ready", false);
            };
        };
        if (!h.wait_status(applied(id), 60s)) {
            std::cerr << "first revision not applied; agent log:\n" << h.log_tail();
            return 1;
        }
        std::vector<double> lat, apply;
        unsigned built = 0;
        uint64_t gen_no = h.status().value("generation", 0u);
        for (int i = 1; i <= n; ++i) {
            Clock::time_point published;
            id = h.publish(gen.valid(i).files, &published);
            if (!h.wait_status(applied(id), 60s, 2ms)) {
                std::cerr << "revision " << i << " not applied within 60 s; agent log:\n"
                          << h.log_tail();
                return 1;
            }
            lat.push_back(
                std::chrono::duration<double, std::milli>(Clock::now() - published).count());
            auto s = h.status();
            if (s.value("generation", 0u) != gen_no) {
                ++built;
                apply.push_back(s["applies"].value("last_duration_ms", 0.0));
                gen_no = s.value("generation", 0u);
            }
        }
        double sum = 0;
        for (double v : lat) sum += v;
        std::printf(
            "{\"n\": %zu, \"p50_ms\": %.1f, \"p99_ms\": %.1f, \"mean_ms\": %.1f, \"max_ms\": %.1f, "
            "\"min_ms\": %.1f, \"debounce_ms\": %d, \"generations_built\": %u, "
            "\"agent_apply_p50_ms\": %.1f, \"agent_apply_p99_ms\": %.1f, \"target_p99_ms\": 200, "
            "\"seed\": %llu}\n",
            lat.size(), quantile(lat, 0.5), quantile(lat, 0.99), sum / lat.size(),
            quantile(lat, 1.0), quantile(lat, 0.0), debounce, built, quantile(apply, 0.5),
            quantile(apply, 0.99), static_cast<unsigned long long>(seed));
        return 0;
    } catch (const std::exception& e) {
        std::cerr << "apply_latency_bench: " << e.what() << '\n';
        return 1;
    }
}
