// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// mpsteer bench --live (bench_live.cpp): chains on a real MPTCP transfer through the lab.
#pragma once

namespace mpsteer::cli {
// Runs `rounds` rounds of `seconds`-long transfers per case and prints the figures (JSON with
// json, else indented JSON and the targets). Needs root. Returns the exit code.
int run_live_bench(bool json, int rounds, int seconds);
}  // namespace mpsteer::cli
