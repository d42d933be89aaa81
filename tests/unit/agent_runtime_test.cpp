// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The agent's runtime files and endpoints without a datapath (no privileges): atomic writes
// that never follow a planted link, file modes, the status reader on files that are not a
// status, staleness, the metrics server under a client that holds its connection, the event
// log's rotation and non-UTF-8 strings in what is serialised.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>

#include "agent/agent.h"
#include "agent/lock_file.h"
#include "agent/metrics.h"
#include "agent/status.h"
#include "agent/watch.h"
#include "net/text.h"

namespace fs = std::filesystem;
using namespace mpsteer::agent;
using namespace std::chrono_literals;

namespace {

// A fresh directory under /tmp, removed at the end of the test.
struct TempDir {
    std::string path;
    TempDir() {
        std::string t = (fs::temp_directory_path() / "mpsteer-agent-unit-XXXXXX").string();
        path = mkdtemp(t.data());
    }
    ~TempDir() {
        std::error_code ec;
        fs::remove_all(path, ec);
    }
};

std::string slurp(const std::string& path) {
    std::ifstream in(path);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

struct Cmd {
    int status;
    std::string out;
};
// `mpsteer status` on a state directory, stopped after 10 s (a hang is a failure too).
Cmd mpsteer_status(const std::string& state_dir, const std::string& extra = "") {
    std::string cmd = "timeout 10 " + std::string(MPSTEER_BIN) + " status --state-dir " +
                      state_dir + " " + extra + " 2>&1";
    FILE* p = popen(cmd.c_str(), "r");
    std::string out;
    char buf[4096];
    size_t n;
    while ((n = fread(buf, 1, sizeof buf, p)) > 0) out.append(buf, n);
    int st = pclose(p);
    return {WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), out};
}

int64_t unix_ms_now() {
    return std::chrono::duration_cast<std::chrono::milliseconds>(
               std::chrono::system_clock::now().time_since_epoch())
        .count();
}

nlohmann::json sample_status(const std::string& dir) {
    EventLog events(dir + "/events.jsonl");
    AgentStatus a;
    a.applied_revision = a.attempted_revision = "abc";
    return render_status(a, DatapathStatus{}, HookStatus{}, events, dir);
}

int connect_to(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_port = htons(static_cast<uint16_t>(port));
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    REQUIRE(connect(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0);
    timeval tv{1, 0};  // the metrics server must answer well within this
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    return fd;
}

int free_port() {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in sa{};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa);
    socklen_t len = sizeof sa;
    getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len);
    close(fd);
    return ntohs(sa.sin_port);
}

}  // namespace

TEST_CASE("write_atomic does not follow a planted .tmp link and sets the mode") {
    TempDir d;
    const std::string victim = d.path + "/victim", target = d.path + "/status.json";
    std::ofstream(victim) << "keep\n";
    fs::create_symlink(victim, target + ".tmp");
    write_atomic(target, "new\n", 0640);
    CHECK(slurp(victim) == "keep\n");
    CHECK(slurp(target) == "new\n");
    CHECK(!fs::is_symlink(target));
    struct stat st {};
    REQUIRE(stat(target.c_str(), &st) == 0);
    CHECK((st.st_mode & 07777) == 0640);
    // Nothing left beside it but the planted link and the victim.
    int entries = 0;
    for (auto& e : fs::directory_iterator(d.path)) (void)e, ++entries;
    CHECK(entries == 3);
}

TEST_CASE("mpsteer status reports a status file it cannot use, never aborts or hangs") {
    TempDir d;
    const std::string status = status_path(d.path);
    struct Case {
        const char* what;
        std::function<void()> make;
        const char* why;
    };
    const Case cases[] = {
        {"garbage", [&] { std::ofstream(status) << "\x01\x02 not json {"; },
         "not a status document"},
        {"JSON that is not an object", [&] { std::ofstream(status) << "[1, 2]"; },
         "not a status document"},
        {"a directory", [&] { fs::create_directory(status); }, "is a directory"},
        {"a FIFO", [&] { REQUIRE(mkfifo(status.c_str(), 0600) == 0); }, "not a regular file"},
        {"a huge file",
         [&] {
             std::ofstream{status};
             fs::resize_file(status, 64 << 20);
         },
         "too large"},
        {"fields of the wrong type",
         [&] { std::ofstream(status) << R"({"ready": true, "attachments": 5, "errors": [1]})"; },
         "type"},
    };
    for (const auto& c : cases) {
        for (const char* output : {"text", "json"}) {
            INFO(c.what << " (--output " << output << ")");
            std::error_code ec;
            fs::remove_all(status, ec);
            c.make();
            auto r = mpsteer_status(d.path, std::string("--output ") + output);
            INFO(r.out);
            CHECK(r.status == 1);
            if (std::string(output) == "json" &&
                std::string(c.what) == "fields of the wrong type") {
                // The JSON output copies the fields as they are (and says not ready).
                CHECK(!nlohmann::json::parse(r.out, nullptr, false).is_discarded());
                continue;
            }
            CHECK(r.out.find("mpsteer status: ") != std::string::npos);
            CHECK(r.out.find(c.why) != std::string::npos);
        }
    }
}

TEST_CASE("a status the running agent stopped writing is not ready") {
    TempDir d;
    auto lock = AgentLock::try_take(d.path);  // stands in for a live agent
    REQUIRE(lock);
    auto s = sample_status(d.path);
    REQUIRE(s.value("ready", false) == false);  // nothing applied in the sample: make it ready
    s["ready"] = true;
    s["conditions"] = nlohmann::json::array();

    s["updated_unix_ms"] = unix_ms_now();
    write_atomic(status_path(d.path), json_text(s, 1));
    auto fresh = read_status(d.path);
    CHECK(fresh.value("ready", false));
    CHECK(mpsteer_status(d.path).status == 0);

    s["updated_unix_ms"] = unix_ms_now() - 60'000;
    write_atomic(status_path(d.path), json_text(s, 1));
    auto stale = read_status(d.path);
    CHECK_FALSE(stale.value("ready", true));
    bool reported = false;
    for (const auto& c : stale["conditions"])
        reported |= c.value("reason", "") == "StatusStale" && !c.value("status", true);
    CHECK(reported);
    auto r = mpsteer_status(d.path);
    INFO(r.out);
    CHECK(r.status == 1);
    CHECK(r.out.find("StatusStale") != std::string::npos);
    // --alive (the liveness probe): a frozen agent is not alive ...
    r = mpsteer_status(d.path, "--alive");
    INFO(r.out);
    CHECK(r.status == 1);
    CHECK(r.out.find("not alive: the agent last wrote its status") != std::string::npos);
    // ... one that writes is, ready or not (a bad revision is not cured by a restart) ...
    s["updated_unix_ms"] = unix_ms_now();
    s["ready"] = false;
    s["conditions"] = {{{"type", "Degraded"}, {"status", true}, {"reason", "ApplyFailed"}}};
    write_atomic(status_path(d.path), json_text(s, 1));
    CHECK(mpsteer_status(d.path).status == 1);
    r = mpsteer_status(d.path, "--alive");
    INFO(r.out);
    CHECK(r.status == 0);
    CHECK(r.out.find("alive: pid ") == 0);
    // ... and without an agent nothing is.
    lock.reset();
    r = mpsteer_status(d.path, "--alive");
    INFO(r.out);
    CHECK(r.status == 1);
    CHECK(r.out.find("not alive: no agent runs") != std::string::npos);
}

TEST_CASE("the status carries its write time and dumps non-UTF-8 strings") {
    TempDir d;
    EventLog events(d.path + "/events.jsonl");
    AgentStatus a;
    a.errors = {"script failed: \xff\xfe bad bytes"};
    a.stall = Stall::validation_failed;
    a.stall_message = "interface \xc3(";
    HookStatus hooks;
    hooks.scripts_json = nlohmann::json::array({{{"policy", "p\xff"}, {"last_error", "\x80"}}});
    auto s = render_status(a, DatapathStatus{}, hooks, events, "/etc/mpsteer/\xfe");
    CHECK(s["updated_unix_ms"].get<int64_t>() >= unix_ms_now() - 10'000);
    std::string text;
    REQUIRE_NOTHROW(text = json_text(s, 1));
    // Escaped where the status is rendered (what they were stays readable); the dump's
    // replacement remains for what bypasses it.
    CHECK(nlohmann::json::parse(text)["errors"][0].get<std::string>() ==
          "script failed: \\xff\\xfe bad bytes");
    CHECK(text.find("\xff") == std::string::npos);
    REQUIRE_NOTHROW(to_prometheus(s));
}

TEST_CASE("the metrics server answers a second client while a first one holds its connection") {
    TempDir d;
    const int port = free_port();
    MetricsOutput metrics(port, "");
    metrics.publish(sample_status(d.path));
    const std::string get = "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n";

    int idle = connect_to(port);  // connects and says nothing
    for (int k = 0; k < 3; ++k) {
        int c = connect_to(port);
        REQUIRE(send(c, get.data(), get.size(), 0) == static_cast<ssize_t>(get.size()));
        std::string resp;
        char buf[4096];
        ssize_t n;
        while ((n = recv(c, buf, sizeof buf, 0)) > 0) resp.append(buf, static_cast<size_t>(n));
        close(c);
        INFO("client " << k);
        CHECK(resp.rfind("HTTP/1.1 200 OK", 0) == 0);
        CHECK(resp.find("mpsteer_ready 0") != std::string::npos);
    }
    // The idle client is dropped after its timeout (2 s), not kept forever.
    timeval tv{4, 0};
    setsockopt(idle, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    char b;
    CHECK(recv(idle, &b, 1, 0) == 0);
    close(idle);
}

TEST_CASE("the event log rotates at its size cap, keeping one previous file") {
    TempDir d;
    const std::string path = d.path + "/events.jsonl";
    {
        EventLog log(path, 1000);
        mpsteer::datapath::Event ev{};
        ev.raw.type = MPS_EV_FLOW_CLOSED;
        for (int i = 0; i < 200; ++i) log.record(ev);
        log.flush();
        CHECK(log.counts_json()["flow_closed"] == 200);
    }
    REQUIRE(fs::exists(path + ".1"));
    CHECK(fs::file_size(path) <= 1000);
    CHECK(fs::file_size(path + ".1") <= 1000);
    CHECK(fs::file_size(path + ".1") > 500);
    CHECK_FALSE(fs::exists(path + ".2"));
    struct stat st {};
    REQUIRE(stat(path.c_str(), &st) == 0);
    CHECK((st.st_mode & 0777) == 0640);
    // A reopened log continues from the file's size.
    {
        EventLog log(path, 1000);
        mpsteer::datapath::Event ev{};
        ev.raw.type = MPS_EV_FLOW_CLOSED;
        for (int i = 0; i < 50; ++i) log.record(ev);
    }
    CHECK(fs::file_size(path) <= 1000);
}

TEST_CASE("status and metrics carry guard drops and the state tables", "[agent][status]") {
    TempDir dir;
    EventLog events(dir.path + "/events.jsonl");
    AgentStatus a;
    DatapathStatus dp;
    dp.totals.values[MPS_GC_UNPARSEABLE_DROPS] = 17;
    dp.tables = {{"flows", 4096, 1234567, 4000, 912},
                 {"conns", 1024, 76543, 0, {}},
                 {"events", 65536, 70000, {}, {}}};
    auto s = render_status(a, dp, HookStatus{}, events, dir.path);
    CHECK(s["datapath"]["unparseable_drops"] == 17);
    CHECK(s["tables"]["flows"]["capacity"] == 4096);
    CHECK(s["tables"]["conns"]["memory_bytes"] == 76543);
    const std::string m = to_prometheus(s);
    CHECK(m.find("mpsteer_datapath_packets_total{outcome=\"unparseable_drops\"} 17\n") !=
          std::string::npos);
    CHECK(m.find("mpsteer_table_capacity{table=\"flows\"} 4096\n") != std::string::npos);
    CHECK(m.find("mpsteer_table_memory_bytes{table=\"conns\"} 76543\n") != std::string::npos);
    CHECK(m.find("mpsteer_table_entries{table=\"flows\"} 4000\n") != std::string::npos);
    CHECK(m.find("mpsteer_table_entries{table=\"conns\"} 0\n") != std::string::npos);
    CHECK(m.find("mpsteer_table_evictions_total{table=\"flows\"} 912\n") != std::string::npos);
    // Only what was counted: no evictions for conns, no entries for the event ring.
    CHECK(m.find("mpsteer_table_evictions_total{table=\"conns\"}") == std::string::npos);
    CHECK(m.find("mpsteer_table_entries{table=\"events\"}") == std::string::npos);
    CHECK(s["tables"]["flows"]["evictions"] == 912);
    CHECK_FALSE(s["tables"]["events"].contains("entries"));
}

TEST_CASE("status and metrics say which hook runs without its compiled entry, and why",
          "[agent][status]") {
    TempDir dir;
    EventLog events(dir.path + "/events.jsonl");
    AgentStatus a;
    DatapathStatus dp;
    dp.links = {{"eth0", "xdp", "xdp", true, ""},
                {"eth0", "tc_egress", "clsact", false,
                 "Argument list too long (the verifier: BPF program is too large)"}};
    auto s = render_status(a, dp, HookStatus{}, events, dir.path);
    REQUIRE(s["attachments"].size() == 2);
    CHECK(s["attachments"][0]["compiled_entry"] == true);
    CHECK_FALSE(s["attachments"][0].contains("compiled_entry_refused"));
    CHECK(s["attachments"][1]["compiled_entry"] == false);
    CHECK(s["attachments"][1]["compiled_entry_refused"] ==
          "Argument list too long (the verifier: BPF program is too large)");
    const std::string m = to_prometheus(s);
    CHECK(
        m.find("mpsteer_attachment_compiled{interface=\"eth0\",hook=\"xdp\",refused=\"0\"} 1\n") !=
        std::string::npos);
    CHECK(m.find("mpsteer_attachment_compiled{interface=\"eth0\",hook=\"tc_egress\",refused=\"1\"} "
                 "0\n") != std::string::npos);
}

namespace {
// The inotify watches this process holds (every inotify descriptor's fdinfo lines).
size_t inotify_watches() {
    size_t n = 0;
    for (const auto& e : fs::directory_iterator("/proc/self/fd")) {
        std::error_code ec;
        if (fs::read_symlink(e.path(), ec).string() != "anon_inode:inotify") continue;
        std::istringstream info(slurp("/proc/self/fdinfo/" + e.path().filename().string()));
        for (std::string line; std::getline(info, line);) n += line.rfind("inotify wd:", 0) == 0;
    }
    return n;
}

bool is_inotify(int fd) {
    std::error_code ec;
    return fs::read_symlink("/proc/self/fd/" + std::to_string(fd), ec).string() ==
           "anon_inode:inotify";
}

// Whether the watch calls for a reconcile within 300 ms (inotify only: link events of the
// host's interfaces are not this test's).
bool watch_fires(int epoll, Watch& w) {
    bool relevant = false;
    epoll_event evs[8];
    for (int n; (n = epoll_wait(epoll, evs, 8, 300)) > 0;)
        for (int i = 0; i < n; ++i)
            if (is_inotify(evs[i].data.fd))
                relevant |= w.handle(evs[i].data.fd);
            else
                w.handle(evs[i].data.fd);
    return relevant;
}
}  // namespace

TEST_CASE("the policy watch never leaves the repository and watches at most 1024 directories",
          "[agent]") {
    TempDir t;
    const std::string repo = t.path + "/repo", outside = t.path + "/outside",
                      state = t.path + "/state";
    for (const auto& d : {repo + "/policies", outside, state}) fs::create_directories(d);
    fs::create_directory_symlink(outside, repo + "/escape");
    const int epoll = epoll_create1(EPOLL_CLOEXEC);
    {
        Watch w(epoll, repo, state);
        CHECK(w.follow(repo) == "");
        watch_fires(epoll, w);
        // Beyond a directory link: not the repository's business.
        std::ofstream(outside + "/x.yaml") << "x";
        CHECK_FALSE(watch_fires(epoll, w));
        std::ofstream(repo + "/policies/y.yaml") << "y";
        CHECK(watch_fires(epoll, w));
    }
    // Too many directories: refused as a whole, not watched in part.
    const std::string big = t.path + "/big";
    for (size_t i = 0; i < kMaxWatchedDirectories + 10; ++i)
        fs::create_directories(big + "/d" + std::to_string(i % 40) + "/e" + std::to_string(i));
    {
        const size_t before = inotify_watches();
        Watch w(epoll, big, state);
        const std::string why = w.follow(big);
        CHECK(inotify_watches() - before <= 2);  // the link's parent and the state directory
        CHECK(why.find("more than 1024 directories") != std::string::npos);
        CHECK(w.too_many_directories());
    }
    close(epoll);
}

TEST_CASE("text for logs and the status is escaped to one line without control characters",
          "[agent]") {
    using mpsteer::net::escape_control;
    CHECK(escape_control("plain text, caf\xc3\xa9") == "plain text, caf\xc3\xa9");
    CHECK(escape_control("a\nb\rc\td") == "a\\nb\\rc\\td");
    CHECK(escape_control("\x1b[31m\x07\x7f") == "\\x1b[31m\\x07\\x7f");
    CHECK(escape_control(std::string("nul\0x", 5)) == "nul\\x00x");
    CHECK(escape_control("csi \xc2\x9b nbsp \xc2\xa0") == "csi \\u009b nbsp \xc2\xa0");
    CHECK(escape_control("bad \xff\xc3") == "bad \\xff\\xc3");
}
