// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The policy directory reader (policy_files.h): openat2 beneath a directory fd, regular files
// only, every read capped.
#include "manifest/policy_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <stdexcept>
#include <vector>

namespace fs = std::filesystem;

namespace mpsteer::manifest {

namespace {

using net::Fd;

int fail(int err) {
    errno = err;
    return -1;
}

// The same resolution in userspace, for where openat2 is missing (qemu-user, kernels before
// 5.6): one component at a time from dirfd with O_NOFOLLOW, so the kernel never follows a
// symlink; a symlink is read here and its target walked the same way. An absolute target or a
// ".." above dirfd is EXDEV, as RESOLVE_BENEATH makes it.
int open_beneath_walk(int dirfd, const std::string& rel, uint64_t flags, bool follow) {
    if (!rel.empty() && rel[0] == '/') return fail(EXDEV);
    std::vector<std::string> todo;  // components still to walk, the next one last
    auto push_path = [&](const std::string& path) {
        std::vector<std::string> parts;
        for (size_t at = 0; at <= path.size();) {
            size_t slash = std::min(path.find('/', at), path.size());
            if (slash > at) parts.push_back(path.substr(at, slash - at));
            at = slash + 1;
        }
        todo.insert(todo.end(), parts.rbegin(), parts.rend());
    };
    push_path(rel);
    std::vector<Fd> dirs;  // the directories walked through; empty means dirfd itself
    auto here = [&] { return dirs.empty() ? dirfd : dirs.back().get(); };
    int links = 0;
    while (!todo.empty()) {
        std::string name = std::move(todo.back());
        todo.pop_back();
        if (name == ".") continue;
        if (name == "..") {
            if (dirs.empty()) return fail(EXDEV);
            dirs.pop_back();
            continue;
        }
        Fd f{openat(here(), name.c_str(), O_PATH | O_NOFOLLOW | O_CLOEXEC)};
        if (!f) return -1;
        struct stat st;
        if (fstat(f.get(), &st) != 0) return -1;
        if (S_ISLNK(st.st_mode)) {
            if (!follow || ++links > 40) return fail(ELOOP);
            char target[4096];
            ssize_t n = readlinkat(f.get(), "", target, sizeof target);
            if (n < 0) return -1;
            if (n == 0 || target[0] == '/') return fail(EXDEV);
            push_path(std::string(target, size_t(n)));
            continue;
        }
        if (todo.empty())  // the last component, opened as asked; O_NOFOLLOW against a swap
            return openat(here(), name.c_str(), int(flags) | O_NOFOLLOW | O_CLOEXEC);
        if (!S_ISDIR(st.st_mode)) return fail(ENOTDIR);
        dirs.push_back(std::move(f));
    }
    return openat(here(), ".", int(flags) | O_CLOEXEC);
}

// glibc 2.36 has no openat2 wrapper.
int open_beneath(int dirfd, const std::string& rel, uint64_t flags, uint64_t resolve) {
    static std::atomic<bool> have_openat2{true};
    if (have_openat2.load(std::memory_order_relaxed)) {
        open_how how{};
        how.flags = flags | O_CLOEXEC;
        how.resolve = resolve;
        int fd = static_cast<int>(syscall(SYS_openat2, dirfd, rel.c_str(), &how, sizeof how));
        if (fd >= 0 || errno != ENOSYS) return fd;
        have_openat2 = false;
    }
    return open_beneath_walk(dirfd, rel, flags, !(resolve & RESOLVE_NO_SYMLINKS));
}

constexpr uint64_t kBeneath = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;

std::string open_error(int err) {
    switch (err) {
    case EXDEV:
        return "leads outside the policy directory (a symlink or path out of it is not "
               "followed)";
    case ELOOP: return "is a symlink loop or a link into /proc (not followed)";
    case ENOENT: return "does not exist (a dangling symlink?)";
    case ENOTDIR: return "has a path component that is not a directory";
    default: return std::string("cannot be opened: ") + std::strerror(err);
    }
}

std::string file_type(mode_t m) {
    if (S_ISDIR(m)) return "a directory";
    if (S_ISFIFO(m)) return "a FIFO";
    if (S_ISCHR(m) || S_ISBLK(m)) return "a device";
    if (S_ISSOCK(m)) return "a socket";
    return "not a regular file";
}

// Reads at most max + 1 bytes from a regular file's fd: anything beyond max is a refusal.
bool read_capped(int fd, size_t max, std::string& out) {
    out.clear();
    char buf[65536];
    for (;;) {
        ssize_t n = ::read(fd, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return false;
        if (n == 0) return true;
        out.append(buf, size_t(n));
        if (out.size() > max) return true;
    }
}

}  // namespace

PolicyTree::PolicyTree(const std::string& dir, std::string display, size_t* revision_bytes)
    : display_(display.empty() ? dir : std::move(display)) {
    if (revision_bytes) bytes_read_ = revision_bytes;
    // The root itself may be a symlink (git-sync flips one to each commit's worktree):
    // followed here, once; the path recorded is the directory this fd holds.
    fd_.reset(::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
    if (!fd_) throw std::runtime_error(dir + ": " + std::strerror(errno));
    std::error_code ec;
    root_ = fs::read_symlink("/proc/self/fd/" + std::to_string(fd_.get()), ec).string();
    if (ec) root_ = fs::canonical(dir, ec).string();
}

std::string PolicyTree::display(const std::string& rel) const {
    auto p = (fs::path(display_) / rel).lexically_normal().string();
    if (p.size() > 1 && p.back() == '/') p.pop_back();
    return p;
}

std::vector<std::string> PolicyTree::list(bool (*want)(const std::string&),
                                          std::vector<Diagnostic>& diags) const {
    std::vector<std::string> files;
    std::vector<std::string> dirs{""};
    bool over = false;
    auto error = [&](const std::string& rel, const std::string& msg) {
        diags.push_back({Severity::error, {display(rel), 0, 0}, "", msg});
    };
    while (!dirs.empty() && !over) {
        std::string dir = std::move(dirs.back());
        dirs.pop_back();
        // Real directories only: the walk never goes through a symlink.
        Fd dfd(dir.empty() ? ::dup(fd_.get())
                           : open_beneath(fd_.get(), dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW,
                                          RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS));
        if (!dfd) {
            error(dir, "directory " + open_error(errno));
            continue;
        }
        DIR* d = fdopendir(dfd.get());
        if (!d) {
            error(dir, std::string("cannot list: ") + std::strerror(errno));
            continue;
        }
        dfd.release();  // the DIR's now: closedir() closes it
        while (dirent* e = readdir(d)) {
            std::string name = e->d_name;
            if (name.empty() || name[0] == '.') continue;  // ".", "..", hidden (.git)
            std::string rel = dir.empty() ? name : dir + "/" + name;
            struct stat st;
            if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
            if (S_ISDIR(st.st_mode)) {
                dirs.push_back(rel);
                continue;
            }
            if (!want(name)) continue;
            if (S_ISLNK(st.st_mode)) {
                Fd t{open_beneath(fd_.get(), rel, O_PATH, kBeneath)};
                if (!t) {
                    error(rel, "symlink " + open_error(errno));
                    continue;
                }
                if (fstat(t.get(), &st) == 0 && S_ISDIR(st.st_mode)) continue;  // not descended
            }
            if (files.size() == kMaxPolicyFiles) {
                error("", "more than " + std::to_string(kMaxPolicyFiles) +
                              " files; none of the policy directory is used");
                over = true;
                break;
            }
            files.push_back(rel);
        }
        closedir(d);
    }
    if (over) return {};
    std::sort(files.begin(), files.end());
    return files;
}

std::string PolicyTree::check(const std::string& rel) const {
    Fd f{open_beneath(fd_.get(), rel, O_PATH, kBeneath)};
    if (!f) return open_error(errno);
    struct stat st;
    if (fstat(f.get(), &st) != 0) return std::string("cannot be read: ") + std::strerror(errno);
    if (!S_ISREG(st.st_mode)) return "is " + file_type(st.st_mode) + ", not a regular file";
    return "";
}

bool PolicyTree::present(const std::string& rel) const {
    Fd f{open_beneath(fd_.get(), rel, O_PATH, kBeneath)};
    return f || (errno != ENOENT && errno != ENOTDIR);
}

std::optional<std::string> PolicyTree::read(const std::string& rel,
                                            std::vector<Diagnostic>& diags) {
    auto error = [&](const std::string& msg) {
        diags.push_back({Severity::error, {display(rel), 0, 0}, "", msg});
        return std::nullopt;
    };
    // O_NONBLOCK: opening a FIFO must not wait for a writer.
    Fd f{open_beneath(fd_.get(), rel, O_RDONLY | O_NONBLOCK | O_NOCTTY, kBeneath)};
    if (!f) return error(open_error(errno));
    struct stat st;
    if (fstat(f.get(), &st) != 0)
        return error(std::string("cannot be read: ") + std::strerror(errno));
    if (!S_ISREG(st.st_mode))
        return error("is " + file_type(st.st_mode) + ", not a regular file; not read");
    const std::string too_big =
        "larger than " + std::to_string(kMaxPolicyFileBytes) + " bytes; not read";
    if (size_t(st.st_size) > kMaxPolicyFileBytes) return error(too_big);
    const size_t budget = kMaxRevisionBytes - std::min(*bytes_read_, kMaxRevisionBytes);
    const std::string over_budget = "the policy directory holds more than " +
                                    std::to_string(kMaxRevisionBytes) + " bytes in total; not read";
    if (size_t(st.st_size) > budget) return error(over_budget);
    std::string text;
    if (!read_capped(f.get(), std::min(kMaxPolicyFileBytes, budget), text))
        return error(std::string("cannot be read: ") + std::strerror(errno));
    *bytes_read_ += text.size();
    if (text.size() > kMaxPolicyFileBytes) return error(too_big);  // grew while read
    if (text.size() > budget) return error(over_budget);
    return text;
}

void PolicyTree::ownership_warnings(std::vector<Diagnostic>& diags) const {
    if (geteuid() != 0) return;
    for (fs::path p = root_;; p = p.parent_path()) {
        struct stat st;
        if (::stat(p.c_str(), &st) != 0) break;
        std::string who;
        if (st.st_uid != 0)
            who = "is owned by uid " + std::to_string(st.st_uid);
        else if ((st.st_mode & (S_IWGRP | S_IWOTH)) && !(st.st_mode & S_ISVTX))
            who = st.st_mode & S_IWOTH ? "is world-writable" : "is group-writable";
        if (!who.empty())
            diags.push_back(
                {Severity::warning,
                 {display(""), 0, 0},
                 "",
                 (p == root_ ? "the policy directory " : "its parent " + p.string() + " ") + who +
                     ": whoever can write there controls what the agent runs"});
        if (p == p.parent_path()) break;
    }
}

size_t count_documents(const std::string& text) {
    size_t n = 1;
    for (size_t at = 0; at + 3 <= text.size(); ++at) {
        if ((at == 0 || text[at - 1] == '\n') && text.compare(at, 3, "---") == 0 &&
            (at + 3 == text.size() || std::strchr(" \t\r\n", text[at + 3])))
            ++n;
        at = text.find('\n', at);
        if (at == std::string::npos) break;
    }
    return n;
}

void cap_diagnostics(std::vector<Diagnostic>& diags) {
    if (diags.size() <= kMaxDiagnostics) return;
    const size_t left_out = diags.size() - kMaxDiagnostics;
    Position at = diags[kMaxDiagnostics].pos;
    diags.resize(kMaxDiagnostics);
    diags.push_back({Severity::error, at, "",
                     "more than " + std::to_string(kMaxDiagnostics) + " diagnostics; " +
                         std::to_string(left_out) + " more not shown"});
}

std::optional<std::string> read_small_file(const std::string& path, size_t max) {
    Fd f{::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC)};
    struct stat st;
    if (!f || fstat(f.get(), &st) != 0 || !S_ISREG(st.st_mode)) return std::nullopt;
    std::string text;
    if (!read_capped(f.get(), max, text) || text.size() > max) return std::nullopt;
    return text;
}

}  // namespace mpsteer::manifest
