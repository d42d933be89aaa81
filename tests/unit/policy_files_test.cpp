// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Hostile policy directories: whoever commits to the policy repository controls names,
// symlinks and file types. Nothing outside the directory may be read or shown, nothing may
// block, every cap is an error naming the file.
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>

#include <catch2/catch.hpp>

#include "agent/agent.h"
#include "manifest/manifest.h"
#include "manifest/policy_files.h"

using namespace mpsteer::manifest;
namespace fs = std::filesystem;

namespace {

const std::string kSecret = "SECRET-MARKER-7f3a";

const std::string kPolicy = R"(apiVersion: mpsteer.dev/v1
kind: Policy
metadata: {name: count-everything}
spec:
  attach: {hooks: [xdp]}
  priority: 0
  actions:
    - record: {}
)";

std::string lua_policy(const std::string& script) {
    return "apiVersion: mpsteer.dev/v1\nkind: Policy\nmetadata: {name: scripted}\nspec:\n"
           "  attach: {hooks: [xdp]}\n  priority: 5\n  actions:\n    - record: {}\n"
           "  hooks: {script: \"" +
           script + "\"}\n";
}

void write(const fs::path& p, const std::string& text) {
    fs::create_directories(p.parent_path());
    std::ofstream(p, std::ios::binary) << text;
}

// A policy directory (with .git so scripts stop there) next to a secret file outside it.
struct Sandbox {
    fs::path base, root, secret;
    Sandbox() {
        char tmpl[] = "/tmp/mpsteer-policy-files-XXXXXX";
        base = mkdtemp(tmpl);
        root = base / "policies";
        fs::create_directories(root / ".git");
        secret = base / "secret.yaml";
        write(secret, "apiVersion: mpsteer.dev/v1\n" + kSecret + ": 1\n" + kSecret + "-b: x\n");
        write(root / "ok.yaml", kPolicy);
    }
    ~Sandbox() {
        std::error_code ec;
        fs::remove_all(base, ec);
    }
    Result load() const {
        Options o;
        o.known_interfaces = std::set<std::string>{"lo"};
        o.repo_root = root.string();
        return load_paths({root.string()}, o);
    }
};

std::string all_text(const Result& r) {
    std::string s;
    for (const auto& d : r.diagnostics) s += d.format() + "\n";
    return s;
}

// An error naming `file` whose message contains `words`; nothing of the secret anywhere.
void require_refused(const Result& r, const std::string& file, const std::string& words) {
    INFO(all_text(r));
    CHECK_FALSE(r.ok());
    CHECK(all_text(r).find(kSecret) == std::string::npos);
    CHECK(std::any_of(r.diagnostics.begin(), r.diagnostics.end(), [&](const Diagnostic& d) {
        return d.severity == Severity::error && d.pos.file.ends_with(file) &&
               d.message.find(words) != std::string::npos;
    }));
}

// What running fn in a child process cost: its peak resident set and the wall-clock time,
// measured apart from this process's own. fn's return value is the child's exit status.
struct Cost {
    long max_rss_kib = 0;
    double seconds = 0;
    int exit_status = -1;
};
Cost cost_of(const std::function<int()>& fn) {
    const auto start = std::chrono::steady_clock::now();
    pid_t pid = fork();
    if (pid == 0) {  // never back into the test framework, whatever fn does
        int status = 2;
        try {
            status = fn();
        } catch (...) {}
        _exit(status);
    }
    int status = 0;
    rusage ru{};
    REQUIRE(wait4(pid, &status, 0, &ru) == pid);
    Cost c;
    c.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    c.max_rss_kib = ru.ru_maxrss;
    c.exit_status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    return c;
}

// A document whose aliases repeat a 4000-byte scalar 81,111 times (about 320 MB expanded)
// in some 4 KB of text, under the node caps.
std::string long_scalar_alias_bomb() {
    std::string doc = "a: &a \"" + std::string(4000, 'x') + "\"\n";
    const char* names = "abcde";
    for (int level = 1; level < 5; ++level) {
        doc += std::string(1, names[level]) + ": &" + names[level] + " [";
        for (int i = 0; i < 10; ++i) doc += std::string(i ? ", *" : "*") + names[level - 1];
        doc += "]\n";
    }
    doc += "f: [*e, *e, *e, *e, *e, *e, *e]\n";
    return doc;
}

}  // namespace

TEST_CASE("a manifest symlinked to a file outside is not read") {
    Sandbox s;
    fs::create_symlink(s.secret, s.root / "evil.yaml");
    require_refused(s.load(), "evil.yaml", "outside the policy directory");
}

TEST_CASE("a manifest symlinked by a relative path out of the tree is not read") {
    Sandbox s;
    fs::create_symlink("../secret.yaml", s.root / "evil.yaml");
    require_refused(s.load(), "evil.yaml", "outside the policy directory");
}

TEST_CASE("a symlinked subdirectory out of the root is not descended") {
    Sandbox s;
    fs::create_directories(s.base / "outside");
    write(s.base / "outside/p.yaml", "x: " + kSecret + "\n");
    fs::create_symlink(s.base / "outside", s.root / "sub.yaml");
    fs::create_symlink(s.base / "outside", s.root / "sub");
    auto r = s.load();
    INFO(all_text(r));
    CHECK(all_text(r).find(kSecret) == std::string::npos);
    for (const auto& f : r.files) CHECK(f.find("p.yaml") == std::string::npos);
    require_refused(r, "sub.yaml", "outside the policy directory");
}

TEST_CASE("a symlink inside the tree to a file inside is followed") {
    Sandbox s;
    fs::create_directories(s.root / "shared");
    fs::rename(s.root / "ok.yaml", s.root / "shared/real.yml");
    fs::create_symlink("shared/real.yml", s.root / "link.yaml");
    auto r = s.load();
    INFO(all_text(r));
    CHECK(all_text(r).find("not read") == std::string::npos);
    CHECK(all_text(r).find("outside") == std::string::npos);
    CHECK(std::count_if(r.files.begin(), r.files.end(), [](const std::string& f) {
              return f.ends_with("link.yaml") || f.ends_with("real.yml");
          }) == 2);
}

TEST_CASE("symlinks to /proc/self/pagemap and /dev/zero and a FIFO neither block nor read") {
    Sandbox s;
    fs::create_symlink("/proc/self/pagemap", s.root / "pagemap.yaml");
    fs::create_symlink("/dev/zero", s.root / "zero.yaml");
    REQUIRE(mkfifo((s.root / "fifo.yaml").c_str(), 0600) == 0);
    auto r = s.load();
    require_refused(r, "pagemap.yaml", "outside the policy directory");
    require_refused(r, "zero.yaml", "outside the policy directory");
    require_refused(r, "fifo.yaml", "a FIFO, not a regular file");
    // The revision snapshot reads the same way (a FIFO would hang it, /dev/zero never ends).
    auto rev = mpsteer::agent::snapshot(s.root.string());
    CHECK(rev.content.size() == 64);
}

TEST_CASE("a file over the size cap is refused unread") {
    Sandbox s;
    write(s.root / "huge.yaml", "# " + kSecret + "\n" + std::string(kMaxPolicyFileBytes, '#'));
    require_refused(s.load(), "huge.yaml", "larger than");
}

TEST_CASE("a revision over the total byte cap is refused") {
    Sandbox s;
    const size_t n = kMaxRevisionBytes / kMaxPolicyFileBytes + 1;
    for (size_t i = 0; i < n; ++i)
        write(s.root / ("f" + std::to_string(100 + i) + ".yaml"),
              std::string(kMaxPolicyFileBytes - 1, '#'));
    require_refused(s.load(), ".yaml", "bytes in total");
}

TEST_CASE("files that are neither manifests nor scripts do not hide a manifest's change") {
    Sandbox s;
    // More than the revision's byte cap, sorted before the manifest.
    for (size_t i = 0; i <= kMaxRevisionBytes / kMaxPolicyFileBytes; ++i)
        write(s.root / ("a" + std::to_string(i) + ".bin"), std::string(kMaxPolicyFileBytes, '.'));
    const auto before = mpsteer::agent::snapshot(s.root.string());
    write(s.root / "ok.yaml", kPolicy + "  continue: true\n");
    CHECK(mpsteer::agent::snapshot(s.root.string()).content != before.content);
}

TEST_CASE("more files than the count cap are refused") {
    Sandbox s;
    for (size_t i = 0; i <= kMaxPolicyFiles; ++i)
        write(s.root / ("m" + std::to_string(i) + ".yaml"), "");
    require_refused(s.load(), "policies", "files");
}

TEST_CASE("more documents than the per-file cap are refused before parsing") {
    Sandbox s;
    std::string text;
    for (size_t i = 0; i <= kMaxDocumentsPerFile; ++i) text += "---\n" + kPolicy;
    write(s.root / "many.yaml", text);
    require_refused(s.load(), "many.yaml", "YAML documents in one file");
}

TEST_CASE("an alias bomb spread across the documents of one file stays bounded") {
    Sandbox s;
    std::string bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
    for (char c = 'b'; c <= 'i'; ++c)
        bomb += std::string(1, c) + ": &" + c + " [*" + char(c - 1) + ", *" + char(c - 1) + ", *" +
                char(c - 1) + ", *" + char(c - 1) + ", *" + char(c - 1) + "]\n";
    std::string text;
    for (size_t i = 0; i < 4 * kMaxDocumentsPerFile; ++i) text += "---\n" + bomb;
    write(s.root / "bomb.yaml", text);
    auto start = std::chrono::steady_clock::now();
    require_refused(s.load(), "bomb.yaml", "YAML documents in one file");
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(10));
}

TEST_CASE("alias expansion is bounded across the documents and files of a revision") {
    Sandbox s;
    // About 44,000 nodes per document once expanded: under the per-document cap; 16 of them
    // in one file stay under the revision's budget, the second such file goes over it.
    std::string doc = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
    for (char c = 'b'; c <= 'f'; ++c)
        doc += std::string(1, c) + ": &" + c + " [*" + char(c - 1) + ", *" + char(c - 1) + ", *" +
               char(c - 1) + ", *" + char(c - 1) + ", *" + char(c - 1) + "]\n";
    std::string text;
    for (size_t i = 0; i < 16; ++i) text += "---\n" + doc;
    for (int f = 0; f < 4; ++f) write(s.root / ("bomb" + std::to_string(f) + ".yaml"), text);
    auto start = std::chrono::steady_clock::now();
    require_refused(s.load(), "bomb1.yaml", "nodes (aliases included)");
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(20));
}

TEST_CASE("an alias bomb of long scalars is refused early and cheaply at its file and line") {
    Sandbox s;
    // Eleven such documents, 46 KB: by nodes alone each is accepted, together some 3.5 GB.
    std::string text;
    for (int i = 0; i < 11; ++i) text += "---\n" + long_scalar_alias_bomb();
    write(s.root / "bomb.yaml", text);
    Result r;
    const Cost c = cost_of([&] {
        r = s.load();
        const std::string t = all_text(r);
        // The first document goes over at the first alias on its line 6 (8.4 MB).
        return !r.ok() && t.find("bomb.yaml:6:") != std::string::npos &&
                       t.find("bytes of keys, scalars and their paths after alias expansion") !=
                           std::string::npos
                   ? 0
                   : 1;
    });
    INFO("peak RSS " << c.max_rss_kib << " KiB, " << c.seconds << " s");
    CHECK(c.exit_status == 0);
    CHECK(c.max_rss_kib < 100 * 1024);
    CHECK(c.seconds < 5);
    // The same refusal, in this process, for the message.
    require_refused(s.load(), "bomb.yaml", "after alias expansion");
}

TEST_CASE("long scalars repeated through aliases are bounded across the files of a revision") {
    Sandbox s;
    // Each document repeats a 4000-byte scalar 900 times: under the per-document byte cap;
    // the files together go over the load's.
    std::string doc = "a: &a \"" + std::string(4000, 'y') + "\"\nb: &b [";
    for (int i = 0; i < 100; ++i) doc += std::string(i ? ", *a" : "*a");
    doc += "]\nc: [*b, *b, *b, *b, *b, *b, *b, *b]\n";
    for (int f = 0; f < 10; ++f)
        write(s.root / ("rep" + std::to_string(f) + ".yaml"), "---\n" + doc);
    // Each is 3.6 MB of scalars: the tenth goes over.
    require_refused(s.load(), "rep9.yaml",
                    "bytes of keys, scalars and their paths (aliases included)");
}

TEST_CASE("long keys nested deep are refused before their paths fill memory") {
    Sandbox s;
    // 60 levels of 1000-byte keys: every position below them is kept by a 60 KB path.
    std::string text, indent;
    for (int level = 0; level < 60; ++level) {
        text += indent + "k" + std::to_string(level) + std::string(1000, 'x') + ":\n";
        indent += ' ';
    }
    for (size_t i = 0; text.size() < 4000000; ++i)
        text += indent + "l" + std::to_string(i) + ": 1\n";
    write(s.root / "deep.yaml", text);
    const Cost c = cost_of([&] {
        Result r = s.load();
        return !r.ok() && all_text(r).find("their paths") != std::string::npos ? 0 : 1;
    });
    INFO("peak RSS " << c.max_rss_kib << " KiB, " << c.seconds << " s");
    CHECK(c.exit_status == 0);
    CHECK(c.max_rss_kib < 100 * 1024);
    CHECK(c.seconds < 5);
    require_refused(s.load(), "deep.yaml", "their paths");
}

TEST_CASE("manifests and scripts share one byte cap per revision") {
    Sandbox s;
    // Files just under the cap each; manifests and scripts together go over it.
    const size_t per_file = kMaxPolicyFileBytes - 1024;
    const size_t manifests = kMaxRevisionBytes / per_file;
    for (size_t i = 0; i < manifests; ++i)
        write(s.root / ("f" + std::to_string(10 + i) + ".yaml"),
              "# " + std::string(per_file - 3, '#') + "\n");
    write(s.root / "lua/hook.lua", "-- " + std::string(per_file, '-') + "\n");
    write(s.root / "scripted.yaml", lua_policy("lua/hook.lua"));
    require_refused(s.load(), "scripted.yaml", "bytes in total");
}

TEST_CASE("diagnostics are capped") {
    Sandbox s;
    // Every document has at least two errors; the documents stay under their caps.
    std::string text;
    for (size_t i = 0; i < kMaxDocumentsPerFile - 4; ++i) text += "---\nk: 1\nj: 2\n";
    for (size_t i = 0; i < kMaxDocuments / kMaxDocumentsPerFile; ++i)
        write(s.root / ("noisy" + std::to_string(10 + i) + ".yaml"), text);
    auto r = s.load();
    CHECK(r.diagnostics.size() <= kMaxDiagnostics + 1);
    require_refused(r, ".yaml", "not shown");
}

TEST_CASE("script paths with .., absolute or symlinked out stay inside the revision") {
    Sandbox s;
    write(s.base / "evil.lua", "-- " + kSecret + "\n");
    write(s.root / "dots.yaml", lua_policy("../evil.lua"));
    auto r = s.load();
    require_refused(r, "dots.yaml", "");
    fs::remove(s.root / "dots.yaml");

    write(s.root / "abs.yaml", lua_policy((s.base / "evil.lua").string()));
    require_refused(s.load(), "abs.yaml", "relative path");
    fs::remove(s.root / "abs.yaml");

    fs::create_directories(s.root / "lua");
    fs::create_symlink(s.base / "evil.lua", s.root / "lua/out.lua");
    write(s.root / "link.yaml", lua_policy("lua/out.lua"));
    require_refused(s.load(), "link.yaml", "outside the policy directory");
}

TEST_CASE("a script path out of the repository reads the same whether its target exists") {
    Sandbox s;
    write(s.base / "evil.lua", "-- " + kSecret + "\n");
    fs::create_symlink(s.base, s.root / "escape");
    fs::create_symlink("..", s.root / "up");
    fs::create_directories(s.root / "lua");
    fs::create_symlink(s.base / "evil.lua", s.root / "lua/out.lua");
    fs::create_symlink(s.base / "absent.lua", s.root / "lua/gone.lua");
    // The errors of a manifest naming `script`, with the path it wrote left out.
    auto errors_for = [&](const std::string& script, const Options& o) {
        write(s.root / "m.yaml", lua_policy(script));
        auto r = load_paths({s.root.string()}, o);
        std::string t = all_text(r);
        CHECK(t.find(kSecret) == std::string::npos);
        for (size_t at; (at = t.find(script)) != std::string::npos;)
            t.replace(at, script.size(), "SCRIPT");
        return t;
    };
    Options o;
    o.known_interfaces = std::set<std::string>{"lo"};
    o.repo_root = s.root.string();
    const std::vector<std::pair<std::string, std::string>> pairs = {
        {"escape/evil.lua", "escape/absent.lua"},  // a directory symlinked out, absolute
        {"up/evil.lua", "up/absent.lua"},          // relative, through ..
        {"lua/out.lua", "lua/gone.lua"},           // the script itself symlinked out
        {"lua/../../evil.lua", "lua/../../absent.lua"},
        {(s.base / "evil.lua").string(), (s.base / "absent.lua").string()},
    };
    for (const auto& [exists, absent] : pairs) {
        INFO(exists << " / " << absent);
        const std::string a = errors_for(exists, o), b = errors_for(absent, o);
        CHECK(a.find("error") != std::string::npos);
        CHECK(a == b);
    }
    // Without a repository root or .git, the search stops at the directory given: a path that
    // only exists above it is not found, like one that exists nowhere.
    fs::remove_all(s.root / ".git");
    o.repo_root.clear();
    const std::string above = s.base.filename().string();
    INFO("above the root");
    const std::string a = errors_for(above + "/evil.lua", o),
                      b = errors_for(above + "/absent.lua", o);
    CHECK(a.find("not found") != std::string::npos);
    CHECK(a == b);
}

TEST_CASE("every policy's script problem is reported at its own file and line") {
    Sandbox s;
    auto policy = [](const std::string& name, const std::string& priority,
                     const std::string& script) {
        return "apiVersion: mpsteer.dev/v1\nkind: Policy\nmetadata: {name: " + name +
               "}\nspec:\n  attach: {hooks: [xdp]}\n  priority: " + priority +
               "\n  actions:\n    - record: {}\n  hooks: {script: " + script + "}\n";
    };
    fs::create_directories(s.root / "lua");
    fs::create_symlink(s.base / "evil.lua", s.root / "lua/out.lua");
    REQUIRE(mkfifo((s.root / "lua/fifo.lua").c_str(), 0600) == 0);
    write(s.root / "a.yaml", policy("a", "1", "lua/missing.lua"));
    write(s.root / "b.yaml", policy("b", "2", "lua/out.lua"));
    write(s.root / "c.yaml", policy("c", "-1", "lua/fifo.lua"));  // and a schema error
    write(s.root / "d.yaml", policy("a", "4", "lua/../x.lua"));   // and a duplicate name
    write(s.root / "lua/syntax.lua", "function on_tick()\n  x = = 1\nend\n");
    write(s.root / "e.yaml", policy("e", "5", "lua/syntax.lua"));
    write(s.root / "lua/bytecode.lua", std::string("\x1bLua\x54\x00", 6));
    write(s.root / "f.yaml", policy("f", "6", "lua/bytecode.lua"));
    auto r = s.load();
    INFO(all_text(r));
    CHECK_FALSE(r.ok());
    for (const auto& [file, words] : std::vector<std::pair<std::string, std::string>>{
             {"a.yaml", "not found"},
             {"b.yaml", "outside the policy directory"},
             {"c.yaml", "a FIFO, not a regular file"},
             {"d.yaml", "no '..' components"},
             {"e.yaml", "does not compile: lua/syntax.lua:2: unexpected symbol near '='"},
             {"f.yaml", "does not compile: attempt to load a binary chunk"}}) {
        INFO(file);
        CHECK(std::any_of(r.diagnostics.begin(), r.diagnostics.end(), [&](const Diagnostic& d) {
            return d.pos.file.ends_with(file) && d.pos.line == 9 &&
                   d.pointer == "/spec/hooks/script" && d.message.find(words) != std::string::npos;
        }));
    }
}

TEST_CASE("a revision has at most 32 hook scripts (they share one process)") {
    Sandbox s;
    write(s.root / "lua/hook.lua", "function on_tick() end\n");
    std::string docs;
    for (int i = 0; i < 33; ++i)
        docs += std::string(i ? "---\n" : "") +
                "apiVersion: mpsteer.dev/v1\nkind: Policy\nmetadata: {name: p" +
                (i < 10 ? "0" : "") + std::to_string(i) +
                "}\nspec:\n  attach: {hooks: [xdp]}\n  priority: " + std::to_string(i + 1) +
                "\n  actions:\n    - record: {}\n  hooks: {script: lua/hook.lua}\n";
    write(s.root / "many.yaml", docs);
    auto r = s.load();
    INFO(all_text(r));
    CHECK_FALSE(r.ok());
    int errors = 0;
    for (const auto& d : r.diagnostics)
        errors += d.pointer == "/spec/hooks" &&
                  d.message.find(
                      "policy 'p32' has the revision's hook script number 33; a "
                      "revision may have at most 32") != std::string::npos;
    CHECK(errors == 1);
}

TEST_CASE("a script's bytes are read with the manifests; a later swap is never run") {
    Sandbox s;
    write(s.root / "lua/hook.lua", "-- validated\n");
    write(s.root / "scripted.yaml", lua_policy("lua/hook.lua"));
    auto r = s.load();
    INFO(all_text(r));
    REQUIRE(r.ok());
    // Replaced by a link out of the tree after validation: what the model carries is unchanged.
    fs::remove(s.root / "lua/hook.lua");
    fs::create_symlink(s.secret, s.root / "lua/hook.lua");
    bool found = false;
    for (const auto& p : r.model.policies)
        if (p.lua) {
            found = true;
            CHECK(p.lua->source == "-- validated\n");
        }
    CHECK(found);
    require_refused(s.load(), "scripted.yaml", "outside the policy directory");
}

TEST_CASE("a FIFO or an oversized file as a script is refused without blocking") {
    Sandbox s;
    fs::create_directories(s.root / "lua");
    REQUIRE(mkfifo((s.root / "lua/fifo.lua").c_str(), 0600) == 0);
    write(s.root / "fifo.yaml", lua_policy("lua/fifo.lua"));
    require_refused(s.load(), "fifo.yaml", "not a regular file");
    fs::remove(s.root / "fifo.yaml");
    write(s.root / "lua/big.lua", std::string(kMaxPolicyFileBytes + 1, '-'));
    write(s.root / "big.yaml", lua_policy("lua/big.lua"));
    require_refused(s.load(), "big.yaml", "larger than");
}

TEST_CASE("non-UTF-8 file names and content are reported printably") {
    Sandbox s;
    write(s.root / "bad\xff\xfe.yaml", "apiVersion: \xff\xfe\n");
    auto r = s.load();
    INFO(all_text(r));
    CHECK_FALSE(r.ok());
    nlohmann::json j = all_text(r);  // throws on invalid UTF-8
    CHECK(j.dump().find(".yaml") != std::string::npos);
}

TEST_CASE("a directory named like a manifest is descended, not read as a file") {
    Sandbox s;
    fs::create_directories(s.root / "dir.yaml");
    auto r = s.load();
    INFO(all_text(r));
    CHECK(r.ok());
    for (const auto& f : r.files) CHECK_FALSE(f.ends_with("dir.yaml"));
}

TEST_CASE("a dangling symlink and a symlink loop are errors naming them") {
    Sandbox s;
    fs::create_symlink("nowhere.yaml", s.root / "dangling.yaml");
    fs::create_symlink("loop2.yaml", s.root / "loop1.yaml");
    fs::create_symlink("loop1.yaml", s.root / "loop2.yaml");
    auto r = s.load();
    require_refused(r, "dangling.yaml", "dangling");
    require_refused(r, "loop1.yaml", "loop");
}

TEST_CASE("a .git/HEAD symlinked to a secret never becomes the revision id") {
    Sandbox s;
    fs::create_symlink(s.secret, s.root / ".git/HEAD");
    auto rev = mpsteer::agent::snapshot(s.root.string());
    CHECK(rev.id.find(kSecret) == std::string::npos);
    CHECK(rev.id.rfind("sha256:", 0) == 0);
}

TEST_CASE("a revision root that is a symlink is resolved once") {
    Sandbox s;
    fs::create_symlink(s.root, s.base / "current");
    auto rev = mpsteer::agent::snapshot((s.base / "current").string());
    CHECK(rev.root == s.root.string());
    Options o;
    o.known_interfaces = std::set<std::string>{"lo"};
    auto r = load_paths({(s.base / "current").string()}, o);
    INFO(all_text(r));
    CHECK(r.ok());
}

TEST_CASE("a policy directory writable by others is warned about") {
    if (geteuid() != 0) return;  // the warning is only given to root
    Sandbox s;
    fs::permissions(s.root, fs::perms::others_write, fs::perm_options::add);
    auto r = s.load();
    INFO(all_text(r));
    CHECK(all_text(r).find("world-writable") != std::string::npos);
    fs::permissions(s.root, fs::perms::others_write, fs::perm_options::remove);
    REQUIRE(chown(s.root.c_str(), 65534, 65534) == 0);
    CHECK(all_text(s.load()).find("owned by uid 65534") != std::string::npos);
}
