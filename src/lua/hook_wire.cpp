// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Framing and (de)serialisation of the agent <-> hook process messages (hook_wire.h).
#include "lua/hook_wire.h"

#include "lua/sandbox.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <string>
#include <thread>

namespace mpsteer::lua::wire {

using Clock = std::chrono::steady_clock;

void send(int fd, const nlohmann::json& m) {
    const std::string body = m.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    if (body.size() + 1 > kMaxMessage) throw Error("message too long to send");
    const uint32_t n = uint32_t(body.size() + 1);
    std::string frame(5, '\0');
    for (int i = 0; i < 4; ++i) frame[i] = char((n >> (8 * i)) & 0xff);
    frame[4] = char(kVersion);
    frame += body;
    size_t off = 0;
    while (off < frame.size()) {
        ssize_t w = ::send(fd, frame.data() + off, frame.size() - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) throw Error(std::string("hook process socket: ") + std::strerror(errno));
        off += size_t(w);
    }
}

namespace {
// Reads exactly n bytes before the deadline: false when it passed first.
bool read_exact(int fd, char* p, size_t n, Clock::time_point deadline) {
    while (n) {
        // What has arrived is read without a poll first (a frame's body follows its head).
        ssize_t got = ::recv(fd, p, n, MSG_DONTWAIT);
        if (got > 0) {
            p += got;
            n -= size_t(got);
            continue;
        }
        if (got == 0) throw Error("the hook process closed its socket");
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            throw Error(std::string("hook process socket: ") + std::strerror(errno));
        int timeout = -1;
        if (deadline != Clock::time_point::max()) {
            auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now());
            if (left.count() <= 0) return false;
            timeout = int(std::min<int64_t>(left.count(), 60'000));
        }
        pollfd pfd{fd, POLLIN, 0};
        int r = poll(&pfd, 1, timeout);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) throw Error(std::string("hook process socket: ") + std::strerror(errno));
        // Readable or the deadline re-checked: either way the loop's recv comes next.
    }
    return true;
}
}  // namespace

std::optional<nlohmann::json> receive(int fd, Clock::time_point deadline) {
    // Also when messages keep coming: a stream of them is no way past the deadline.
    if (deadline != Clock::time_point::max() && Clock::now() >= deadline) return std::nullopt;
    unsigned char head[5];
    if (!read_exact(fd, reinterpret_cast<char*>(head), sizeof head, deadline)) return std::nullopt;
    const uint32_t n = uint32_t(head[0]) | uint32_t(head[1]) << 8 | uint32_t(head[2]) << 16 |
                       uint32_t(head[3]) << 24;
    if (n < 1 || n > kMaxMessage) throw Error("a message of " + std::to_string(n) + " bytes");
    if (head[4] != kVersion)
        throw Error("a message of version " + std::to_string(head[4]) + " (this side speaks " +
                    std::to_string(kVersion) + ")");
    std::string body(n - 1, '\0');
    // Once a frame has begun, it must arrive whole by the deadline too: a caller that waits on
    // after a nullopt must find the stream at a frame's start.
    if (!read_exact(fd, body.data(), body.size(), deadline))
        throw Error("a message cut short at its deadline");
    auto j = nlohmann::json::parse(body, nullptr, false);
    if (j.is_discarded() || !j.is_object() || !j.contains("t") || !j["t"].is_string())
        throw Error("a message that is not a JSON object with a type");
    return j;
}

uint32_t call_index(const std::string& what) {
    if (what == "setup") return 0;
    if (what == "load") return 1;
    const int hook = hook_index(what.c_str());
    return hook < 0 ? UINT32_MAX : uint32_t(2 + hook);
}

std::string call_name(uint32_t index) {
    if (index == 0) return "setup";
    if (index == 1) return "load";
    if (index - 2 < std::size(kHookNames)) return kHookNames[index - 2];
    return "a call";
}

void publish(RunningSlot& slot, std::optional<std::pair<uint32_t, uint32_t>> call) {
    const uint32_t seq = slot.seq.load(std::memory_order_relaxed);
    slot.seq.store(seq + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    slot.running.store(call ? 1 : 0, std::memory_order_relaxed);
    if (call) {
        const auto ns = uint64_t(to_ns(Clock::now()));
        slot.spec.store(call->first, std::memory_order_relaxed);
        slot.what.store(call->second, std::memory_order_relaxed);
        slot.since_lo.store(uint32_t(ns), std::memory_order_relaxed);
        slot.since_hi.store(uint32_t(ns >> 32), std::memory_order_relaxed);
    }
    slot.seq.store(seq + 2, std::memory_order_release);
}

std::optional<SlotCall> read(const RunningSlot& slot) {
    // The writer holds the sequence odd for a few stores; a process stopped in between (or one
    // that writes nonsense) reads as no call.
    for (int attempt = 0; attempt < 100; ++attempt) {
        const uint32_t before = slot.seq.load(std::memory_order_acquire);
        if (before & 1) {
            std::this_thread::yield();
            continue;
        }
        const bool running = slot.running.load(std::memory_order_relaxed);
        SlotCall c{slot.spec.load(std::memory_order_relaxed),
                   slot.what.load(std::memory_order_relaxed),
                   {}};
        const uint64_t ns = uint64_t(slot.since_lo.load(std::memory_order_relaxed)) |
                            uint64_t(slot.since_hi.load(std::memory_order_relaxed)) << 32;
        std::atomic_thread_fence(std::memory_order_acquire);
        if (slot.seq.load(std::memory_order_relaxed) != before) continue;
        if (!running) return std::nullopt;
        c.since = from_ns(int64_t(ns & INT64_MAX));
        return c;
    }
    return std::nullopt;
}

int64_t to_ns(Clock::time_point t) {
    if (t == Clock::time_point::max()) return -1;
    return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
}

Clock::time_point from_ns(int64_t ns) {
    if (ns < 0) return Clock::time_point::max();
    return Clock::time_point(
        std::chrono::duration_cast<Clock::duration>(std::chrono::nanoseconds(ns)));
}

}  // namespace mpsteer::lua::wire

namespace mpsteer::lua {

void from_json(const nlohmann::json& j, ScriptStatus& s) {
    j.at("policy").get_to(s.policy);
    j.at("script").get_to(s.script);
    s.disabled = j.at("state").get<std::string>() == "disabled";
    j.at("loaded").get_to(s.loaded);
    j.at("calls").get_to(s.calls);
    j.at("failures").get_to(s.failures);
    j.at("consecutive_failures").get_to(s.consecutive_failures);
    j.at("writes").get_to(s.writes);
    j.at("last_error").get_to(s.last_error);
    j.at("last_call_us").get_to(s.last_call_us);
    j.at("max_call_us").get_to(s.max_call_us);
    // The process is not trusted with the bounds set_status keeps: checked again here.
    const auto& p = j.at("published");
    if (!p.is_object() || p.size() > ScriptStatus::kStatusEntries)
        throw wire::Error("a script's published status is not a small object");
    for (const auto& [k, v] : p.items())
        if (k.size() > ScriptStatus::kStatusKeyBytes ||
            !(v.is_number() || v.is_boolean() ||
              (v.is_string() &&
               v.get_ref<const std::string&>().size() <= 4 * ScriptStatus::kStatusValueBytes)))
            throw wire::Error("a script's published status holds an entry it may not");
    s.published = p;
}

void to_json(nlohmann::json& j, const Limits& l) {
    j = {{"instructions", l.instructions},
         {"memory_bytes", l.memory_bytes},
         {"max_failures", l.max_failures},
         {"call_time_ms", l.call_time.count()},
         {"api_calls", l.api_calls},
         {"message_bytes", l.message_bytes},
         {"log_lines_per_s", l.log_lines_per_s}};
}

void from_json(const nlohmann::json& j, Limits& l) {
    j.at("instructions").get_to(l.instructions);
    j.at("memory_bytes").get_to(l.memory_bytes);
    j.at("max_failures").get_to(l.max_failures);
    l.call_time = std::chrono::milliseconds(j.at("call_time_ms").get<int64_t>());
    j.at("api_calls").get_to(l.api_calls);
    j.at("message_bytes").get_to(l.message_bytes);
    j.at("log_lines_per_s").get_to(l.log_lines_per_s);
}

}  // namespace mpsteer::lua
