// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
#include "lua/step_writes.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace mpsteer::lua {

StepWriteQueue::StepWriteQueue() : fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    if (fd_ < 0) throw std::runtime_error(std::string("step write queue: ") + std::strerror(errno));
}

StepWriteQueue::~StepWriteQueue() {
    close(fd_);
}

void StepWriteQueue::push(std::vector<StepWrite> writes) {
    if (writes.empty()) return;
    {
        std::lock_guard lock(mu_);
        queue_.insert(queue_.end(), writes.begin(), writes.end());
    }
    uint64_t one = 1;
    while (write(fd_, &one, sizeof one) < 0 && errno == EINTR) {}
}

std::vector<StepWrite> StepWriteQueue::take() {
    uint64_t v;
    while (read(fd_, &v, sizeof v) < 0 && errno == EINTR) {
    }  // first: a push after the swap below signals again
    std::vector<StepWrite> out;
    std::lock_guard lock(mu_);
    out.swap(queue_);
    return out;
}

}  // namespace mpsteer::lua
