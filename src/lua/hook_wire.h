// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The messages between the agent and its hook process (hook_process.h) on a stream socketpair:
// each one a 4-byte length (little-endian, the bytes after it), a version byte and a JSON
// object whose "t" names it. Both sides refuse a frame that is longer than kMaxMessage, of
// another version, or not an object: the agent treats that as the hook process failing.
//
// agent -> host                       host -> agent
//   setup {limits, uid, gid, as}        hello {uid, gid, no_new_privs, seccomp, ...}
//   configure {specs, revision, gen}    call {fn, ...}                 (a Backend method)
//   connection / subflow /              log {level, text}
//     subflow_closed / add_addr_blocked done {calls, next, writes, ...}  (the request's answer;
//     / link                              after configure and disable also `hooks`, the ones the
//                                         scripts define: the agent sends no event without one)
//   tick {now}, status, disable
//   ret {value} | ret {error}
//
// Which script call runs is not a message: the process writes it into a RunningSlot both map,
// and the agent reads it only when a request runs long (no wake-up of the agent per call).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "lua/hooks.h"

namespace mpsteer::lua::wire {

constexpr uint8_t kVersion = 1;
constexpr uint32_t kMaxMessage = 16u << 20;  // configure carries every script's text

struct Error : std::runtime_error {
    using std::runtime_error::runtime_error;
};

// The script call in progress in the hook process, in a page of a memfd the agent passes as
// fd 4 (kSlotFd). A seqlock whose one writer is the process (`seq` odd while it writes). The
// agent trusts none of it beyond naming a configured script (`spec` indexes the specs of the
// last configure) and extending a request's deadline within the request's cap. 32-bit words
// only: lock-free, so shared between processes, on every architecture.
struct RunningSlot {
    std::atomic<uint32_t> seq{0};
    std::atomic<uint32_t> running{0};
    std::atomic<uint32_t> spec{0};
    std::atomic<uint32_t> what{0};                   // call_index()
    std::atomic<uint32_t> since_lo{0}, since_hi{0};  // steady clock, ns (to_ns)
};
static_assert(std::atomic<uint32_t>::is_always_lock_free);
constexpr int kSlotFd = 4;
// What a script call is, as the slot's `what`: 0 its state's setup, 1 its chunk, 2 + i the
// hook kHookNames[i] (sandbox.h); a name it does not know reads as "a call".
uint32_t call_index(const std::string& what);
std::string call_name(uint32_t index);
// The process's side: a call begins (spec, what) or ends (nullopt).
void publish(RunningSlot& slot, std::optional<std::pair<uint32_t, uint32_t>> call);
// The agent's side: the call in progress (spec, what, since), if it read a consistent one.
struct SlotCall {
    uint32_t spec, what;
    std::chrono::steady_clock::time_point since;
};
std::optional<SlotCall> read(const RunningSlot& slot);

// Throws Error when the peer is gone (EPIPE, never SIGPIPE).
void send(int fd, const nlohmann::json& m);
// The next message, or nullopt once `deadline` passed before one began (steady clock; max():
// wait). Throws Error at the end of the stream, on a malformed frame, or on one that began but
// did not arrive whole by the deadline.
std::optional<nlohmann::json> receive(int fd, std::chrono::steady_clock::time_point deadline =
                                                  std::chrono::steady_clock::time_point::max());

// Time points of the steady clock (CLOCK_MONOTONIC, the same in both processes) as
// nanoseconds; max() as -1.
int64_t to_ns(std::chrono::steady_clock::time_point t);
std::chrono::steady_clock::time_point from_ns(int64_t ns);

}  // namespace mpsteer::lua::wire

namespace mpsteer::lua {
// What crosses the socket; from_json checks every field's presence and type (nlohmann throws
// otherwise).
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Subflow, id, token, a, b, bytes, packets, bytes_ab, bytes_ba,
                                   srtt_us, rttvar_us, cwnd, inflight, notsent, delivery_rate, rate,
                                   backup, local, join, local_address, bytes_received, last_recv_ms,
                                   last_ack_ms)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Connection, token, token_b, bytes, packets, unsent, subflows)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(AddAddr, token, address, port, addr_id, subflow)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Link, interface, up)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(Endpoint, id, address, interface, subflow, signal, backup)
NLOHMANN_DEFINE_TYPE_NON_INTRUSIVE(ScriptSpec, policy, name, source, every_ms, params,
                                   idle_every_ms)
void from_json(const nlohmann::json& j, ScriptStatus& s);  // to_json: ScriptStatus::to_json()
void to_json(nlohmann::json& j, const Limits& l);
void from_json(const nlohmann::json& j, Limits& l);
}  // namespace mpsteer::lua
