// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
#include "net/stats.h"

#include <algorithm>
#include <cmath>

namespace mpsteer::net {

double quantile(std::vector<double> samples, double q) {
    if (samples.empty()) return 0;
    std::sort(samples.begin(), samples.end());
    // The tolerance keeps q * n from landing a rank too high when q is not exact in binary
    // (0.95 * 20 is 19.000000000000004 in some orders of evaluation).
    const double rank = std::ceil(q * double(samples.size()) - 1e-9);
    return samples[std::clamp<size_t>(size_t(std::max(rank, 1.0)), 1, samples.size()) - 1];
}

}  // namespace mpsteer::net
