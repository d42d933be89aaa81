// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The one reader of a policy directory. Whoever can commit to the policy repository controls
// every name, symlink and file type in it, and the agent reads it as root: nothing is read
// through a symlink that leads out of the directory, only regular files are read, and every
// read is capped (docs/security.md, "Reading the policy directory"; schemas/README.md, "Limits").
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "manifest/manifest.h"
#include "net/fd.h"

namespace mpsteer::manifest {

inline constexpr size_t kMaxPolicyFileBytes = 4 << 20;  // one file
inline constexpr size_t kMaxRevisionBytes = 16 << 20;   // every file read from one revision
inline constexpr size_t kMaxPolicyFiles = 4096;         // files listed in one revision
inline constexpr size_t kMaxDocumentsPerFile = 64;      // YAML documents in one file
inline constexpr size_t kMaxDocuments = 1024;           // YAML documents in one revision
inline constexpr size_t kMaxDiagnostics = 1000;         // diagnostics reported for one load

// A directory opened once (a symlink naming it, as git-sync publishes, is resolved then);
// every later path is resolved beneath it with openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS).
// Problems are diagnostics at DISPLAY/REL:0:0 that never quote a refused file's content.
class PolicyTree {
public:
    // `display` prefixes the relative names in diagnostics (the path as the user gave it).
    // `revision_bytes` counts what is read against kMaxRevisionBytes, shared by every tree of
    // one load (its manifests and its scripts); nullptr: this tree's own count.
    // Throws std::runtime_error when `dir` cannot be opened as a directory.
    explicit PolicyTree(const std::string& dir, std::string display = "",
                        size_t* revision_bytes = nullptr);
    PolicyTree(const PolicyTree&) = delete;
    PolicyTree& operator=(const PolicyTree&) = delete;
    ~PolicyTree() = default;

    const std::string& root() const { return root_; }  // absolute, symlinks resolved
    std::string display(const std::string& rel) const;

    // Non-hidden files (no component starting with '.') whose name `want` accepts, as sorted
    // relative paths; at most kMaxPolicyFiles. Directories are descended only when they are
    // real directories (a symlink to a directory is not followed). Accepted names that are a
    // symlink leading out of the tree, dangling or looping are reported and left out; FIFOs,
    // devices and sockets are listed so read() refuses them by name.
    std::vector<std::string> list(bool (*want)(const std::string& name),
                                  std::vector<Diagnostic>& diags) const;
    // The bytes of `rel` when it resolves beneath the root to a regular file within
    // kMaxPolicyFileBytes and the revision's remaining kMaxRevisionBytes; else an error.
    std::optional<std::string> read(const std::string& rel, std::vector<Diagnostic>& diags);
    // "" when `rel` resolves beneath the root to a regular file, else why not.
    std::string check(const std::string& rel) const;
    // Whether `rel` names something: a file, or a path that leads out of the tree (which is
    // present whatever lies outside, so that nothing outside shows through). False when it
    // does not exist beneath the root.
    bool present(const std::string& rel) const;
    // Warnings when the directory or a parent can be changed by someone other than root
    // (owned by another user, or group/world writable without the sticky bit). Only when
    // running as root: for anyone else their own directories are the norm.
    void ownership_warnings(std::vector<Diagnostic>& diags) const;

private:
    net::Fd fd_;
    std::string root_, display_;
    size_t own_bytes_read_ = 0;
    size_t* bytes_read_ = &own_bytes_read_;
};

// Upper bound of the YAML documents in `text` (document markers at the start of a line), so
// a file with too many is refused before it is parsed.
size_t count_documents(const std::string& text);

// Keeps the first kMaxDiagnostics of sorted diagnostics and says how many were left out.
void cap_diagnostics(std::vector<Diagnostic>& diags);

// A small file outside any policy tree (git metadata): regular files only, at most `max`
// bytes, never blocking; nullopt otherwise.
std::optional<std::string> read_small_file(const std::string& path, size_t max);

}  // namespace mpsteer::manifest
