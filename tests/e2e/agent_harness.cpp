// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
#include "agent_harness.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "compile/compile.h"
#include "manifest/manifest.h"

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace mpsteer::agent_e2e {

std::string slurp(const std::string& path) {
    std::ifstream in(path);
    std::ostringstream ss;
    ss << in.rdbuf();
    return ss.str();
}

std::string source(const std::string& rel) {
    return slurp(std::string(MPS_SOURCE_DIR) + "/" + rel);
}

lab::LabConfig lab_config(const char* what) {
    lab::Lab::cleanup_stale();
    lab::LabConfig cfg;
    cfg.tag = what + std::to_string(getpid() % 1000);
    return cfg;
}

int64_t unix_ms_now() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

const nlohmann::json* hook_of(const nlohmann::json& status, const std::string& policy) {
    if (!status.contains("lua_hooks")) return nullptr;
    for (const auto& h : status.at("lua_hooks"))
        if (h.value("policy", "") == policy) return &h;
    return nullptr;
}

// The build's binary, or MPSTEER_BIN (the VM rig runs these tests against the installed one).
std::string mpsteer_bin() {
    const char* bin = std::getenv("MPSTEER_BIN");
    return bin && *bin ? bin : MPSTEER_BIN;
}

// ---- policies ------------------------------------------------------------------------------

namespace {
const char* kNames[] = {"lab-record", "lab-connect", "lab-subflow", "lab-rate",
                        "lab-guard",  "lab-pass",    "lab-shared"};
constexpr int kNamesN = sizeof kNames / sizeof kNames[0];

template <typename T>
const T& pick(std::mt19937_64& r, const std::vector<T>& v) {
    return v[std::uniform_int_distribution<size_t>(0, v.size() - 1)(r)];
}
bool coin(std::mt19937_64& r, double p = 0.5) {
    return std::bernoulli_distribution(p)(r);
}
}  // namespace

std::string PolicyGen::policy(const std::string& name, int slot) {
    auto& r = rng_;
    const std::string s1 = lab_.server_if(1), s2 = lab_.server_if(2);
    std::ostringstream y;
    y << "apiVersion: mpsteer.dev/v1\nkind: Policy\nmetadata:\n  name: " << name << "\n";
    if (coin(r)) y << "  description: generated for the agent e2e test\n";
    y << "spec:\n  attach:\n";
    std::vector<std::string> ifs =
        pick(r, std::vector<std::vector<std::string>>{{}, {s1}, {s2}, {s1, s2}});
    if (!ifs.empty()) {
        y << "    interfaces: [";
        for (size_t i = 0; i < ifs.size(); ++i) y << (i ? ", " : "") << ifs[i];
        y << "]\n";
    }
    std::vector<std::string> hooks;
    for (const char* h : {"xdp", "tc_egress", "tc_ingress"})
        if (coin(r, 0.6)) hooks.push_back(h);
    if (hooks.empty()) hooks.push_back("xdp");
    y << "    hooks: [";
    for (size_t i = 0; i < hooks.size(); ++i) y << (i ? ", " : "") << hooks[i];
    y << "]\n";
    // Distinct slots keep priorities distinct between policies.
    y << "  priority: " << 100 * (slot + 1) + std::uniform_int_distribution<int>(0, 49)(r) << "\n";

    // Selectors on the lab's addresses (one of several shapes).
    std::vector<std::string> sel = {
        "    - dst: 10.0.1.0/24\n",
        "    - any:\n        - dst: 10.0.1.0/24\n        - src: 10.0.1.0/24\n",
        "    - ip_pair: {a: " + lab::Lab::client_addr(2) + ", b: " + lab::Lab::server_addr(2) +
            "}\n",
        "    - port: {either: 5201}\n",
        "    - port: {either: 5201}\n    - packet_type: [any_mptcp]\n",
        "    - src: " + lab::Lab::client_addr(1) + "\n",
        "    - not: {port: {either: 22}}\n",
        "    - flow_bytes: {scope: connection, from: 1KB}\n",
        "",  // every TCP packet
    };
    std::string actions;
    bool terminal = false;
    if (name == "lab-guard") {  // drop only what nobody sends: TCP port 9
        y << "  select:\n    - port: {dst: 9}\n";
        actions = "    - record: {}\n    - drop: {}\n";
        terminal = true;
    } else {
        auto s = pick(r, sel);
        if (!s.empty()) y << "  select:\n" << s;
        if (name == "lab-record") actions = "    - record: {metrics: [packets, bytes, rtt]}\n";
        if (name == "lab-connect") actions = "    - get_connect: {}\n";
        if (name == "lab-subflow") actions = "    - get_subflow: {}\n    - record: {}\n";
        if (name == "lab-rate")
            actions = "    - rate_limit: {rate: " +
                      pick(r, std::vector<std::string>{"40Gbit", "100Gbit", "20GB/s"}) + "}\n";
        if (name == "lab-pass") {
            actions = "    - record: {}\n    - pass: {}\n";
            terminal = true;
        }
        if (name == "lab-shared") actions = "    - action_chain: lab-accounting\n";
        if (coin(r, 0.3) && !terminal) actions += "    - record: {metrics: [bytes]}\n";
    }
    y << "  actions:\n" << actions;
    if (!terminal && coin(r, 0.7)) y << "  continue: true\n";
    return y.str();
}

RevisionSpec PolicyGen::valid(int seq) {
    RevisionSpec rev;
    std::vector<int> order(kNamesN);
    for (int i = 0; i < kNamesN; ++i) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng_);
    int n = std::uniform_int_distribution<int>(1, kNamesN)(rng_);
    // Policies spread over a few files, sometimes several documents in one.
    std::map<std::string, std::string> by_file;
    bool shared = false;
    for (int k = 0; k < n; ++k) {
        std::string name = kNames[order[k]];
        std::string file =
            coin(rng_, 0.3) ? "all.yaml" : (coin(rng_) ? "lab/" : "") + name + ".yaml";
        auto& text = by_file[file];
        if (!text.empty()) text += "---\n";
        text += policy(name, order[k]);
        rev.policies.insert(name);
        shared |= name == "lab-shared";
    }
    if (shared)
        by_file["shared/accounting.yaml"] =
            "apiVersion: mpsteer.dev/v1\nkind: ActionChain\nmetadata: {name: lab-accounting}\n"
            "spec:\n  actions:\n    - record: {metrics: [packets, bytes]}\n"
            "    - get_subflow: {}\n";
    rev.files = by_file;
    rev.files["revision.txt"] = std::to_string(seq) + "\n";
    return rev;
}

RevisionSpec PolicyGen::invalid(int seq) {
    RevisionSpec rev = valid(seq);
    rev.valid = false;
    rev.policies.clear();
    const std::string head = "apiVersion: mpsteer.dev/v1\nkind: Policy\nmetadata: {name: ";
    std::string text;
    switch (broken_kind_++ % 6) {
    case 0:
        rev.broken = "unknown action rate_limt";
        text = head +
               "broken-a}\nspec:\n  attach: {hooks: [xdp]}\n  priority: 9000\n"
               "  actions:\n    - rate_limt: {rate: 1Gbit}\n";
        break;
    case 1:
        rev.broken = "host bits set in a prefix";
        text = head +
               "broken-b}\nspec:\n  attach: {hooks: [xdp]}\n  priority: 9001\n"
               "  select:\n    - dst: 10.0.1.5/24\n  actions:\n    - record: {}\n";
        break;
    case 2:
        rev.broken = "YAML syntax error";
        text = head + "broken-c}\nspec:\n  attach: {hooks: [xdp\n  priority: 9002\n";
        break;
    case 3:
        rev.broken = "an action after drop";
        text = head +
               "broken-d}\nspec:\n  attach: {hooks: [xdp]}\n  priority: 9003\n"
               "  select:\n    - port: {dst: 9}\n  actions:\n    - drop: {}\n"
               "    - record: {}\n";
        break;
    case 4:
        rev.broken = "two policies with one name";
        text = head +
               "broken-e}\nspec:\n  attach: {hooks: [xdp]}\n  priority: 9004\n"
               "  actions:\n    - record: {}\n---\n" +
               head +
               "broken-e}\nspec:\n  attach: {hooks: [tc_egress]}\n  priority: 9005\n"
               "  actions:\n    - record: {}\n";
        break;
    default:
        rev.broken = "rate out of range";
        text = head +
               "broken-f}\nspec:\n  attach: {hooks: [tc_egress]}\n  priority: 9006\n"
               "  actions:\n    - rate_limit: {rate: 900Gbit}\n";
        break;
    }
    rev.files["zz-broken.yaml"] = text;
    return rev;
}

// ---- the agent process ---------------------------------------------------------------------

AgentHarness::AgentHarness(const lab::Lab& lab, const std::string& what, int debounce_ms,
                           bool client_side)
    : AgentHarness(client_side ? lab.client_ns() : lab.server_ns(),
                   client_side ? std::vector{lab.client_if(1), lab.client_if(2)}
                               : std::vector{lab.server_if(1), lab.server_if(2)},
                   what, debounce_ms) {}

AgentHarness::AgentHarness(std::string netns, std::vector<std::string> interfaces,
                           const std::string& what, int debounce_ms)
    : netns_(std::move(netns)), interfaces_(std::move(interfaces)), debounce_ms_(debounce_ms) {
    dir_ = "/tmp/mpsteer-" + what + "-" + std::to_string(getpid());
    state_ = dir_ + "/state";
    pins_ = lab::Steering::pin_root_for(what);  // also removes stale roots of dead runs
    std::error_code ec;
    fs::remove_all(dir_, ec);
    fs::create_directories(dir_ + "/revs");
    fs::create_directories(dir_ + "/logs");
    fs::create_directories(state_);
}

AgentHarness::~AgentHarness() {
    try {
        stop();
    } catch (...) {}
    // Detach what the agent left attached and remove its pins and state.
    lab::run({mpsteer_bin(), "reset", "--pin-root", pins_, "--state-dir", state_});
    std::error_code ec;
    fs::remove_all(pins_, ec);
    if (!getenv("MPSTEER_KEEP_AGENT_DIR")) fs::remove_all(dir_, ec);
}

pid_t AgentHarness::start() {
    if (pid_ > 0) throw lab::Error("agent already running");
    ++starts_;
    std::string logf = dir_ + "/logs/agent-" + std::to_string(starts_) + ".log";
    std::vector<std::string> args = {mpsteer_bin(),    "run",
                                     "--policies",     dir_ + "/current",
                                     "--state-dir",    state_,
                                     "--pin-root",     pins_,
                                     "--netns",        netns_,
                                     "--metrics-port", std::to_string(metrics_port),
                                     "--debounce-ms",  std::to_string(debounce_ms_)};
    for (const auto& i : interfaces_) args.insert(args.end(), {"-i", i});
    args.insert(args.end(), extra_args.begin(), extra_args.end());
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t p = fork();
    if (p < 0) throw lab::Error("fork failed");
    if (p == 0) {
        int fd =
            output_fd >= 0 ? output_fd : open(logf.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, nullptr);
        execv(argv[0], argv.data());
        _exit(127);
    }
    pid_ = p;
    return p;
}

bool AgentHarness::alive() {
    if (pid_ <= 0) return false;
    int st;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return false;
    }
    return true;
}

void AgentHarness::kill9() {
    if (pid_ <= 0) return;
    ::kill(pid_, SIGKILL);
    int st;
    waitpid(pid_, &st, 0);
    pid_ = -1;
}

int AgentHarness::stop() {
    if (pid_ <= 0) return -1;
    ::kill(pid_, SIGTERM);
    auto until = Clock::now() + 10s;
    int st = -1;
    while (Clock::now() < until) {
        if (waitpid(pid_, &st, WNOHANG) == pid_) {
            pid_ = -1;
            return st;
        }
        std::this_thread::sleep_for(10ms);
    }
    ::kill(pid_, SIGKILL);
    waitpid(pid_, &st, 0);
    pid_ = -1;
    return st;
}

std::string AgentHarness::publish(const Files& files, Clock::time_point* published) {
    char id[48];
    std::snprintf(id, sizeof id, "%08x%016llx%016llx", static_cast<unsigned>(getpid()),
                  static_cast<unsigned long long>(++rev_counter_),
                  static_cast<unsigned long long>(Clock::now().time_since_epoch().count()));
    const std::string rel = "revs/" + std::string(id);
    const fs::path root = fs::path(dir_) / rel;
    for (const auto& [path, text] : files) {
        fs::create_directories((root / path).parent_path());
        std::ofstream(root / path) << text;
    }
    fs::create_directories(root);
    const std::string tmp = dir_ + "/current.tmp", cur = dir_ + "/current";
    std::error_code ec;
    fs::remove(tmp, ec);
    fs::create_symlink(rel, tmp);
    if (published) *published = Clock::now();
    if (::rename(tmp.c_str(), cur.c_str()) != 0) throw lab::Error("rename current.tmp failed");
    return id;
}

nlohmann::json AgentHarness::status() const {
    std::ifstream in(state_ + "/status.json");
    if (!in) return nullptr;
    try {
        nlohmann::json j;
        in >> j;
        return j;
    } catch (...) {
        return nullptr;
    }
}

bool AgentHarness::wait_status(const std::function<bool(const nlohmann::json&)>& pred,
                               std::chrono::milliseconds timeout, std::chrono::milliseconds every) {
    auto until = Clock::now() + timeout;
    for (;;) {
        auto s = status();
        if (s.is_object() && s.value("pid", 0) == pid_ && pred(s)) return true;
        if (Clock::now() >= until) return false;
        std::this_thread::sleep_for(every);
    }
}

std::string AgentHarness::applied_mismatch(const std::string& id) const {
    std::string dir = dir_ + "/revs/" + id;
    manifest::Options mo;
    mo.repo_root = dir;
    auto res = manifest::load_paths({dir}, mo);
    if (!res.ok()) return "revision " + id + " does not load";
    compile::PlanModel want = compile::make_plan_model(res.model, compile::compile(res.model), id);
    std::optional<compile::PlanModel> have;
    try {
        have = compile::read_applied(state_ + "/state/applied.json");
    } catch (const std::exception& e) {
        return std::string("applied.json: ") + e.what();
    }
    if (!have) return "no applied.json";
    std::string out;
    if (have->revision != id) out += "applied.json revision " + have->revision + " != " + id + "; ";
    auto d = compile::diff(*have, want);
    if (!d.empty()) out += "plan diff: " + compile::to_text(d);
    if (have->step_text != want.step_text) out += "step text differs; ";
    return out;
}

std::string AgentHarness::log(int k) const {
    std::ifstream in(dir_ + "/logs/agent-" + std::to_string(k) + ".log");
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

std::string AgentHarness::log_tail(size_t bytes) const {
    auto l = log(starts_);
    return l.size() > bytes ? l.substr(l.size() - bytes) : l;
}

bool AgentHarness::wait_log(const std::string& needle, std::chrono::milliseconds timeout) const {
    const auto until = Clock::now() + timeout;
    while (log(starts_).find(needle) == std::string::npos) {
        if (Clock::now() > until) return false;
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return true;
}

}  // namespace mpsteer::agent_e2e
