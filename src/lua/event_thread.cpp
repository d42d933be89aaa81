// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
#include "lua/event_thread.h"

#include <pthread.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include <spdlog/spdlog.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cmath>
#include <cstring>

namespace mpsteer::lua {
using Clock = std::chrono::steady_clock;

std::optional<PollMode> poll_mode_from_string(std::string_view s) {
    if (s == "wait") return PollMode::wait;
    if (s == "spin") return PollMode::spin;
    if (s == "adaptive") return PollMode::adaptive;
    return std::nullopt;
}

const char* to_string(PollMode m) {
    switch (m) {
    case PollMode::wait: return "wait";
    case PollMode::spin: return "spin";
    case PollMode::adaptive: return "adaptive";
    }
    return "?";
}

// ---- LatencyHistogram ----------------------------------------------------------------------
// Values below 2 * kSub ns have a bucket each; above, each power of two is cut into kSub
// buckets (upper bounds within 1/kSub of the value).

int LatencyHistogram::bucket(uint64_t ns) {
    if (ns < 2 * kSub) return int(ns);
    int msb = 63 - std::countl_zero(ns);                 // >= 5
    int shift = msb - std::countr_zero(uint64_t(kSub));  // keep the top log2(kSub)+1 bits
    int b = (msb - 3) * kSub + int((ns >> shift) & (kSub - 1));
    return std::min(b, kBuckets - 1);
}

uint64_t LatencyHistogram::upper(int b) {
    if (b < 2 * kSub) return uint64_t(b);
    int msb = b / kSub + 3;
    int shift = msb - std::countr_zero(uint64_t(kSub));
    uint64_t mant = uint64_t(kSub + b % kSub);
    return ((mant + 1) << shift) - 1;
}

void LatencyHistogram::add(uint64_t ns) {
    ++buckets_[bucket(ns)];
    ++count_;
    sum_ns_ += ns;
    max_ns_ = std::max(max_ns_, ns);
}

double LatencyHistogram::percentile_us(double p) const {
    if (!count_) return 0;
    uint64_t rank = uint64_t(std::ceil(p / 100.0 * double(count_)));
    rank = std::clamp<uint64_t>(rank, 1, count_);
    uint64_t seen = 0;
    for (int b = 0; b < kBuckets; ++b) {
        seen += buckets_[b];
        if (seen >= rank) return double(std::min(upper(b), max_ns_)) / 1e3;
    }
    return max_us();
}

nlohmann::json EventThreadStats::to_json() const {
    auto r1 = [](double v) { return std::round(v * 10) / 10; };
    auto lat = [&](const LatencyHistogram& h) {
        return nlohmann::json{{"count", h.count()},
                              {"p50", r1(h.percentile_us(50))},
                              {"p99", r1(h.percentile_us(99))},
                              {"max", r1(h.max_us())},
                              {"sum", r1(h.sum_us())}};
    };
    return {{"mode", mode},
            {"rt_priority", rt_priority},
            {"rt_refused", rt_refused},
            {"cpu", cpu},
            {"events", events},
            {"wakeups", wakeups},
            {"events_while_polling", events_while_polling},
            {"dispatch_errors", dispatch_errors},
            {"handoff_dropped", handoff_dropped},
            {"ticks", ticks},
            {"latency_us", lat(latency)},
            {"latency_after_wakeup_us", lat(latency_after_wakeup)}};
}

// ---- EventThread ---------------------------------------------------------------------------

namespace {
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield" ::: "memory");
#endif
}

uint64_t mono_ns() {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);  // bpf_ktime_get_ns()'s clock
    return uint64_t(ts.tv_sec) * 1'000'000'000ull + uint64_t(ts.tv_nsec);
}

void bump(int fd) {
    uint64_t one = 1;
    while (write(fd, &one, sizeof one) < 0 && errno == EINTR) {}
}

void drain(int fd) {
    uint64_t v;
    while (read(fd, &v, sizeof v) < 0 && errno == EINTR) {}
}
}  // namespace

EventThread::EventThread(const datapath::StateMaps& state, HookDispatcher& dispatcher, Hooks& hooks,
                         EventThreadOptions opts)
    : state_(state), dispatcher_(dispatcher), hooks_(hooks), opts_(std::move(opts)) {
    stats_.mode = to_string(opts_.mode);
    stats_.rt_priority = opts_.rt_priority;
    stats_.cpu = opts_.cpu;
    reader_ = std::make_unique<datapath::EventReader>(
        state_, [this](const datapath::Event& ev) { on_event(ev); });
    epoll_.reset(epoll_create1(EPOLL_CLOEXEC));
    wake_fd_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    notify_fd_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
    if (!epoll_ || !wake_fd_ || !notify_fd_)
        throw datapath::Error(std::string("event thread: ") + std::strerror(errno));
    // The ring buffer map itself is pollable (readable while records wait): no nested epoll.
    epoll_event ev{EPOLLIN, {.fd = state_.events()}};
    epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, state_.events(), &ev);
    ev.data.fd = wake_fd_.get();
    epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, wake_fd_.get(), &ev);
    running_ = true;
    thread_ = std::thread([this] { run(); });
}

EventThread::~EventThread() {
    stop();
    reader_.reset();
}

void EventThread::stop() {
    if (!thread_.joinable()) return;
    stop_ = true;
    bump(wake_fd_.get());
    thread_.join();
    // Tasks posted between the thread's last look and now run here; later ones run inline.
    std::vector<std::function<void()>> left;
    {
        std::lock_guard lock(tasks_mu_);
        closed_ = true;
        running_ = false;
        left.swap(tasks_);
    }
    for (auto& t : left) t();
}

bool EventThread::post(std::function<void()> task) {
    {
        std::lock_guard lock(tasks_mu_);
        if (closed_) return false;
        tasks_.push_back(std::move(task));
        tasks_pending_.store(true, std::memory_order_release);
    }
    bump(wake_fd_.get());
    return true;
}

void EventThread::run_later(std::function<void()> f) {
    auto guarded = [f = std::move(f)] {
        try {
            f();
        } catch (const std::exception& e) {
            spdlog::warn("event thread: {}", e.what());
        }
    };
    if (!post(guarded)) guarded();
}

bool EventThread::run_tasks() {
    std::vector<std::function<void()>> now;
    {
        std::lock_guard lock(tasks_mu_);
        now.swap(tasks_);
        tasks_pending_.store(false, std::memory_order_relaxed);
    }
    for (auto& t : now) t();  // packaged tasks: their exceptions go to the caller
    // A configure may have added, removed or rescheduled scripts.
    next_tick_ = hooks_.tick(Clock::now());
    return !now.empty();
}

EventThreadStats EventThread::stats() {
    return call([this] { return stats_; });
}

std::vector<datapath::Event> EventThread::take_events() {
    drain(notify_fd_.get());  // first: an event added after the swap below notifies again
    std::vector<datapath::Event> out;
    std::lock_guard lock(handoff_mu_);
    out.swap(handoff_);
    return out;
}

void EventThread::notify_owner() {
    bump(notify_fd_.get());
}

void EventThread::on_event(const datapath::Event& ev) {
    if (opts_.before_hooks) opts_.before_hooks(ev);
    ++stats_.events;
    if (!after_sleep_) ++stats_.events_while_polling;
    const uint64_t calls = hooks_.calls();
    try {
        dispatcher_.dispatch(hooks_, ev);
    } catch (const std::exception& e) {
        // A map or socket error outside a script (the scripts' own errors are contained in
        // Hooks): this event's hooks are lost, the next ones run.
        if (stats_.dispatch_errors++ < 10) spdlog::warn("lua hooks: event: {}", e.what());
    }
    if (hooks_.calls() != calls) {
        const uint64_t now = mono_ns();
        const uint64_t ns = now > ev.raw.ts_ns ? now - ev.raw.ts_ns : 0;
        stats_.latency.add(ns);
        if (after_sleep_) stats_.latency_after_wakeup.add(ns);
    }
    bool first;
    {
        std::lock_guard lock(handoff_mu_);
        first = handoff_.empty();
        if (handoff_.size() < opts_.handoff_max)
            handoff_.push_back(ev);
        else
            ++stats_.handoff_dropped;
    }
    if (first) notify_owner();
}

void EventThread::sleep_until(Clock::time_point t) {
    int timeout = -1;
    if (t != Clock::time_point::max()) {
        auto left = std::chrono::ceil<std::chrono::milliseconds>(t - Clock::now()).count();
        timeout = int(std::clamp<int64_t>(left, 0, 60'000));
    }
    epoll_event evs[4];
    int n = epoll_wait(epoll_.get(), evs, 4, timeout);
    for (int i = 0; i < n; ++i)
        if (evs[i].data.fd == wake_fd_.get()) drain(wake_fd_.get());
    if (n > 0) ++stats_.wakeups;
    after_sleep_ = true;
}

void EventThread::run() {
    tid_ = pid_t(gettid());
    pthread_setname_np(pthread_self(), "mps-events");
    if (opts_.cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(opts_.cpu, &set);
        if (int err = pthread_setaffinity_np(pthread_self(), sizeof set, &set))
            spdlog::warn("event thread: pinning to CPU {}: {}", opts_.cpu, std::strerror(err));
    }
    if (opts_.rt_priority > 0) {
        sched_param sp{};
        sp.sched_priority = opts_.rt_priority;
        if (int err = pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp)) {
            stats_.rt_refused = true;
            spdlog::warn("event thread: SCHED_FIFO priority {}: {} (running as SCHED_OTHER)",
                         opts_.rt_priority, std::strerror(err));
        }
    }
    if (opts_.mode == PollMode::spin && opts_.rt_priority > 0 && !stats_.rt_refused)
        spdlog::warn(
            "event thread: spinning as SCHED_FIFO starves its CPU's other tasks; the "
            "kernel's RT throttling then stops it for tens of milliseconds at a time "
            "(lua/README.md, \"Event latency\")");
    spdlog::info("event thread: mode {}{}{}{}", to_string(opts_.mode),
                 opts_.mode == PollMode::adaptive
                     ? " (polls " + std::to_string(opts_.spin.count()) + " us after each event)"
                     : "",
                 opts_.rt_priority > 0 && !stats_.rt_refused
                     ? ", SCHED_FIFO " + std::to_string(opts_.rt_priority)
                     : "",
                 opts_.cpu >= 0 ? ", CPU " + std::to_string(opts_.cpu) : "");
    auto last_busy = Clock::now();
    bool gc_left = true;
    while (!stop_.load(std::memory_order_relaxed)) {
        bool busy = false;
        try {
            busy = reader_->consume() > 0;  // on_event runs inside, once per record
        } catch (const std::exception& e) {
            spdlog::error("event thread: {}", e.what());
        }
        after_sleep_ = false;
        if (tasks_pending_.load(std::memory_order_acquire)) busy |= run_tasks();
        auto now = Clock::now();
        if (busy) next_tick_ = std::min(next_tick_, hooks_.wake(now));
        if (now >= next_tick_) {
            next_tick_ = hooks_.tick(now);  // on_tick of every due script
            ++stats_.ticks;
            busy = true;
        }
        if (busy) {
            last_busy = now;
            gc_left = true;
            continue;
        }
        // Idle: the scripts' garbage first (one bounded step per look at the ring), so the
        // collector has little left to do inside the next event's hooks.
        if (gc_left && (gc_left = hooks_.collect_step())) continue;
        if (opts_.mode == PollMode::spin ||
            (opts_.mode == PollMode::adaptive && now - last_busy < opts_.spin)) {
            cpu_relax();
            continue;
        }
        sleep_until(next_tick_);
    }
    // call()s that raced with stop() find their tasks run by stop().
}

}  // namespace mpsteer::lua
