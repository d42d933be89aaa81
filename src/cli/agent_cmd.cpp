// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The agent's commands: run, status, suspend, resume, reset, events.
#include <sys/stat.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <spdlog/spdlog.h>
#include <thread>

#include "agent/agent.h"
#include "agent/status.h"
#include "cli/commands.h"

namespace fs = std::filesystem;

namespace mpsteer::cli {
namespace {
std::string g_state_dir = "/run/mpsteer";

void add_state_dir(CLI::App* cmd) {
    cmd->add_option("--state-dir", g_state_dir, "runtime state of the agent")
        ->capture_default_str();
}

int print_status_text(nlohmann::json s);

// For a liveness probe: exit 0 while an agent runs and keeps writing its status, ready or
// not (a bad revision is the operator's to fix; a restart would not help it). A frozen or
// absent agent exits 1.
int print_alive() {
    try {
        nlohmann::json s = agent::read_status(g_state_dir);
        for (const auto& c : s["conditions"]) {
            const std::string type = c.value("type", "");
            if ((type == "AgentRunning" || type == "Fresh") && !c.value("status", false)) {
                std::cout << "not alive: " << c.value("message", "") << '\n';
                return 1;
            }
        }
        std::cout << "alive: pid " << s.value("pid", 0) << ", status written "
                  << s.value("age_seconds", 0.0) << " s ago\n";
        return 0;
    } catch (const std::exception& e) {
        std::cout << "not alive: " << e.what() << '\n';
        return 1;
    }
}

// Exit status 0 only when ready; a status that cannot be read or makes no sense is reported,
// never fatal.
int print_status(bool json) {
    try {
        nlohmann::json s = agent::read_status(g_state_dir);
        if (json) {
            std::cout << agent::json_text(s, 2) << '\n';
            return s.value("ready", false) ? 0 : 1;
        }
        return print_status_text(s);
    } catch (const nlohmann::json::exception& e) {  // a field of the wrong type
        std::cout << std::endl;
        std::cerr << "mpsteer status: " << agent::status_path(g_state_dir)
                  << " is not a status document this version reads: " << e.what() << '\n';
        return 1;
    } catch (const std::exception& e) {
        std::cout << std::flush;
        std::cerr << "mpsteer status: " << e.what() << '\n';
        return 1;
    }
}

// By value: operator[] on a missing key must insert (a const one is undefined behaviour).
int print_status_text(nlohmann::json s) {
    std::cout << "agent:      "
              << (s.value("agent_running", false)
                      ? "running (pid " + std::to_string(s.value("pid", 0)) + ")"
                      : "not running")
              << "\nready:      " << (s.value("ready", false) ? "yes" : "no")
              << "\ngeneration: " << s["generation"]
              << "\napplied:    " << s.value("applied_revision", "-")
              << "\nattempted:  " << s.value("attempted_revision", "-")
              << (s.value("suspended", false) ? "\nsuspended:  yes (mpsteer resume)" : "") << "\n";
    // Degraded and Stalled when true; Ready, and AgentRunning and Fresh (added by the reader)
    // always.
    for (const auto& c : s["conditions"])
        if (c.value("status", false) || c.value("type", "") == "Ready" ||
            c.value("type", "") == "AgentRunning" || c.value("type", "") == "Fresh")
            std::cout << "condition:  " << c.value("type", "") << "="
                      << (c.value("status", false) ? "True" : "False") << " "
                      << c.value("reason", "") << ": " << c.value("message", "") << '\n';
    if (const std::string why = s.value("datapath_without_btf", ""); !why.empty())
        std::cout << "datapath:   built without kernel BTF (" << why
                  << "): no subprogram calls, one more tail call per step that reads options\n";
    for (const auto& a : s["attachments"]) {
        std::cout << "attached:   " << a.value("interface", "") << " " << a.value("hook", "")
                  << " (" << a.value("mode", "") << ", "
                  << (a.value("compiled_entry", false) ? "compiled entry" : "entry program")
                  << ")\n";
        if (a.contains("compiled_entry_refused"))
            std::cout << "            compiled entry refused by this kernel: "
                      << a.value("compiled_entry_refused", "") << '\n';
    }
    if (!s["policies"].empty()) {
        std::printf("%-32s %12s %12s %8s %8s\n", "POLICY", "SELECTED", "APPLIED", "DROPS",
                    "MISSED");
        for (const auto& p : s["policies"])
            std::printf("%-32s %12lu %12lu %8lu %8lu\n", p.value("name", "").c_str(),
                        p.value("selected", 0UL), p.value("applied", 0UL), p.value("drops", 0UL),
                        p.value("missed_tail_calls", 0UL));
    }
    if (const auto b = s.value("balancer", nlohmann::json()); b.is_object()) {
        std::cout << "balancer:   " << b.value("name", "") << " on";
        for (const auto& i : b.value("interfaces", nlohmann::json::array()))
            std::cout << ' ' << i.value("interface", "") << " (" << i.value("mode", "") << ")";
        std::cout << ", " << b.value("services", nlohmann::json::array()).size() << " services, "
                  << b.value("tokens_learnt", 0UL) << " tokens learnt\n";
        for (const auto& be : b.value("backends", nlohmann::json::array()))
            std::cout << "  backend:  " << be.value("name", "") << " via "
                      << be.value("interface", "") << ", weight " << be.value("weight", 0)
                      << (be.value("draining", false) ? ", draining" : "") << '\n';
        const auto c = b.value("counters", nlohmann::json::object());
        std::cout << "  packets " << c.value("packets", 0UL) << ", new flows "
                  << c.value("new_flows", 0UL) << ", joins routed " << c.value("joins_routed", 0UL)
                  << ", joins with an unknown token " << c.value("joins_unknown", 0UL)
                  << ", no backend " << c.value("no_backend", 0UL) << ", malformed "
                  << c.value("malformed", 0UL) << '\n';
        if (!b.value("learn_error", "").empty())
            std::cout << "  learning tokens failed: " << b.value("learn_error", "") << '\n';
    }
    if (const auto hp = s.value("hook_process", nlohmann::json::object()); hp.value("pid", 0) > 0) {
        std::cout << "hook process: pid " << hp.value("pid", 0) << ", user " << hp.value("user", "")
                  << (hp.value("seccomp", false) ? ", seccomp" : ", no seccomp") << ", "
                  << hp.value("restarts", 0) << " restarts";
        if (!hp.value("last_restart", "").empty())
            std::cout << " (last: " << hp.value("last_restart", "") << ")";
        std::cout << '\n';
    }
    for (const auto& h : s.value("lua_hooks", nlohmann::json::array())) {
        std::cout << "lua hook:   " << h.value("policy", "") << " " << h.value("script", "") << " "
                  << h.value("state", "") << ", " << h["calls"] << " calls, " << h["failures"]
                  << " failures, " << h["writes"] << " writes\n";
        if (!h.value("last_error", "").empty())
            std::cout << "            last error: " << h.value("last_error", "") << '\n';
        if (const auto p = h.value("published", nlohmann::json::object()); !p.empty()) {
            std::cout << "            status:";
            for (const auto& [k, v] : p.items())
                std::cout << ' ' << k << '=' << (v.is_string() ? v.get<std::string>() : v.dump());
            std::cout << '\n';
        }
    }
    for (const auto& r : s.value("endpoint_renewals", nlohmann::json::array()))
        std::cout << "endpoint:   " << r.value("address", "") << " renewed " << r["renewals"]
                  << " times (last by " << r.value("last_policy", "") << "), " << r["refused"]
                  << " renewals refused as too soon\n";
    for (const auto& e : s["errors"]) std::cout << "error: " << e.get<std::string>() << '\n';
    for (const auto& w : s["warnings"]) std::cout << "warning: " << w.get<std::string>() << '\n';
    return s.value("ready", false) ? 0 : 1;
}

int tail_events(bool follow) {
    auto path = agent::events_path(g_state_dir);
    std::ifstream in(path);
    if (!in) {
        std::cerr << "mpsteer events: no events in " << path << " (has an agent run here?)\n";
        return 1;
    }
    auto inode = [&] {
        struct stat st {};
        return stat(path.c_str(), &st) ? ino_t(0) : st.st_ino;
    };
    ino_t following = inode();
    for (;;) {
        std::string line;
        while (std::getline(in, line)) std::cout << line << '\n' << std::flush;
        if (!follow) return 0;
        in.clear();
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        if (ino_t now = inode(); now && now != following) {  // rotated: read the new file
            while (std::getline(in, line)) std::cout << line << '\n' << std::flush;
            in = std::ifstream(path);
            following = now;
        }
    }
}
}  // namespace

void add_agent_commands(CLI::App& app) {
    static agent::Config cfg;
    auto* run = app.add_subcommand(
        "run", "Keep this host's datapath equal to the policies in a directory (foreground)");
    run->add_option("--policies", cfg.policies_dir,
                    "policy directory (git-sync link, git checkout or plain directory)")
        ->required();
    add_state_dir(run);
    run->add_option("--pin-root", cfg.pin_root, "bpffs directory for mpsteer's pins")
        ->capture_default_str();
    run->add_option("-i,--interface", cfg.interfaces,
                    "interface the agent manages, for policies that name none; when given, a named "
                    "interface outside them is not attached (repeatable; default: all but lo)");
    run->footer(
        "Signals: SIGTERM/SIGINT stop, SIGHUP re-reads the policy directory (retrying a "
        "revision that failed), SIGUSR1 logs a one-line summary and writes the status now; "
        "SIGPIPE is ignored (a closed log pipe never stops the agent).");
    static int debounce_ms = 50;
    run->add_option("--debounce-ms", debounce_ms, "quiet time after a change before applying")
        ->check(CLI::Range(0, 60000))
        ->capture_default_str();
    static int resync_s = 30;
    run->add_option("--resync-s", resync_s,
                    "re-read the policy directory this often even without a change")
        ->check(CLI::Range(1, 86400))
        ->capture_default_str();
    run->add_option("--metrics-port", cfg.metrics_port, "Prometheus /metrics on 127.0.0.1 (0: off)")
        ->check(CLI::Range(0, 65535))
        ->capture_default_str();
    run->add_option("--metrics-textfile", cfg.metrics_textfile,
                    "also write metrics to this node_exporter textfile");
    run->add_option("--netns", cfg.netns,
                    "run in this named network namespace (keeps the host's bpffs for pins)");
    run->add_flag(
        "--detach-on-exit", cfg.detach_on_exit,
        "detach from every interface when stopping (default: the datapath keeps running)");
    // The Lua hooks' event thread (lua/README.md, "Event latency").
    run->add_option("--events", cfg.events_mode,
                    "how the Lua hooks' event thread waits for datapath events: wait (sleeps; "
                    "each event pays a thread wake-up), spin (polls; one CPU always busy), "
                    "adaptive (polls --events-spin-us after each event, then sleeps)")
        ->check(CLI::IsMember({"wait", "spin", "adaptive"}))
        ->capture_default_str();
    static int spin_us = 1000;
    run->add_option("--events-spin-us", spin_us,
                    "adaptive: how long to poll after an event (the CPU it may cost per event)")
        ->check(CLI::Range(0, 1000000))
        ->capture_default_str();
    run->add_option("--events-rt-priority", cfg.events_rt_priority,
                    "run the event thread SCHED_FIFO at this priority (1-99; 0: SCHED_OTHER)")
        ->check(CLI::Range(0, 99))
        ->capture_default_str();
    run->add_option("--events-cpu", cfg.events_cpu, "pin the event thread to this CPU (-1: any)")
        ->check(CLI::Range(-1, 4095))
        ->capture_default_str();
    run->add_option("--flows", cfg.tables.flows,
                    "subflows the state tables hold (connections, announcements and set_backup "
                    "templates follow from it); applies when the tables are created: after "
                    "`mpsteer reset` or on a fresh boot. 16384 suits a Raspberry Pi")
        ->check(CLI::Range(datapath::TableSizes::kMinFlows, datapath::TableSizes::kMaxFlows))
        ->capture_default_str();
    run->callback([] {
        cfg.state_dir = g_state_dir;
        cfg.events_spin = std::chrono::microseconds(spin_us);
        cfg.debounce = std::chrono::milliseconds(debounce_ms);
        cfg.resync = std::chrono::seconds(resync_s);
        set_exit_code(agent::run(cfg));
    });

    auto* status =
        app.add_subcommand("status", "Show the agent's conditions, revisions and counters");
    static bool json = false;
    static std::string output = "text";
    status->add_option("--output", output, "text or json")
        ->check(CLI::IsMember({"text", "json"}))
        ->capture_default_str();
    static bool alive = false;
    status->add_flag("--alive", alive,
                     "exit 0 while an agent runs and writes its status, ready or not; 1 when "
                     "none runs or it stopped writing (a liveness probe)");
    add_state_dir(status);
    status->callback([] { set_exit_code(alive ? print_alive() : print_status(output == "json")); });

    auto* suspend =
        app.add_subcommand("suspend", "Stop applying new revisions (the datapath keeps running)");
    add_state_dir(suspend);
    suspend->callback([] {
        fs::create_directories(g_state_dir);
        std::ofstream(agent::suspended_path(g_state_dir)) << "suspended\n";
        std::cout << "suspended: new revisions are not applied until `mpsteer resume`\n";
    });
    auto* resume = app.add_subcommand("resume", "Apply revisions again");
    add_state_dir(resume);
    resume->callback([] {
        std::error_code ec;
        fs::remove(agent::suspended_path(g_state_dir), ec);
        std::cout << "resumed\n";
    });

    auto* reset = app.add_subcommand("reset", "Remove every pin, link and map of mpsteer");
    static std::string pin_root = "/sys/fs/bpf/mpsteer";
    reset->add_option("--pin-root", pin_root, "bpffs directory of mpsteer's pins")
        ->capture_default_str();
    add_state_dir(reset);
    reset->callback([] {
        try {
            agent::reset(pin_root, g_state_dir);
            std::cout << "removed " << pin_root << " and the state in " << g_state_dir << '\n';
        } catch (const std::exception& e) {
            std::cerr << "mpsteer reset: " << e.what() << '\n';
            set_exit_code(1);
        }
    });

    auto* events =
        app.add_subcommand("events", "Print datapath events (MP_CAPABLE, MP_JOIN) as JSON lines");
    static bool follow = false;
    events->add_flag("-f,--follow", follow, "keep printing new events");
    add_state_dir(events);
    events->callback([] { set_exit_code(tail_events(follow)); });
    (void)json;
}

}  // namespace mpsteer::cli
