// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// mpsteer bench --live (bench_live.cpp): chains on a real MPTCP transfer through the lab.
#pragma once

#include <string>
#include <vector>

namespace mpsteer::cli {
// The cases beside "none" and "bare_xdp" (always run): the first three are the default.
const std::vector<std::string>& live_bench_cases();

// Runs `rounds` rounds of `seconds`-long transfers per case and prints the figures (JSON with
// json, else indented JSON and the targets). `share` holds the shipped policies/ and lua/.
// prog_times: also the kernel's run time per program run at each hook of both hosts
// (kernel.bpf_stats_enabled; it costs every run two clock reads). Needs root. Returns the exit
// code.
int run_live_bench(bool json, int rounds, int seconds, const std::string& share,
                   const std::vector<std::string>& cases, bool prog_times = false);
}  // namespace mpsteer::cli
