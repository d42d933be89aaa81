// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Use case "multi-tenant spreading" (eMPTCP, ICNP 2022): a tenant VM's two MPTCP subflows
// behind a hypervisor with two shaped uplinks, spread by an ECMP route hashing the 5-tuple
// (kernel) or by policies/multi-tenant.yaml on the hypervisor (mpsteer), without and with
// another tenant's bulk TCP on uplink 1.
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <future>
#include <memory>
#include <spdlog/spdlog.h>
#include <string>
#include <thread>
#include <vector>

#include "testbed/agent_process.h"
#include "testbed/usecases.h"
#include "lab/lab.h"

namespace mpsteer::cli::usecases {
namespace {
using namespace std::chrono_literals;
using namespace mpsteer::lab;
using Clock = std::chrono::steady_clock;

constexpr unsigned kUplinkKbit = 50000;
constexpr uint16_t kPort = 5201, kBackgroundPort = 5202;
// Each connection's subflows get their uplinks anew (new source ports), so a run is several
// short connections one after another: the kernel's figure is its average over the hash.
constexpr int kConnectionsPerRun = 5;
constexpr auto kConnectionTime = 2s;
constexpr auto kBackgroundHeadStart = 1s;  // the background fills uplink 1 before tenant a starts
constexpr auto kSampleEvery = 500ms;
// A connection "on one uplink": the other uplink carried less than this share of its bytes.
constexpr double kOneUplinkShare = 0.1;

enum Mode { kKernel, kMpsteer };
enum Scenario { kQuiet, kBackground };

// What one run (one mode, one scenario) measured.
struct TenantTally {
    uint64_t tenant_bytes = 0, background_bytes = 0;
    double tenant_seconds = 0, background_seconds = 0;
    unsigned connections = 0, on_one_uplink = 0;

    TenantTally& operator+=(const TenantTally& o) {
        tenant_bytes += o.tenant_bytes;
        background_bytes += o.background_bytes;
        tenant_seconds += o.tenant_seconds;
        background_seconds += o.background_seconds;
        connections += o.connections;
        on_one_uplink += o.on_one_uplink;
        return *this;
    }
    double tenant_mbit() const { return tenant_seconds ? tenant_bytes * 8e-6 / tenant_seconds : 0; }
    double background_mbit() const {
        return background_seconds ? background_bytes * 8e-6 / background_seconds : 0;
    }
};

// Throughput over a run, one point per kSampleEvery: what left by each uplink (everything,
// background included) and what each tenant's receiver got.
class Timeline {
public:
    explicit Timeline(const TenantLab& lab) : lab_(lab), t0_(Clock::now()) { last_ = read(0, 0); }
    void sample(uint64_t tenant_bytes, uint64_t background_bytes) {
        const Point p = read(tenant_bytes, background_bytes);
        const double dt = p.seconds - last_.seconds;
        if (dt <= 0) return;
        auto mbit = [dt](uint64_t now, uint64_t before) { return (now - before) * 8e-6 / dt; };
        t_.push_back(p.seconds);
        for (int u = 0; u < 2; u++) uplink_[u].push_back(mbit(p.uplink[u], last_.uplink[u]));
        tenant_.push_back(mbit(p.tenant, last_.tenant));
        background_.push_back(mbit(p.background, last_.background));
        last_ = p;
    }
    Plot plot(const std::string& file, const std::string& title, bool with_background) const {
        Plot p{file, title, "seconds", "Mbit/s", "lines", {}};
        for (int u = 0; u < 2; u++)
            p.series.push_back({"uplink " + std::to_string(u + 1) + " (" +
                                    TenantLab::uplink(u + 1) + ", all traffic)",
                                t_, uplink_[u]});
        p.series.push_back({"tenant a (its receiver)", t_, tenant_});
        if (with_background) p.series.push_back({"tenant b: background TCP", t_, background_});
        return p;
    }

private:
    struct Point {
        double seconds = 0;
        uint64_t uplink[2] = {0, 0}, tenant = 0, background = 0;
    };
    Point read(uint64_t tenant_bytes, uint64_t background_bytes) const {
        Point p;
        p.seconds = std::chrono::duration<double>(Clock::now() - t0_).count();
        for (int u = 0; u < 2; u++)
            p.uplink[u] = link_counters(lab_.hypervisor_ns(), TenantLab::uplink(u + 1)).tx_bytes;
        p.tenant = tenant_bytes;
        p.background = background_bytes;
        return p;
    }
    const TenantLab& lab_;
    Clock::time_point t0_;
    Point last_;
    std::vector<double> t_, uplink_[2], tenant_, background_;
};

// One run: with background, tenant b's plain TCP flow starts first and runs throughout; then
// tenant a's connections, one after another, each sending for kConnectionTime.
TenantTally tenant_run(const TenantLab& lab, Mode mode, Scenario scenario, int round,
                       Timeline& timeline) {
    TenantTally t;
    std::unique_ptr<Sink> background_sink;
    std::atomic<bool> stop_background{false};
    std::future<TrafficStats> background;
    auto background_so_far = [&] { return background_sink ? background_sink->bytes_so_far() : 0; };
    if (scenario == kBackground) {
        background_sink = std::make_unique<Sink>(lab.server_ns(), kBackgroundPort);
        SendOptions bulk = SendOptions::of_time(0ms, &stop_background);
        bulk.plain_tcp = true;
        background = std::async(std::launch::async, [&lab, bulk] {
            return send_stream(lab.vm_ns(), TenantLab::kBackgroundService, kBackgroundPort, bulk);
        });
        for (const auto until = Clock::now() + kBackgroundHeadStart; Clock::now() < until;) {
            std::this_thread::sleep_for(kSampleEvery);
            timeline.sample(0, background_so_far());
        }
    }
    const uint64_t background_at_start = background_so_far();
    const auto start = Clock::now();
    uint64_t tenant_done = 0;
    try {
        for (int c = 0; c < kConnectionsPerRun; c++) {
            check_stop();
            Sink sink(lab.server_ns(), kPort);
            const auto uplinks_before =
                std::array{link_counters(lab.hypervisor_ns(), TenantLab::uplink(1)).tx_bytes,
                           link_counters(lab.hypervisor_ns(), TenantLab::uplink(2)).tx_bytes};
            auto sender = std::async(std::launch::async, [&lab] {
                return send_stream(lab.vm_ns(), TenantLab::kService, kPort,
                                   SendOptions::of_time(kConnectionTime));
            });
            while (sender.wait_for(kSampleEvery) != std::future_status::ready)
                timeline.sample(tenant_done + sink.bytes_so_far(), background_so_far());
            const TrafficStats sent = sender.get();
            const TrafficStats got = sink.wait(10s);
            if (got.bytes != sent.bytes || got.checksum != sent.checksum)
                throw Error("tenants: the server received " + std::to_string(got.bytes) +
                            " bytes of " + std::to_string(sent.bytes) + " or not intact");
            if (sent.fallback || sent.subflows != 1)
                throw Error("tenants: tenant a's connection has " + std::to_string(sent.subflows) +
                            " extra subflows" + (sent.fallback ? " (fell back to TCP)" : "") +
                            ", expected 1");
            tenant_done += got.bytes;
            t.tenant_bytes += got.bytes;
            t.tenant_seconds += got.seconds;
            t.connections++;
            // Only tenant a's subflows leave by uplink 2, so its share there tells whether both
            // subflows took one uplink (background on uplink 1 only adds to that side).
            const uint64_t via2 =
                link_counters(lab.hypervisor_ns(), TenantLab::uplink(2)).tx_bytes -
                uplinks_before[1];
            const uint64_t via1 =
                link_counters(lab.hypervisor_ns(), TenantLab::uplink(1)).tx_bytes -
                uplinks_before[0];
            const double share2 =
                double(via2) / double(scenario == kQuiet ? via1 + via2 : got.bytes);
            if (share2 < kOneUplinkShare || share2 > 1 - kOneUplinkShare) t.on_one_uplink++;
        }
    } catch (...) {
        stop_background = true;
        throw;
    }
    t.background_bytes = background_so_far() - background_at_start;
    t.background_seconds = std::chrono::duration<double>(Clock::now() - start).count();
    if (background.valid()) {
        stop_background = true;
        background.get();
        background_sink->wait(10s);
    }
    spdlog::info(
        "tenants round {} {} {}: tenant a {:.1f} Mbit/s over {} connections ({} on one "
        "uplink), background {:.1f} Mbit/s",
        round + 1, mode == kMpsteer ? "mpsteer" : "kernel",
        scenario == kQuiet ? "no background" : "background", t.tenant_mbit(), t.connections,
        t.on_one_uplink, t.background_mbit());
    return t;
}

}  // namespace

Report multi_tenant(const Options& opt) {
    Report r;
    r.name = "tenants";
    r.title = "multi-tenant spreading";
    r.setup =
        "tenant a's VM (two addresses, a subflow endpoint on the second) behind a "
        "hypervisor with two uplinks of " +
        std::to_string(kUplinkKbit / 1000) +
        " Mbit/s (tbf) to a server; kernel: the hypervisor routes the server over both "
        "uplinks by an ECMP route hashing the 5-tuple; mpsteer: multi-tenant.yaml on the "
        "hypervisor sends each subflow out by its source address's uplink; per run " +
        std::to_string(kConnectionsPerRun) + " MPTCP connections one after another, " +
        std::to_string(std::chrono::seconds(kConnectionTime).count()) +
        " s each, without and with tenant b's plain TCP bulk flow on uplink 1";
    const std::string tag = "u" + std::to_string(getpid() % 1000000);
    TenantLab lab(tag, kUplinkKbit);
    TenantTally sum[2][2];  // [mode][scenario]
    for (int round = 0; round < opt.rounds; round++)
        for (int m : {round % 2, 1 - round % 2}) {
            const Mode mode = Mode(m);
            std::unique_ptr<AdaptedShare> policy;
            std::unique_ptr<ShippedAgent> agent;
            if (mode == kMpsteer) {
                const std::string name = "uc-" + tag + "-hv";
                policy = std::make_unique<AdaptedShare>(
                    opt.share, "/run/mpsteer-" + name + "-share",
                    std::vector<std::pair<std::string, AdaptedShare::Replacements>>{
                        {"policies/multi-tenant.yaml", {}}});
                agent = std::make_unique<ShippedAgent>(policy->share(), lab.hypervisor_ns(), name);
                agent->wait_ready();
            }
            for (Scenario s : {kQuiet, kBackground}) {
                Timeline timeline(lab);
                sum[m][s] += tenant_run(lab, mode, s, round, timeline);
                if (round > 0) continue;
                const std::string which = std::string(mode == kMpsteer ? "mpsteer" : "kernel") +
                                          (s == kBackground ? ", background on uplink 1" : "");
                r.plots.push_back(timeline.plot(
                    std::string("tenants-") + (mode == kMpsteer ? "mpsteer" : "kernel") +
                        (s == kBackground ? "-background" : ""),
                    "tenant a's connections one after another (" + which + ")", s == kBackground));
            }
        }

    r.columns = {"kernel", "mpsteer"};
    auto mbit = [](double v) {
        char b[32];
        std::snprintf(b, sizeof b, "%.1f", v);
        return std::string(b);
    };
    auto throughput = [&](const char* key, const char* label, Scenario s, int target_percent) {
        Figure f{key, label, "+" + std::to_string(target_percent) + " %", {}};
        const double kernel = sum[kKernel][s].tenant_mbit(),
                     mpsteer = sum[kMpsteer][s].tenant_mbit();
        f.cells.push_back({kernel, mbit(kernel), std::nullopt});
        const double gain = kernel ? mpsteer / kernel - 1 : 0;
        char text[64];
        std::snprintf(text, sizeof text, "%s (%+.0f %%)", mbit(mpsteer).c_str(), gain * 100);
        f.cells.push_back({nlohmann::ordered_json{{"mbit_per_s", mpsteer}, {"gain", gain}}, text,
                           kernel > 0 && gain * 100 >= target_percent});
        return f;
    };
    r.figures.push_back(throughput("tenant_mbit", "tenant a, no background (Mbit/s)", kQuiet, 20));
    r.figures.push_back(throughput("tenant_mbit_background",
                                   "tenant a, background on uplink 1 (Mbit/s)", kBackground, 30));
    Figure background{"background_mbit", "background TCP on uplink 1 (Mbit/s)", "", {}};
    for (int m = 0; m < 2; m++) {
        const double v = sum[m][kBackground].background_mbit();
        background.cells.push_back({v, mbit(v), std::nullopt});
    }
    r.figures.push_back(std::move(background));
    for (Scenario s : {kQuiet, kBackground}) {
        Figure f{s == kQuiet ? "on_one_uplink" : "on_one_uplink_background",
                 s == kQuiet ? "connections on one uplink, no background"
                             : "connections on one uplink, background",
                 "",
                 {}};
        for (int m = 0; m < 2; m++) {
            const TenantTally& t = sum[m][s];
            f.cells.push_back({t.on_one_uplink, percent(t.on_one_uplink, t.connections), {}});
        }
        r.figures.push_back(std::move(f));
    }
    return r;
}

}  // namespace mpsteer::cli::usecases
