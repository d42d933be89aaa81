// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
#define CATCH_CONFIG_MAIN
#include <catch2/catch.hpp>
