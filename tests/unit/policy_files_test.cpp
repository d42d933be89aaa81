// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Hostile policy directories: whoever commits to the policy repository controls names,
// symlinks and file types. Nothing outside the directory may be read or shown, nothing may
// block, every cap is an error naming the file.
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
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
