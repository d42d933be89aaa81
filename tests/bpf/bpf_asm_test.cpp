// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The BPF assembler (src/datapath/bpf_asm.h) on its own: jump offsets filled in from labels
// bound before or after the jump, and the mistakes it refuses. No kernel involved.
#include <catch2/catch.hpp>

#include <stdexcept>

#include "datapath/bpf_asm.h"

using namespace mpsteer::datapath::bpfasm;

TEST_CASE("a forward jump lands on the label bound after it", "[unit][bpf_asm]") {
    Asm a;
    Label out = a.label();
    a.jmp32(BPF_JEQ, R1, 7, out);  // 0
    a.alu64(BPF_MOV, R0, 1);       // 1
    a.alu64(BPF_ADD, R0, 2);       // 2
    a.bind(out);
    a.ret(0);  // 3, 4
    CHECK(a.used(out));
    auto code = a.finish();
    REQUIRE(code.size() == 5);
    CHECK(code[0].code == (BPF_JMP32 | BPF_JEQ | BPF_K));
    CHECK(code[0].dst_reg == R1);
    CHECK(code[0].imm == 7);
    CHECK(code[0].off == 2);  // counted from the instruction after the jump: 1 + 2 = 3
}

TEST_CASE("a backward jump (a loop) gets a negative offset", "[unit][bpf_asm]") {
    Asm a;
    Label loop = a.label(), done = a.label();
    a.alu64(BPF_MOV, R2, 0);  // 0
    a.bind(loop);
    a.jmp32(BPF_JGE, R2, 40, done);  // 1: forward to 4
    a.alu32(BPF_ADD, R2, 1);         // 2
    a.ja(loop);                      // 3: back to 1
    a.bind(done);
    a.ret(0);  // 4, 5
    auto code = a.finish();
    REQUIRE(code.size() == 6);
    CHECK(code[1].off == 2);
    CHECK(code[3].code == (BPF_JMP | BPF_JA));
    CHECK(code[3].off == -3);  // 3 + 1 - 3 = 1
}

TEST_CASE("ja to the code that follows emits nothing, ld_imm64 takes two slots",
          "[unit][bpf_asm]") {
    Asm a;
    Label next = a.label(), end = a.label();
    a.ja(next, next);
    CHECK(a.size() == 0);
    CHECK_FALSE(a.used(next));
    a.bind(next);
    a.ld_map_value(R1, 5, 8);       // 0, 1
    a.jmp64(BPF_JNE, R1, R2, end);  // 2: to 3
    a.bind(end);
    CHECK(a.falls_through());
    a.exit();
    CHECK_FALSE(a.falls_through());
    auto code = a.finish();
    REQUIRE(code.size() == 4);
    CHECK(code[0].code == (BPF_LD | BPF_DW | BPF_IMM));
    CHECK(code[0].src_reg == BPF_PSEUDO_MAP_VALUE);
    CHECK(code[0].imm == 5);
    CHECK(code[1].imm == 8);
    CHECK(code[2].off == 0);
}

TEST_CASE("a jump to a label never bound is refused", "[unit][bpf_asm]") {
    Asm a;
    Label nowhere = a.label();
    a.jmp32(BPF_JEQ, R1, 0, nowhere);
    a.ret(0);
    CHECK_THROWS_AS(a.finish(), std::logic_error);
}
