// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The hooks' event thread: takes datapath events off the ring buffer and has the Lua hooks run
// on them (HookDispatcher::dispatch; the agent's scripts run in the hook process, whose Backend
// calls this thread serves). Everything that touches the Hooks, their DatapathBackend or the
// HookDispatcher runs on this thread: events, on_tick, and
// whatever the owner hands over with call() (configure after an apply, the status, the running
// generation). The owner gets each event afterwards through take_events() (the agent counts and
// logs them off the event path). The hooks never write a generation: their step writes go to
// the agent through a StepWriteQueue (step_writes.h).
//
// How the thread waits for events is the latency/CPU trade-off (lua/README.md, "Event
// latency", has figures):
//   wait      sleeps in epoll on the ring buffer; each event pays a thread wake-up.
//   spin      polls the ring without sleeping: no wake-up, one CPU busy all the time.
//   adaptive  polls for `spin` after each event (and after each wake-up), then sleeps: the
//             events that follow another closely (a connection's handshake, its subflows'
//             joins) pay no wake-up; the CPU cost is bounded by `spin` per event.
// SCHED_FIFO (rt_priority) lets the thread run ahead of busy CPUs' other tasks on wake-up;
// `cpu` pins it.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <chrono>
#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <type_traits>
#include <vector>

#include <nlohmann/json.hpp>

#include "datapath/datapath.h"
#include "net/fd.h"
#include "lua/hook_dispatcher.h"
#include "lua/hooks.h"

namespace mpsteer::lua {

enum class PollMode { wait, spin, adaptive };
std::optional<PollMode> poll_mode_from_string(std::string_view s);
const char* to_string(PollMode m);

struct EventThreadOptions {
    PollMode mode = PollMode::wait;
    std::chrono::microseconds spin{1000};  // adaptive: poll this long after the last event
    int rt_priority = 0;                   // SCHED_FIFO priority 1-99; 0: SCHED_OTHER
    int cpu = -1;                          // pin the thread to this CPU; -1: any
    size_t handoff_max = 65536;            // events held for take_events(); beyond: dropped
    // Called on the event thread with each event just before the hooks run (a probe for
    // benchmarks; the agent sets none).
    std::function<void(const datapath::Event&)> before_hooks;
};

// Event latency: from the datapath's timestamp (bpf_ktime_get_ns, CLOCK_MONOTONIC) to the end
// of the hooks' run, in a log-linear histogram (about 6 % resolution).
class LatencyHistogram {
public:
    void add(uint64_t ns);
    uint64_t count() const { return count_; }
    double percentile_us(double p) const;  // bucket upper bound, 0 when empty
    double max_us() const { return double(max_ns_) / 1e3; }
    double sum_us() const { return double(sum_ns_) / 1e3; }

private:
    static constexpr int kSub = 16;  // buckets per power of two
    static constexpr int kBuckets = 64 * kSub;
    static int bucket(uint64_t ns);
    static uint64_t upper(int b);
    uint64_t buckets_[kBuckets] = {};
    uint64_t count_ = 0, max_ns_ = 0, sum_ns_ = 0;
};

struct EventThreadStats {
    std::string mode;
    int rt_priority = 0, cpu = -1;
    bool rt_refused = false;            // SCHED_FIFO asked for and refused (EPERM, RT throttling)
    uint64_t events = 0;                // taken from the ring
    uint64_t wakeups = 0;               // returns from epoll with something to do
    uint64_t events_while_polling = 0;  // events found by polling (no wake-up paid)
    uint64_t dispatch_errors = 0;       // dispatch threw (logged; the thread carries on)
    uint64_t handoff_dropped = 0;       // events the owner did not take in time
    uint64_t ticks = 0;                 // Hooks::tick runs
    LatencyHistogram latency;           // event -> hooks done, events that reached a script
    LatencyHistogram latency_after_wakeup;  // the same, events found right after a sleep
    nlohmann::json to_json() const;
};

class EventThread {
public:
    // Starts the thread (in the calling thread's network namespace). The dispatcher, the hook
    // set and its backend must outlive this object and must not be touched elsewhere until it
    // is destroyed, except through call(). Throws datapath::Error when the ring buffer cannot
    // be opened.
    EventThread(const datapath::StateMaps& state, HookDispatcher& dispatcher, Hooks& hooks,
                EventThreadOptions opts = {});
    ~EventThread();  // stop()
    EventThread(const EventThread&) = delete;
    EventThread& operator=(const EventThread&) = delete;

    // Stops the thread after the event in hand (idempotent). Afterwards call() runs inline.
    void stop();

    // Runs f on the event thread between two events and returns its result (exceptions are
    // rethrown here). On the event thread itself, or once stopped, runs f directly.
    template <typename F>
    auto call(F&& f) -> std::invoke_result_t<F&> {
        using R = std::invoke_result_t<F&>;
        if (!running_.load() || std::this_thread::get_id() == thread_.get_id()) return f();
        auto task = std::make_shared<std::packaged_task<R()>>(std::forward<F>(f));
        auto fut = task->get_future();
        if (!post([task] { (*task)(); })) (*task)();
        return fut.get();
    }

    // Like call() for a void f, waiting at most `timeout`: false when f has not run by then (a
    // hung hook; f still runs when the thread gets to it, so it must own what it uses).
    // Exceptions are rethrown here.
    template <typename F>
    bool call_for(std::chrono::milliseconds timeout, F&& f) {
        if (!running_.load() || std::this_thread::get_id() == thread_.get_id()) {
            f();
            return true;
        }
        auto task = std::make_shared<std::packaged_task<void()>>(std::forward<F>(f));
        auto fut = task->get_future();
        if (!post([task] { (*task)(); })) (*task)();
        if (fut.wait_for(timeout) != std::future_status::ready) return false;
        fut.get();
        return true;
    }

    // Runs f on the event thread when it gets to it, without waiting for it (an exception out
    // of f is logged); inline once stopped.
    void run_later(std::function<void()> f);

    // Events the hooks have seen since the last call, oldest first. notify_fd() (an eventfd)
    // becomes readable when the list goes from empty to non-empty; take_events() resets it.
    std::vector<datapath::Event> take_events();
    int notify_fd() const { return notify_fd_.get(); }

    EventThreadStats stats();  // a copy, taken on the event thread (call())
    const EventThreadOptions& options() const { return opts_; }
    pid_t tid() const { return tid_.load(); }

private:
    bool post(std::function<void()> task);  // false: stopped (run it yourself)
    void run();
    bool run_tasks();
    void on_event(const datapath::Event& ev);
    void sleep_until(std::chrono::steady_clock::time_point t);
    void notify_owner();

    const datapath::StateMaps& state_;
    HookDispatcher& dispatcher_;
    Hooks& hooks_;
    EventThreadOptions opts_;
    std::unique_ptr<datapath::EventReader> reader_;
    net::Fd epoll_, wake_fd_, notify_fd_;
    std::atomic<bool> stop_{false}, running_{false}, tasks_pending_{false};
    bool closed_ = false;  // under tasks_mu_: no more tasks accepted
    std::atomic<pid_t> tid_{0};
    std::mutex tasks_mu_;
    std::vector<std::function<void()>> tasks_;
    std::mutex handoff_mu_;
    std::vector<datapath::Event> handoff_;
    EventThreadStats stats_;    // the event thread's
    bool after_sleep_ = false;  // the events in hand were found right after a sleep
    std::chrono::steady_clock::time_point next_tick_ = std::chrono::steady_clock::time_point::max();
    std::thread thread_;
};

}  // namespace mpsteer::lua
