// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The assembler's label fixups; see bpf_asm.h.
#include "datapath/bpf_asm.h"

#include <algorithm>
#include <stdexcept>

namespace mpsteer::datapath::bpfasm {

bool Asm::used(Label l) const {
    return std::any_of(fixups_.begin(), fixups_.end(), [&](auto& f) { return f.second == l.id; });
}

std::vector<bpf_insn> Asm::finish() {
    for (auto [at, id] : fixups_) {
        if (id < 0 || id >= static_cast<int>(at_.size()) || at_[id] < 0)
            throw std::logic_error("bpf assembler: jump to an unbound label");
        // A jump's offset counts from the instruction after it.
        const int off = at_[id] - static_cast<int>(at) - 1;
        if (off < INT16_MIN || off > INT16_MAX)
            throw std::logic_error("bpf assembler: jump beyond a 16-bit offset");
        code_[at].off = static_cast<int16_t>(off);
    }
    return std::move(code_);
}

}  // namespace mpsteer::datapath::bpfasm
