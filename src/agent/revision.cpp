// What revision a policy directory holds: git-sync publishes by renaming a symlink whose
// target's basename is the commit; a `git pull` checkout has .git/HEAD; anything else is named
// by its content.
#include <openssl/evp.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "agent/agent.h"

namespace fs = std::filesystem;

namespace mpsteer::agent {

namespace {
std::string read_file(const fs::path& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
}

std::string trim(std::string s) {
    while (!s.empty() && (s.back() == '\n' || s.back() == '\r' || s.back() == ' ')) s.pop_back();
    return s;
}

// The commit .git/HEAD points at, or "" when it cannot be read.
std::string git_head(const fs::path& root) {
    fs::path git = root / ".git";
    if (fs::is_regular_file(git)) {  // a worktree: "gitdir: <path>"
        auto line = trim(read_file(git));
        if (line.rfind("gitdir: ", 0) != 0) return "";
        git = fs::path(line.substr(8));
        if (git.is_relative()) git = root / git;
    }
    auto head = trim(read_file(git / "HEAD"));
    if (head.rfind("ref: ", 0) != 0) return head;
    auto ref = head.substr(5);
    if (fs::exists(git / ref)) return trim(read_file(git / ref));
    std::istringstream packed(read_file(git / "packed-refs"));
    for (std::string line; std::getline(packed, line);) {
        auto sp = line.find(' ');
        if (sp != std::string::npos && line.substr(sp + 1) == ref) return line.substr(0, sp);
    }
    return "";
}

bool hidden(const fs::path& rel) {
    for (const auto& part : rel)
        if (!part.empty() && part.string()[0] == '.') return true;
    return false;
}
}  // namespace

Revision snapshot(const std::string& dir) {
    Revision r;
    std::error_code ec;
    fs::path root = fs::canonical(dir, ec);
    if (ec) throw std::runtime_error("policy directory " + dir + ": " + ec.message());
    r.root = root.string();

    // Content: every non-hidden regular file, sorted by relative path.
    std::vector<fs::path> files;
    for (auto it = fs::recursive_directory_iterator(root, ec); !ec && it != fs::end(it);
         it.increment(ec)) {
        auto rel = fs::relative(it->path(), root);
        if (hidden(rel)) {
            if (it->is_directory()) it.disable_recursion_pending();
            continue;
        }
        if (it->is_regular_file()) files.push_back(rel);
    }
    std::sort(files.begin(), files.end());
    EVP_MD_CTX* md = EVP_MD_CTX_new();
    EVP_DigestInit_ex(md, EVP_sha256(), nullptr);
    for (const auto& f : files) {
        auto name = f.generic_string(), data = read_file(root / f);
        uint64_t sizes[2] = {name.size(), data.size()};
        EVP_DigestUpdate(md, sizes, sizeof sizes);
        EVP_DigestUpdate(md, name.data(), name.size());
        EVP_DigestUpdate(md, data.data(), data.size());
    }
    unsigned char h[EVP_MAX_MD_SIZE];
    unsigned len = 0;
    EVP_DigestFinal_ex(md, h, &len);
    EVP_MD_CTX_free(md);
    static const char* hex = "0123456789abcdef";
    for (unsigned i = 0; i < len; ++i) r.content += {hex[h[i] >> 4], hex[h[i] & 15]};

    if (fs::is_symlink(dir)) {
        auto base = fs::path(r.root).filename().string();
        if (base.rfind("rev-", 0) == 0) base = base.substr(4);
        r.id = base;
    } else if (auto head = git_head(root); !head.empty()) {
        r.id = head;
    } else {
        r.id = "sha256:" + r.content.substr(0, 16);
    }
    return r;
}

std::string status_path(const std::string& d) { return d + "/status.json"; }
std::string events_path(const std::string& d) { return d + "/events.jsonl"; }
std::string suspended_path(const std::string& d) { return d + "/suspended"; }
std::string applied_path(const std::string& d) { return d + "/state/applied.json"; }

}  // namespace mpsteer::agent
