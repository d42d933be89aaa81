// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Summaries of measured samples: one definition for every benchmark, use case and test that
// reports a median or a percentile, so their figures compare.
#pragma once

#include <vector>

namespace mpsteer::net {

// The q-quantile (0 <= q <= 1) by nearest rank: the smallest sample with at least a q share of
// the samples at or below it (of an even count, the median is the lower middle one); 0 when
// there are none.
double quantile(std::vector<double> samples, double q);

inline double median(std::vector<double> samples) {
    return quantile(std::move(samples), 0.5);
}

}  // namespace mpsteer::net
