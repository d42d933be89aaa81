// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The reconcile loop. This thread owns the Rollout (the datapath, its generations and links)
// and the status; the metrics server only reads a rendered text under a mutex. The hooks
// (the hook process that holds the Lua states, the DatapathBackend that serves their calls,
// the HookDispatcher) belong to the event thread (lua/event_thread.h): datapath events and
// on_tick run there, and this thread reaches them only through EventThread::call() (configure,
// status), so an event never waits for an apply, a status write or the event log. What the
// hooks write into the running generation comes back here through the StepWriteQueue, so the
// Rollout stays the generation's one writer.
#include "agent/agent.h"

#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <spdlog/spdlog.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <tuple>

#include "agent/lock_file.h"
#include "agent/metrics.h"
#include "agent/rollout.h"
#include "agent/status.h"
#include "agent/watch.h"
#include "datapath/kernel_probe.h"
#include "lua/datapath_backend.h"
#include "lua/event_thread.h"
#include "lua/hook_dispatcher.h"
#include "lua/hook_process.h"
#include "lua/step_writes.h"
#include "manifest/manifest.h"
#include "net/fd.h"

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// How long the main loop waits for the event thread (busy with a hook call): a call that runs
// past its budget is the hook process's to kill (lua/hook_process.h).
constexpr auto kHookThreadWait = 1s;

namespace mpsteer::agent {
namespace {

// SIGINT/SIGTERM stop the agent cleanly; SIGHUP re-reads the policy directory; SIGUSR1 logs
// a one-line summary and writes the status now (SIGPIPE is ignored, main.cpp). The loop takes
// them from a signalfd, so they must be blocked in every thread: run() blocks them before the
// first thread (metrics, event thread) starts, and threads inherit the mask.
sigset_t agent_signals() {
    sigset_t sigs;
    sigemptyset(&sigs);
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGUSR1}) sigaddset(&sigs, sig);
    return sigs;
}

lua::HookProcessOptions hook_process_options(const Config& cfg) {
    lua::HookProcessOptions o;
    o.rt_priority = cfg.events_rt_priority;  // the hooks' half of the event path, too
    return o;
}

// The state directory's `state` subdirectory as a real directory: a link or file planted at
// its name is removed (unlink never follows), so nothing is written through it.
void ensure_state_subdir(const std::string& dir) {
    struct stat st {};
    if (lstat(dir.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
        spdlog::warn("{} is not a directory (a planted link or file): replacing it", dir);
        if (unlink(dir.c_str()) != 0)
            throw std::runtime_error("removing " + dir + ": " + std::strerror(errno));
    }
    fs::create_directories(dir);
}

class Agent {
public:
    explicit Agent(const Config& cfg)
        : cfg_(cfg),
          state_(datapath::StateMaps::open(cfg.pin_root, cfg.tables)),
          rollout_(cfg, state_) {}
    int run();

private:
    void reconcile();
    void apply(const Revision& rev);
    void fail(Stall why, const std::string& message);
    void write_status();
    void log_summary() const;
    // The Lua hooks follow the running revision's policies.
    void configure_hooks(const manifest::Model& model, const std::string& revision);
    void configure_hooks_from_dir();  // and takes over the balancer

    Config cfg_;
    datapath::StateMaps state_;
    Rollout rollout_;
    AgentStatus status_;
    std::string applied_content_;
    std::string failed_content_;  // content of the last revision that failed: not retried
    std::string attempting_content_;
    // When to load the running generation's compiled entries: once revisions have been quiet
    // this long after an apply (a burst of commits compiles only the last one).
    Clock::time_point compile_due_ = Clock::time_point::max();
    net::Fd epoll_;  // declared before watch_: the Watch uses it to its end
    std::unique_ptr<Watch> watch_;
    std::unique_ptr<EventLog> events_;
    std::unique_ptr<MetricsOutput> metrics_;
    // The Lua hooks: fed events, ticks and on_apply; their state goes into the status. Touched
    // only by event_thread_ (EventThread::call() from here), which goes first when the agent is
    // destroyed. Their step writes come back through step_writes_.
    lua::StepWriteQueue step_writes_;
    lua::FlowIds flow_ids_{state_.sizes().flows};
    lua::DatapathBackend lua_backend_{state_, flow_ids_, step_writes_};
    lua::HookProcess hooks_{lua_backend_, hook_process_options(cfg_)};
    lua::HookDispatcher dispatcher_{flow_ids_};
    bool hooks_configured_ = false;
    std::unique_ptr<lua::EventThread> event_thread_;
    int runtime_gid_ = runtime_gid();
};

void Agent::configure_hooks(const manifest::Model& model, const std::string& revision) {
    std::vector<lua::ScriptSpec> specs;
    for (const auto& p : model.policies) {
        if (!p.lua) continue;
        specs.push_back({p.name, p.lua->script, p.lua->source, p.lua->every_ms, p.lua->params,
                         p.lua->idle_every_ms});
    }
    auto running = rollout_.running_generation();
    const uint32_t number = running ? running->number : 0;
    auto owned =
        std::make_shared<std::tuple<std::vector<lua::ScriptSpec>, std::string, decltype(running)>>(
            std::move(specs), revision, std::move(running));
    if (!event_thread_->call_for(kHookThreadWait, [this, owned, number] {
            lua_backend_.set_running(std::move(std::get<2>(*owned)));
            hooks_.configure(std::get<0>(*owned), std::get<1>(*owned), number);
        }))
        spdlog::warn("lua hooks: the event thread is busy; the scripts change when it is free");
    hooks_configured_ = true;
}

// After a restart that adopted the running generation without an apply: its hooks and its
// balancer.
void Agent::configure_hooks_from_dir() {
    try {
        auto rev = snapshot(cfg_.policies_dir);
        manifest::Options mo;
        mo.repo_root = rev.root;
        mo.known_interfaces = present_interfaces();
        auto res = manifest::load_paths({rev.root}, mo);
        if (!res.ok()) return;
        configure_hooks(res.model, status_.applied_revision);
        try {  // the balancer the last agent left pinned, taken over
            rollout_.start_balancer(res.model.balancer);
        } catch (const std::exception& e) {
            // Applied again as a whole, so that what fails is reported like any apply.
            spdlog::error("taking over the balancer: {}; applying the revision again", e.what());
            applied_content_.clear();
            reconcile();
        }
    } catch (const std::exception& e) {
        spdlog::warn("after adopting the running generation: {}", e.what());
    }
}

void Agent::reconcile() {
    Revision rev;
    try {
        rev = snapshot(cfg_.policies_dir);
    } catch (const std::exception& e) {
        fail(Stall::source_unavailable, e.what());
        return;
    }
    if (auto why = watch_->follow(rev.root); !why.empty()) {
        // Refused as a whole, like any revision the agent cannot take: the running one stays.
        // Too many directories is the revision's; the host's inotify limit is not.
        status_.attempted_revision = rev.id;
        if (rev.content == failed_content_) return;
        attempting_content_ = rev.content;
        status_.errors = {why};
        fail(watch_->too_many_directories() ? Stall::validation_failed : Stall::source_unavailable,
             why);
        return;
    }
    const bool ifaces_changed = rollout_.interfaces_changed(present_interfaces());
    if (!ifaces_changed && rev.content == failed_content_) {
        status_.attempted_revision =
            rev.id;  // a new commit of the same broken content: still not applied
        return;
    }
    if (rollout_.running() && rev.content == applied_content_ && !ifaces_changed) {
        // Back to (or still at) what runs: a new commit with the same content, or a broken
        // revision reverted. Nothing to build; the running generation is the answer.
        status_.applied_revision = status_.attempted_revision = rev.id;
        if (status_.stall != Stall::none) spdlog::info("revision {} is what runs already", rev.id);
        status_.stall = Stall::none;
        status_.stall_message.clear();
        status_.errors.clear();
        failed_content_.clear();
        return;
    }
    if (status_.suspended) {
        status_.pending = true;
        spdlog::info("suspended: not applying revision {}", rev.id);
        return;
    }
    status_.pending = false;
    apply(rev);
}

void Agent::fail(Stall why, const std::string& message) {
    ++status_.applies_failed;
    // An unreadable directory says nothing about the content: whatever comes back (the same
    // content included) is looked at again.
    failed_content_ = why == Stall::source_unavailable ? "" : attempting_content_;
    status_.stall = why;
    status_.stall_message = message;
    spdlog::error("revision {} not applied ({}): {}", status_.attempted_revision, to_string(why),
                  message);
    if (rollout_.running()) spdlog::info("generation {} keeps running", rollout_.generation());
}

void Agent::apply(const Revision& rev) {
    status_.attempted_revision = rev.id;
    attempting_content_ = rev.content;
    spdlog::info("applying revision {}", rev.id);
    auto o = rollout_.apply(rev);
    status_.errors = std::move(o.errors);
    status_.warnings = std::move(o.warnings);
    for (const auto& w : status_.warnings) spdlog::warn("{}", w);
    if (!o.applied()) {
        if (o.failure == Stall::validation_failed)
            for (const auto& e : status_.errors) spdlog::error("{}", e);
        fail(o.failure, o.message);
        return;
    }
    compile_due_ = Clock::now() + 250ms;
    status_.applied_revision = rev.id;
    applied_content_ = rev.content;
    status_.stall = Stall::none;
    status_.stall_message.clear();
    failed_content_.clear();
    ++status_.applies_succeeded;
    status_.last_apply_ms = o.duration_ms;
    configure_hooks(o.model, rev.id);
}

void Agent::write_status() {
    auto taken = std::make_shared<HookStatus>();
    if (!event_thread_->call_for(kHookThreadWait, [this, taken] {
            taken->scripts = hooks_.status();
            taken->scripts_json = hooks_.status_json();
            taken->event_thread = event_thread_->stats().to_json();
            taken->process = hooks_.info().to_json();
            taken->paths = lua_backend_.paths_json();
        })) {
        // A hook call holds the event thread: report that script as out of service.
        lua::ScriptStatus s;
        if (auto c = hooks_.running()) {  // safe from this thread
            s.policy = c->policy;
            s.script = c->script;
            s.last_error = c->hook + ": has held the event thread for " +
                           std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(
                                              Clock::now() - c->since)
                                              .count()) +
                           " ms";
        } else {
            s.policy = s.script = "(unknown)";
            s.last_error = "the event thread did not answer within 1 s";
        }
        s.disabled = true;
        taken->scripts = {s};
        taken->scripts_json = nlohmann::json::array({s.to_json()});
        taken->event_thread = {{"hung", s.last_error}};
        taken->process = hooks_.info().to_json();
    }
    const HookStatus& hooks = *taken;
    events_->flush();  // also opens an event log that could not be opened, once a second
    auto s = render_status(status_, rollout_.report(), hooks, *events_, cfg_.policies_dir);
    metrics_->publish(s);
    // A full or read-only state directory is reported and retried with the next write (every
    // second), never fatal: the datapath and the metrics carry on meanwhile.
    try {
        write_atomic(status_path(cfg_.state_dir), json_text(s, 1) + "\n", 0640, runtime_gid_);
        if (!status_.status_write_error.empty())
            spdlog::info("status written again after {} failures", status_.status_write_failures);
        status_.status_write_error.clear();
    } catch (const std::exception& e) {
        ++status_.status_write_failures;
        if (status_.status_write_error != e.what())
            spdlog::error("{} (retried every second)", e.what());
        status_.status_write_error = status_.last_status_write_error = e.what();
    }
}

void Agent::log_summary() const {
    spdlog::info("SIGUSR1: applied {}, attempted {}, generation {}{}{}{}",
                 status_.applied_revision.empty() ? "(none)" : status_.applied_revision,
                 status_.attempted_revision.empty() ? "(none)" : status_.attempted_revision,
                 rollout_.generation(), status_.suspended ? ", suspended" : "",
                 status_.stall == Stall::none ? "" : ", stalled: ",
                 status_.stall == Stall::none ? "" : status_.stall_message);
}

int Agent::run() {
    fs::create_directories(cfg_.state_dir);
    ensure_state_subdir(cfg_.state_dir + "/state");
    // Status and events are for root and the mpsteer group only.
    if (chown(cfg_.state_dir.c_str(), 0, static_cast<gid_t>(runtime_gid_)))
        spdlog::warn("chown {}: {}", cfg_.state_dir, std::strerror(errno));
    fs::permissions(cfg_.state_dir,
                    fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec);
    events_ = std::make_unique<EventLog>(events_path(cfg_.state_dir));
    status_.suspended = fs::exists(suspended_path(cfg_.state_dir));
    metrics_ = std::make_unique<MetricsOutput>(cfg_.metrics_port, cfg_.metrics_textfile);

    const sigset_t sigs = agent_signals();  // blocked by run() before any thread started
    net::Fd sigfd(signalfd(-1, &sigs, SFD_CLOEXEC | SFD_NONBLOCK));
    lua::EventThreadOptions eo;
    eo.mode = *lua::poll_mode_from_string(cfg_.events_mode);  // checked by the CLI
    eo.spin = cfg_.events_spin;
    eo.rt_priority = cfg_.events_rt_priority;
    eo.cpu = cfg_.events_cpu;
    event_thread_ = std::make_unique<lua::EventThread>(state_, dispatcher_, hooks_, eo);
    const int events_fd = event_thread_->notify_fd();

    epoll_.reset(epoll_create1(EPOLL_CLOEXEC));
    for (int fd : {sigfd.get(), events_fd, step_writes_.fd()}) {
        epoll_event ev{EPOLLIN, {.fd = fd}};
        epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev);
    }
    watch_ = std::make_unique<Watch>(epoll_.get(), cfg_.policies_dir, cfg_.state_dir);
    if (auto adopted = rollout_.adopt()) {
        status_.applied_revision = adopted->revision;
        applied_content_ = adopted->content;
    }
    spdlog::info("watching {} (state {}, pins {})", cfg_.policies_dir, cfg_.state_dir,
                 cfg_.pin_root);
    reconcile();
    if (!hooks_configured_ && rollout_.running()) configure_hooks_from_dir();
    write_status();

    auto due = Clock::time_point::max();  // debounced reconcile
    auto next_status = Clock::now() + 1s, next_resync = Clock::now() + cfg_.resync;
    for (;;) {
        // compile_due_ waits for a quiet moment: while a reconcile is due it is not a reason to
        // wake (else a stream of changes would spin the loop at timeout 0).
        auto wake = std::min(
            {due, next_status, next_resync, due == Clock::time_point::max() ? compile_due_ : due});
        int timeout = static_cast<int>(std::max<int64_t>(
            0, std::chrono::duration_cast<std::chrono::milliseconds>(wake - Clock::now()).count()));
        epoll_event evs[8];
        int n = epoll_wait(epoll_.get(), evs, 8, timeout);
        bool stop = false;
        for (int i = 0; i < n; ++i) {
            int fd = evs[i].data.fd;
            if (fd == sigfd.get()) {
                signalfd_siginfo si;
                while (read(sigfd.get(), &si, sizeof si) == sizeof si) {
                    if (si.ssi_signo == SIGUSR1) {
                        log_summary();
                        write_status();
                        continue;
                    }
                    if (si.ssi_signo != SIGHUP) {
                        stop = true;
                        continue;
                    }
                    // Re-read the policy directory now, retrying a revision that failed.
                    spdlog::info("SIGHUP: re-reading {}", cfg_.policies_dir);
                    failed_content_.clear();
                    due = Clock::now();
                }
            } else if (fd == events_fd) {
                for (const auto& e : event_thread_->take_events()) events_->record(e);
                events_->flush();
            } else if (fd == step_writes_.fd()) {
                rollout_.write_steps(step_writes_.take());
            } else if (watch_->handle(fd)) {
                due = Clock::now() + cfg_.debounce;  // quiet for `debounce`, then reconcile
                for (auto& l : watch_->take_link_changes())
                    event_thread_->run_later(
                        [this, l = lua::Link{l.interface, l.up}] { hooks_.on_link(l); });
            }
        }
        if (stop) break;
        auto now = Clock::now();
        if (now >= due) {
            due = Clock::time_point::max();
            bool was = status_.suspended;
            status_.suspended = fs::exists(suspended_path(cfg_.state_dir));
            if (was != status_.suspended) spdlog::info(status_.suspended ? "suspended" : "resumed");
            reconcile();
            write_status();
        }
        if (now >= next_resync) {
            next_resync = now + cfg_.resync;
            reconcile();
        }
        if (now >= compile_due_ && due == Clock::time_point::max()) {
            compile_due_ = Clock::time_point::max();
            rollout_.compile_entries();
            // Loading parsed objects, the kernel's BTF and verifier logs; the agent then idles
            // for hours: give the freed heap back rather than keep it resident.
            malloc_trim(0);
        }
        if (now >= next_status) {
            next_status = now + 1s;
            write_status();
        }
    }
    spdlog::info("stopping");
    event_thread_->stop();  // the hooks' last event runs to its end
    for (const auto& e : event_thread_->take_events()) events_->record(e);
    events_->flush();
    rollout_.write_steps(step_writes_.take());  // what the last hooks asked for
    rollout_.release_links(cfg_.detach_on_exit);
    write_status();
    watch_.reset();
    epoll_.reset();
    return 0;
}
}  // namespace

int run(const Config& cfg) {
    const sigset_t sigs = agent_signals();
    pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
    signal(SIGUSR1, SIG_DFL);  // blocked now: queued for the signalfd (main.cpp ignores it)
    datapath::init_libbpf_logging();
    // What no policy can do without, named before any load is tried.
    const auto kernel = datapath::probe_kernel_basics();
    if (!kernel.bpf_unusable.empty()) {
        spdlog::error("this kernel ({}) cannot run the datapath: {}", kernel.release,
                      kernel.bpf_unusable);
        return 1;
    }
    if (!kernel.jit)
        spdlog::warn(
            "net.core.bpf_jit_enable is 0: the datapath runs in the BPF interpreter, "
            "several times slower");
    if (!cfg.netns.empty()) {
        net::Fd fd(open(("/run/netns/" + cfg.netns).c_str(), O_RDONLY | O_CLOEXEC));
        if (!fd || setns(fd.get(), CLONE_NEWNET)) {
            spdlog::error("entering network namespace {}: {}", cfg.netns, std::strerror(errno));
            return 1;
        }
    }
    try {
        auto state_lock = AgentLock::try_take(cfg.state_dir);
        if (!state_lock) {
            spdlog::error("another mpsteer agent runs with state in {}", cfg.state_dir);
            return 1;
        }
        // Two agents on one pin root would replace each other's generations.
        auto pin_lock = AgentLock::try_take_pin_root(cfg.pin_root);
        if (!pin_lock) {
            spdlog::error("another mpsteer agent uses the pin root {} (one agent per pin root)",
                          cfg.pin_root);
            return 1;
        }
        Agent a(cfg);
        return a.run();
    } catch (const std::exception& e) {
        spdlog::error("{}", e.what());
        return 1;
    }
}

void reset(const std::string& pin_root, const std::string& state_dir) {
    auto lock = AgentLock::try_take(state_dir);
    if (!lock) throw std::runtime_error("an agent is running (stop it first)");
    const bool pins_exist = fs::is_directory(pin_root);
    auto pin_lock =
        pins_exist ? AgentLock::try_take_pin_root(pin_root) : std::optional<AgentLock>();
    if (pins_exist && !pin_lock)
        throw std::runtime_error("an agent uses " + pin_root + " (stop it first)");
    Rollout::remove_pins(pin_root);
    std::error_code ec;
    for (auto p : {status_path(state_dir), events_path(state_dir), suspended_path(state_dir),
                   state_dir + "/state"})
        fs::remove_all(p, ec);
}

}  // namespace mpsteer::agent
