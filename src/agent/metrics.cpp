// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
#include "agent/metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <spdlog/spdlog.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "agent/status.h"
#include "net/fd.h"

namespace mpsteer::agent {

// A tiny HTTP server for GET /metrics on 127.0.0.1: one thread polling every connection, so a
// slow or idle client never holds up another. Connections are bounded in number and in time.
class MetricsServer {
public:
    static constexpr size_t kMaxClients = 32;
    static constexpr std::chrono::seconds kClientTimeout{2};
    static constexpr size_t kMaxRequestBytes = 8192;

    explicit MetricsServer(int port) {
        fd_.reset(socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
        int one = 1;
        setsockopt(fd_.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        sockaddr_in sa{};
        sa.sin_family = AF_INET;
        sa.sin_port = htons(static_cast<uint16_t>(port));
        sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        if (bind(fd_.get(), reinterpret_cast<sockaddr*>(&sa), sizeof sa) || listen(fd_.get(), 64)) {
            int err = errno;
            throw std::runtime_error("metrics on 127.0.0.1:" + std::to_string(port) + ": " +
                                     std::strerror(err));
        }
        stop_fd_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
        thread_ = std::thread([this] { serve(); });
    }
    ~MetricsServer() {
        uint64_t one = 1;
        (void)!write(stop_fd_.get(), &one, sizeof one);
        thread_.join();
    }
    void set(std::string text) {
        std::lock_guard lock(mu_);
        text_ = std::move(text);
    }

private:
    using Clock = std::chrono::steady_clock;
    struct Client {
        net::Fd fd;
        Clock::time_point deadline;
        std::string in, out;  // out non-empty: the request is read, the response goes out
        size_t sent = 0;
    };

    std::string respond(const std::string& head) {
        std::string body, status = "200 OK";
        if (head.rfind("GET /metrics", 0) == 0) {
            std::lock_guard lock(mu_);
            body = text_;
        } else {
            status = "404 Not Found";
            body = "try /metrics\n";
        }
        return "HTTP/1.1 " + status +
               "\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: " +
               std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" + body;
    }

    // Reads or writes what the socket allows; false when the connection is done.
    bool step(Client& c) {
        if (c.out.empty()) {
            char buf[2048];
            ssize_t n = recv(c.fd.get(), buf, sizeof buf, 0);
            if (n < 0 && (errno == EAGAIN || errno == EINTR)) return true;
            if (n <= 0) return false;
            c.in.append(buf, static_cast<size_t>(n));
            if (c.in.find("\r\n\r\n") == std::string::npos && c.in.size() < kMaxRequestBytes)
                return true;
            c.out = respond(c.in);
        }
        ssize_t n = send(c.fd.get(), c.out.data() + c.sent, c.out.size() - c.sent, MSG_NOSIGNAL);
        if (n < 0) return errno == EAGAIN || errno == EINTR;
        c.sent += static_cast<size_t>(n);
        return c.sent < c.out.size();
    }

    void serve() {
        std::vector<Client> clients;
        std::vector<pollfd> fds;
        for (;;) {
            fds.clear();
            fds.push_back({stop_fd_.get(), POLLIN, 0});
            fds.push_back(
                {fd_.get(), static_cast<short>(clients.size() < kMaxClients ? POLLIN : 0), 0});
            auto wake = Clock::time_point::max();
            for (const auto& c : clients) {
                fds.push_back(
                    {c.fd.get(), static_cast<short>(c.out.empty() ? POLLIN : POLLOUT), 0});
                wake = std::min(wake, c.deadline);
            }
            int timeout =
                clients.empty()
                    ? -1
                    : static_cast<int>(std::max<int64_t>(
                          0,
                          std::chrono::duration_cast<std::chrono::milliseconds>(wake - Clock::now())
                                  .count() +
                              1));
            if (poll(fds.data(), fds.size(), timeout) < 0 && errno != EINTR) {
                spdlog::error("metrics: poll: {}", std::strerror(errno));
                break;
            }
            if (fds[0].revents) break;
            const auto now = Clock::now();
            std::vector<Client> kept;
            for (size_t i = 0; i < clients.size(); ++i) {
                auto& c = clients[i];
                bool open = now < c.deadline && (!fds[i + 2].revents || step(c));
                if (open) kept.push_back(std::move(c));
            }
            clients = std::move(kept);  // closes the connections that are done
            while (fds[1].revents && clients.size() < kMaxClients) {
                net::Fd c(accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
                if (!c) break;
                clients.push_back({std::move(c), now + kClientTimeout, {}, {}, 0});
            }
        }
    }

    net::Fd fd_, stop_fd_;
    std::mutex mu_;
    std::string text_;
    std::thread thread_;
};

MetricsOutput::MetricsOutput(int port, std::string textfile) : textfile_(std::move(textfile)) {
    if (port > 0) try {
            server_ = std::make_unique<MetricsServer>(port);
        } catch (const std::exception& e) {
            spdlog::error("{} (carrying on without the metrics endpoint)", e.what());
        }
}

MetricsOutput::~MetricsOutput() = default;

void MetricsOutput::publish(const nlohmann::json& status) {
    auto text = to_prometheus(status);
    if (server_) server_->set(text);
    if (!textfile_.empty()) {
        try {
            write_atomic(textfile_, text);
        } catch (const std::exception& e) {
            spdlog::warn("metrics textfile: {}", e.what());
        }
    }
}

std::string to_prometheus(const nlohmann::json& s) {
    std::string out;
    auto esc = [](std::string v) {
        std::string r;
        for (char c : v) {
            if (c == '\\' || c == '"') r += '\\';
            if (c == '\n') {
                r += "\\n";
                continue;
            }
            r += c;
        }
        return r;
    };
    auto metric = [&](const std::string& name, const std::string& type, const std::string& help) {
        out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
    };
    auto num = [](const nlohmann::json& v) { return v.is_number() ? v.dump() : "0"; };
    metric("mpsteer_ready", "gauge", "1 when the last revision is applied and running");
    out += "mpsteer_ready " + std::string(s.value("ready", false) ? "1" : "0") + "\n";
    metric("mpsteer_generation", "gauge", "Number of the active datapath generation");
    out += "mpsteer_generation " + num(s["generation"]) + "\n";
    metric("mpsteer_revision_info", "gauge", "Applied and last attempted revision");
    out += "mpsteer_revision_info{applied=\"" + esc(s.value("applied_revision", "")) +
           "\",attempted=\"" + esc(s.value("attempted_revision", "")) + "\"} 1\n";
    metric("mpsteer_errors", "gauge", "Errors in the last attempted revision");
    out += "mpsteer_errors " + std::to_string(s["errors"].size()) + "\n";
    const std::pair<const char*, const char*> pol[] = {
        {"selected", "Packets that reached the policy's actions"},
        {"applied", "Actions that changed or reported a packet"},
        {"drops", "Packets the policy dropped"},
        {"missed_tail_calls", "Tail calls that missed in the policy's chain"}};
    for (auto [key, help] : pol) {
        std::string name = std::string("mpsteer_policy_") + key + "_total";
        metric(name, "counter", help);
        for (const auto& p : s["policies"])
            out += name + "{policy=\"" + esc(p.value("name", "")) + "\"} " + num(p[key]) + "\n";
    }
    metric("mpsteer_datapath_packets_total", "counter",
           "Packets seen by the active generation's entry programs, by outcome");
    for (const auto& [k, v] : s["datapath"].items())
        out += "mpsteer_datapath_packets_total{outcome=\"" + k + "\"} " + num(v) + "\n";
    if (s.contains("tables") && s["tables"].is_object()) {
        metric("mpsteer_table_capacity", "gauge", "Entries a state table holds before evicting");
        for (const auto& [k, v] : s["tables"].items())
            out += "mpsteer_table_capacity{table=\"" + esc(k) + "\"} " + num(v["capacity"]) + "\n";
        metric("mpsteer_table_memory_bytes", "gauge", "Kernel memory a state table takes");
        for (const auto& [k, v] : s["tables"].items())
            out += "mpsteer_table_memory_bytes{table=\"" + esc(k) + "\"} " +
                   num(v["memory_bytes"]) + "\n";
        metric("mpsteer_table_entries", "gauge", "Entries in a state table (counted every 10 s)");
        for (const auto& [k, v] : s["tables"].items())
            if (v.contains("entries"))
                out +=
                    "mpsteer_table_entries{table=\"" + esc(k) + "\"} " + num(v["entries"]) + "\n";
        metric("mpsteer_table_evictions_total", "counter",
               "Entries a full table dropped to make room for new ones (a SYN flood shows here)");
        for (const auto& [k, v] : s["tables"].items())
            if (v.contains("evictions"))
                out += "mpsteer_table_evictions_total{table=\"" + esc(k) + "\"} " +
                       num(v["evictions"]) + "\n";
    }
    metric("mpsteer_attachment_compiled", "gauge",
           "1 when the hook runs its chain's compiled entry, 0 when the entry program runs it "
           "(refused: the kernel refused the compiled entry)");
    for (const auto& a : s["attachments"])
        out += "mpsteer_attachment_compiled{interface=\"" + esc(a.value("interface", "")) +
               "\",hook=\"" + esc(a.value("hook", "")) + "\",refused=\"" +
               (a.contains("compiled_entry_refused") ? "1" : "0") + "\"} " +
               (a.value("compiled_entry", false) ? "1" : "0") + "\n";
    metric("mpsteer_applies_total", "counter", "Revisions applied, by result");
    out += "mpsteer_applies_total{result=\"success\"} " + num(s["applies"]["succeeded"]) + "\n";
    out += "mpsteer_applies_total{result=\"failure\"} " + num(s["applies"]["failed"]) + "\n";
    metric("mpsteer_last_apply_duration_seconds", "gauge", "Time the last successful apply took");
    out += "mpsteer_last_apply_duration_seconds " +
           std::to_string(s["applies"].value("last_duration_ms", 0.0) / 1000.0) + "\n";
    if (s.contains("state_files") && s["state_files"].is_object()) {
        const auto& f = s["state_files"];
        metric("mpsteer_status_write_failures_total", "counter",
               "Times status.json could not be written (a full or read-only state directory)");
        out += "mpsteer_status_write_failures_total " + num(f["status_write_failures"]) + "\n";
        metric("mpsteer_event_log_writable", "gauge",
               "1 while events.jsonl is written, 0 when it cannot be (see the status)");
        out += "mpsteer_event_log_writable " +
               std::string(f.value("event_log_error", "").empty() ? "1" : "0") + "\n";
    }
    metric("mpsteer_events_total", "counter", "Datapath events, by type");
    for (const auto& [k, v] : s["events"].items())
        out += "mpsteer_events_total{type=\"" + k + "\"} " + num(v) + "\n";
    if (s.contains("lua_hooks") && !s["lua_hooks"].empty()) {
        const std::pair<const char*, const char*> lh[] = {
            {"calls", "Lua hook calls"},
            {"failures", "Lua hook calls that failed"},
            {"writes", "Map writes requested by Lua hooks"}};
        for (auto [key, help] : lh) {
            std::string name = std::string("mpsteer_lua_hook_") + key + "_total";
            metric(name, "counter", help);
            for (const auto& h : s["lua_hooks"])
                out +=
                    name + "{policy=\"" + esc(h.value("policy", "")) + "\"} " + num(h[key]) + "\n";
        }
        metric("mpsteer_lua_hook_disabled", "gauge", "1 when the policy's Lua hook is disabled");
        for (const auto& h : s["lua_hooks"])
            out += "mpsteer_lua_hook_disabled{policy=\"" + esc(h.value("policy", "")) + "\"} " +
                   (h.value("state", "") == "disabled" ? "1" : "0") + "\n";
    }
    if (s.contains("hook_process") && s["hook_process"].is_object()) {
        metric("mpsteer_hook_process_restarts_total", "counter",
               "Times the Lua hook process was killed or died and was started again");
        out += "mpsteer_hook_process_restarts_total " + num(s["hook_process"]["restarts"]) + "\n";
    }
    if (s.contains("endpoint_renewals") && s["endpoint_renewals"].is_array() &&
        !s["endpoint_renewals"].empty()) {
        metric("mpsteer_endpoint_renewals_total", "counter",
               "Path-manager endpoints a hook renewed (subflows over the address re-created)");
        for (const auto& r : s["endpoint_renewals"])
            out += "mpsteer_endpoint_renewals_total{address=\"" + esc(r.value("address", "")) +
                   "\"} " + num(r["renewals"]) + "\n";
    }
    if (s.contains("balancer") && s["balancer"].is_object()) {
        const auto& b = s["balancer"];
        const auto& c = b.value("counters", nlohmann::json::object());
        metric(
            "mpsteer_lb_packets_total", "counter",
            "Packets the balancer handled, by what it did (bpf/README.md, \"The load balancer\")");
        for (const auto& [what, v] : c.items())
            if (v.is_number())
                out += "mpsteer_lb_packets_total{balancer=\"" + esc(b.value("name", "")) +
                       "\",counter=\"" + esc(what) + "\"} " + num(v) + "\n";
        metric("mpsteer_lb_tokens_learnt_total", "counter",
               "Connection tokens the balancer learnt from third ACKs");
        out += "mpsteer_lb_tokens_learnt_total{balancer=\"" + esc(b.value("name", "")) + "\"} " +
               num(b["tokens_learnt"]) + "\n";
        metric("mpsteer_lb_backend_draining", "gauge",
               "1 while a backend takes no new connections");
        for (const auto& be : b.value("backends", nlohmann::json::array()))
            out += "mpsteer_lb_backend_draining{balancer=\"" + esc(b.value("name", "")) +
                   "\",backend=\"" + esc(be.value("name", "")) + "\"} " +
                   (be.value("draining", false) ? "1" : "0") + "\n";
    }
    if (s.contains("event_thread") && s["event_thread"].contains("latency_us")) {
        const auto& e = s["event_thread"];
        const auto& l = e["latency_us"];
        auto sec = [&](const char* k) { return std::to_string(l.value(k, 0.0) / 1e6); };
        metric("mpsteer_lua_event_latency_seconds", "summary",
               "Datapath event (its BPF timestamp) to the end of the Lua hooks it reached");
        out += "mpsteer_lua_event_latency_seconds{quantile=\"0.5\"} " + sec("p50") + "\n";
        out += "mpsteer_lua_event_latency_seconds{quantile=\"0.99\"} " + sec("p99") + "\n";
        out += "mpsteer_lua_event_latency_seconds_sum " + sec("sum") + "\n";
        out += "mpsteer_lua_event_latency_seconds_count " + num(l["count"]) + "\n";
        metric("mpsteer_event_thread_events_total", "counter",
               "Datapath events taken by the event thread, by how it found them");
        const uint64_t all = e.value("events", uint64_t(0)),
                       polled = e.value("events_while_polling", uint64_t(0));
        out +=
            "mpsteer_event_thread_events_total{found=\"polling\"} " + std::to_string(polled) + "\n";
        out += "mpsteer_event_thread_events_total{found=\"after_wakeup\"} " +
               std::to_string(all - std::min(all, polled)) + "\n";
        metric("mpsteer_event_thread_wakeups_total", "counter",
               "Times the event thread slept in epoll and was woken");
        out += "mpsteer_event_thread_wakeups_total " + num(e["wakeups"]) + "\n";
    }
    return out;
}

}  // namespace mpsteer::agent
