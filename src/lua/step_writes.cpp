// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
#include "lua/step_writes.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <string>

namespace mpsteer::lua {

StepWriteQueue::StepWriteQueue() : fd_(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    if (!fd_) throw std::runtime_error(std::string("step write queue: ") + std::strerror(errno));
}

void StepWriteQueue::push(std::vector<StepWrite> writes) {
    if (writes.empty()) return;
    {
        std::lock_guard lock(mu_);
        // The latest value per step wins: the queue holds at most one write per step of the
        // generations it names, however often a hook writes.
        for (const auto& w : writes) {
            auto it = std::find_if(queue_.begin(), queue_.end(), [&](const StepWrite& q) {
                return q.generation == w.generation && q.pc == w.pc;
            });
            if (it != queue_.end())
                *it = w;
            else
                queue_.push_back(w);
        }
    }
    uint64_t one = 1;
    while (write(fd_.get(), &one, sizeof one) < 0 && errno == EINTR) {}
}

std::vector<StepWrite> StepWriteQueue::take() {
    uint64_t v;
    while (read(fd_.get(), &v, sizeof v) < 0 && errno == EINTR) {
    }  // first: a push after the swap below signals again
    std::vector<StepWrite> out;
    std::lock_guard lock(mu_);
    out.swap(queue_);
    return out;
}

}  // namespace mpsteer::lua
