// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// What every use case of `mpsteer usecases` reports, and the helpers they share. Each use case
// lives in its own usecases_<name>.cpp as `Report <name>(const UseCaseOptions&)`; the command
// (usecases_cmd.cpp) lists them, runs them and prints the reports.
#pragma once

#include <nlohmann/json.hpp>

#include "testbed/agent_process.h"
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mpsteer::cli::usecases {

struct Options {
    int rounds = 3;
    unsigned connections = 40;
    std::string share;  // holds the shipped policies/ and lua/
};

// Throws when SIGINT/SIGTERM asked the command to stop (use cases call it between steps).
void check_stop();

// One figure in one column: the number for JSON, its text for the table, and whether it
// meets the figure's target (only in the columns the target is for).
struct Cell {
    nlohmann::ordered_json value;
    std::string text;
    std::optional<bool> met;
};
struct Figure {
    std::string key, label, target;  // target: text, empty when the figure is only shown
    std::vector<Cell> cells;         // one per column
};
// A picture of a use case: lines (x, y per series) or an empirical CDF (the samples in y).
struct Plot {
    struct Series {
        std::string label;
        std::vector<double> x, y;
    };
    std::string file;  // <name>.png in the plot directory
    std::string title, xlabel, ylabel;
    std::string kind = "lines";  // "lines" | "cdf"
    std::vector<Series> series;
};
struct Report {
    std::string name, title, setup;
    std::vector<std::string> columns;  // "ipv4 kernel", "ipv4 mpsteer", ...
    std::vector<Figure> figures;
    std::vector<Plot> plots;
    double seconds = 0;
    bool met() const;
};

// Writes the plot's data as <dir>/<file>.json and draws <dir>/<file>.png from it with
// tools/plot_usecases.py under `share` (matplotlib); returns the PNG's path.
std::string draw_plot(const Plot& p, const std::string& dir, const std::string& share);

// A count as it is, and a count mpsteer must keep at 0 (the kernel's column only shows it).
Cell count_cell(uint64_t v);
Cell zero_cell(uint64_t v, bool mpsteer);

// The figures of a use case whose columns are IPv4 and IPv6, each the kernel alone and with
// mpsteer: `cell` makes one column's cell from that column's tally.
template <class Tally>
struct FamilyFigure {
    const char* key;
    const char* label;
    const char* target;
    std::function<Cell(const Tally&, bool mpsteer)> cell;
};
// Adds the columns "ipv4 kernel", "ipv4 mpsteer", "ipv6 kernel", "ipv6 mpsteer" and the
// figures; sum[family][mode]: [IPv4, IPv6][kernel, mpsteer].
template <class Tally>
void add_family_figures(Report& r, const std::vector<FamilyFigure<Tally>>& specs,
                        const Tally (&sum)[2][2]) {
    for (const char* family : {"ipv4", "ipv6"})
        for (const char* mode : {"kernel", "mpsteer"})
            r.columns.push_back(std::string(family) + " " + mode);
    for (const auto& s : specs) {
        Figure fig{s.key, s.label, s.target, {}};
        for (int f = 0; f < 2; f++)
            for (int m = 0; m < 2; m++) fig.cells.push_back(s.cell(sum[f][m], m == 1));
        r.figures.push_back(std::move(fig));
    }
}

// "12 (30 %)"
std::string percent(unsigned part, unsigned whole);
// v with `decimals` digits after the point.
std::string fixed(double v, int decimals);

// Copies of shipped files for one lab host, each with addresses (or any text) replaced: a
// use case runs the shipped policies, only what names the real network changed. Every
// replaced text must occur (a shipped file that no longer names it is an error, not a silent
// no-op). Removed with the object.
class AdaptedShare {
public:
    using Replacements = std::vector<std::pair<std::string, std::string>>;
    // files: paths relative to `share` (policies/..., lua/...), each with its replacements.
    AdaptedShare(const std::string& share, const std::string& dir,
                 const std::vector<std::pair<std::string, Replacements>>& files);
    ~AdaptedShare();
    AdaptedShare(const AdaptedShare&) = delete;
    AdaptedShare& operator=(const AdaptedShare&) = delete;
    const std::string& share() const { return dir_; }  // holds policies/ and lua/

private:
    void remove();
    std::string dir_;
};

// The real agent (`mpsteer run`, ShippedAgent) inside `netns` on adapted copies of shipped
// files, Ready when constructed; stopped, and the copies removed, when destroyed. `name` names
// its runtime files (/run/mpsteer-<name>, its pins, the copies in /run/mpsteer-<name>-share).
class PolicyAgent {
public:
    PolicyAgent(const Options& opt, const std::string& netns, const std::string& name,
                const std::vector<std::pair<std::string, AdaptedShare::Replacements>>& files);
    ShippedAgent& process() { return agent_; }

private:
    AdaptedShare share_;  // declared first: outlives the agent that reads it
    ShippedAgent agent_;
};

// The use cases.
Report load_balancer(const Options& opt);
Report token_balancer(const Options& opt);
Report multi_tenant(const Options& opt);
Report small_flows(const Options& opt);
Report ecf_scheduling(const Options& opt);
Report disjoint_subflows(const Options& opt);
Report path_resilience(const Options& opt);

}  // namespace mpsteer::cli::usecases
