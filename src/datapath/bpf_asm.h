// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// A small BPF assembler: instruction builders, labels, and jumps to labels that are fixed up
// when the program is finished (forward and backward). What the entry emitter writes
// compiled entries with (entry_emitter.cpp); no knowledge of chains or maps here.
#pragma once

#include <linux/bpf.h>

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace mpsteer::datapath::bpfasm {

enum Reg : uint8_t { R0, R1, R2, R3, R4, R5, R6, R7, R8, R9, FP };

inline bpf_insn insn(uint8_t code, uint8_t dst, uint8_t src, int16_t off, int32_t imm) {
    bpf_insn i{};
    i.code = code;
    i.dst_reg = dst;
    i.src_reg = src;
    i.off = off;
    i.imm = imm;
    return i;
}

// A place in the code, bound once (bind()); jumps may name it before or after that.
struct Label {
    int id = -1;  // -1: no label (a jump to it is a bug; ja() to it emits nothing)
    bool operator==(const Label&) const = default;
};

class Asm {
public:
    Label label() {
        at_.push_back(-1);
        return {static_cast<int>(at_.size()) - 1};
    }
    void bind(Label l) { at_[l.id] = static_cast<int>(code_.size()); }
    // Whether the code so far can run on into what comes next.
    bool falls_through() const {
        return code_.empty() || (code_.back().code != (BPF_JMP | BPF_EXIT) &&
                                 code_.back().code != (BPF_JMP | BPF_JA));
    }
    // Whether some jump names l (code only reached through l need not be emitted otherwise).
    bool used(Label l) const;
    size_t size() const { return code_.size(); }

    void put(bpf_insn i) { code_.push_back(i); }
    // ALU on the low 32 bits (zero-extends) and on 64 bits; immediate or register source.
    void alu32(uint8_t op, Reg d, int32_t imm) { put(insn(BPF_ALU | op | BPF_K, d, 0, 0, imm)); }
    void alu32(uint8_t op, Reg d, Reg s) { put(insn(BPF_ALU | op | BPF_X, d, s, 0, 0)); }
    void alu64(uint8_t op, Reg d, int32_t imm) { put(insn(BPF_ALU64 | op | BPF_K, d, 0, 0, imm)); }
    void alu64(uint8_t op, Reg d, Reg s) { put(insn(BPF_ALU64 | op | BPF_X, d, s, 0, 0)); }
    // A 16-bit field from network order. The mask changes nothing (the swap zeroes the upper
    // bits) but tells verifiers before 6.10, which know nothing of a swap's result, that the
    // value is below 64k: pointer arithmetic with it is refused otherwise.
    void be16(Reg d) {
        put(insn(BPF_ALU | BPF_END | BPF_TO_BE, d, 0, 0, 16));
        alu32(BPF_AND, d, 0xffff);
    }
    // A 32-bit word from network order.
    void be32(Reg d) { put(insn(BPF_ALU | BPF_END | BPF_TO_BE, d, 0, 0, 32)); }
    void load(uint8_t size, Reg d, Reg base, int16_t off) {
        put(insn(BPF_LDX | size | BPF_MEM, d, base, off, 0));
    }
    void store(uint8_t size, Reg base, int16_t off, Reg s) {
        put(insn(BPF_STX | size | BPF_MEM, base, s, off, 0));
    }
    void store(uint8_t size, Reg base, int16_t off, int32_t imm) {
        put(insn(BPF_ST | size | BPF_MEM, base, 0, off, imm));
    }
    void ld_map(Reg d, int fd) { ld64(d, BPF_PSEUDO_MAP_FD, fd, 0); }
    void ld_map_value(Reg d, int fd, int32_t off) { ld64(d, BPF_PSEUDO_MAP_VALUE, fd, off); }
    void call(int32_t helper) { put(insn(BPF_JMP | BPF_CALL, 0, 0, 0, helper)); }
    void exit() { put(insn(BPF_JMP | BPF_EXIT, 0, 0, 0, 0)); }
    void ret(int32_t verdict) {
        alu64(BPF_MOV, R0, verdict);
        exit();
    }

    void jmp32(uint8_t op, Reg d, int32_t imm, Label l) {
        jump(BPF_JMP32 | op | BPF_K, d, R0, imm, l);
    }
    void jmp32(uint8_t op, Reg d, Reg s, Label l) { jump(BPF_JMP32 | op | BPF_X, d, s, 0, l); }
    void jmp64(uint8_t op, Reg d, int32_t imm, Label l) {
        jump(BPF_JMP | op | BPF_K, d, R0, imm, l);
    }
    void jmp64(uint8_t op, Reg d, Reg s, Label l) { jump(BPF_JMP | op | BPF_X, d, s, 0, l); }
    // Unconditional; nothing when `l` is `next`, the code that follows.
    void ja(Label l, Label next = Label{}) {
        if (!(l == next)) jump(BPF_JMP | BPF_JA, R0, R0, 0, l);
    }

    // The program, every jump's offset filled in. Throws std::logic_error for a jump to a
    // label never bound or beyond a 16-bit offset.
    std::vector<bpf_insn> finish();

private:
    void jump(uint8_t code, Reg d, Reg s, int32_t imm, Label l) {
        fixups_.emplace_back(code_.size(), l.id);
        put(insn(code, d, s, 0, imm));
    }
    void ld64(Reg d, uint8_t pseudo, int32_t imm, int32_t imm2) {
        put(insn(BPF_LD | BPF_DW | BPF_IMM, d, pseudo, 0, imm));
        put(insn(0, 0, 0, 0, imm2));
    }
    std::vector<bpf_insn> code_;
    std::vector<int> at_;                         // label id -> instruction index (-1: unbound)
    std::vector<std::pair<size_t, int>> fixups_;  // (jump's index, label id)
};

}  // namespace mpsteer::datapath::bpfasm
