// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// In-place step writes that hooks request (set_policy_backup) and the agent carries out. A
// generation has one writer, the agent's rollout: the hooks run on the event thread, so they
// only queue the new step values here; the agent drains the queue on its own thread (fd() is
// an eventfd in its epoll set) and writes them into the generation they were meant for.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "datapath/chain.h"
#include "net/fd.h"

namespace mpsteer::lua {

// The one in-place parameter change hooks make: the B flag of the set_backup step at `pc` of
// generation `generation` (dropped if that generation no longer runs).
struct StepWrite {
    uint32_t generation = 0;
    uint32_t pc = 0;
    bool backup = false;
};

class StepWriteQueue {
public:
    StepWriteQueue();  // throws std::runtime_error when the eventfd cannot be made
    ~StepWriteQueue() = default;
    StepWriteQueue(const StepWriteQueue&) = delete;
    StepWriteQueue& operator=(const StepWriteQueue&) = delete;

    // Any thread. A write to a step already queued replaces that one (in its place).
    void push(std::vector<StepWrite> writes);
    // Everything queued so far, oldest first; resets fd().
    std::vector<StepWrite> take();
    int fd() const { return fd_.get(); }  // readable while writes wait

private:
    std::mutex mu_;
    std::vector<StepWrite> queue_;
    net::Fd fd_;
};

// The running generation as the hooks see it: its number and chain set (a copy; the datapath's
// Generation stays with its one writer).
struct RunningGeneration {
    uint32_t number = 0;
    datapath::ChainSet chains;
};

}  // namespace mpsteer::lua
