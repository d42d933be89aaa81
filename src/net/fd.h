// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// An owned file descriptor, closed when its owner goes; the one such type of the project.
#pragma once

#include <unistd.h>

#include <utility>

namespace mpsteer::net {

class Fd {
public:
    Fd() = default;
    explicit Fd(int fd) : fd_(fd) {}  // takes ownership (-1: none)
    Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
    Fd& operator=(Fd&& o) noexcept {
        if (this != &o) reset(std::exchange(o.fd_, -1));
        return *this;
    }
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
    ~Fd() { reset(); }

    int get() const { return fd_; }
    explicit operator bool() const { return fd_ >= 0; }
    int release() { return std::exchange(fd_, -1); }  // the caller owns it now
    void reset(int fd = -1) {                         // closes the one held, holds `fd`
        if (fd_ >= 0) ::close(fd_);
        fd_ = fd;
    }

private:
    int fd_ = -1;
};

}  // namespace mpsteer::net
