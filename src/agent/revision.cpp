// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// What revision a policy directory holds: git-sync publishes by renaming a symlink whose
// target's basename is the commit; a `git pull` checkout has .git/HEAD; anything else is named
// by its content.

#include <algorithm>
#include <filesystem>
#include <memory>
#include <sstream>

#include "agent/agent.h"
#include "manifest/policy_files.h"
#include "net/sha256.h"

namespace fs = std::filesystem;

namespace mpsteer::agent {

namespace {
// Git metadata may live outside the tree (a worktree's gitdir): small regular files only.
std::string read_file(const fs::path& p) {
    return manifest::read_small_file(p.string(), 1 << 20).value_or("");
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

// The id is shown in logs and the status: only ever a commit hash, never other text.
bool commit_hash(const std::string& s) {
    return (s.size() == 40 || s.size() == 64) && std::all_of(s.begin(), s.end(), [](char c) {
               return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f');
           });
}

// What a load reads: manifests and scripts. Other files (documentation, images) neither
// change what runs nor take the revision's byte cap from the files that do.
bool policy_input(const std::string& name) {
    auto ext = fs::path(name).extension();
    return ext == ".yaml" || ext == ".yml" || ext == ".lua";
}
}  // namespace

Revision snapshot(const std::string& dir) {
    Revision r;
    std::unique_ptr<manifest::PolicyTree> tree;
    try {
        tree = std::make_unique<manifest::PolicyTree>(dir);
    } catch (const std::exception& e) {
        throw std::runtime_error("policy directory " + std::string(e.what()));
    }
    r.root = tree->root();
    fs::path root = r.root;

    // Content: every non-hidden manifest and script, sorted by relative path, read as the
    // manifests are (policy_files.h). A file refused there counts by its name and the refusal, so
    // the content still changes when it does; the manifest load reports it.
    std::vector<manifest::Diagnostic> refused;
    auto files = tree->list(policy_input, refused);
    net::Sha256 md;
    for (const auto& d : refused) md.update(d.pos.file.data(), d.pos.file.size());
    for (const auto& f : files) {
        auto data = tree->read(f, refused);
        uint64_t sizes[2] = {f.size(), data ? data->size() : UINT64_MAX};
        md.update(sizes, sizeof sizes);
        md.update(f.data(), f.size());
        if (data) md.update(data->data(), data->size());
    }
    static const char* hex = "0123456789abcdef";
    for (uint8_t b : md.digest()) r.content += {hex[b >> 4], hex[b & 15]};

    if (fs::is_symlink(dir)) {
        auto base = fs::path(r.root).filename().string();
        if (base.rfind("rev-", 0) == 0) base = base.substr(4);
        r.id = base;
    } else if (auto head = git_head(root); commit_hash(head)) {
        r.id = head;
    } else {
        r.id = "sha256:" + r.content.substr(0, 16);
    }
    return r;
}

std::string status_path(const std::string& d) {
    return d + "/status.json";
}
std::string events_path(const std::string& d) {
    return d + "/events.jsonl";
}
std::string suspended_path(const std::string& d) {
    return d + "/suspended";
}
std::string applied_path(const std::string& d) {
    return d + "/state/applied.json";
}

}  // namespace mpsteer::agent
