-- SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
function on_tick() error("\255\254 not UTF-8 \192\128") end
