// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
#include "bpf_env.h"

#include <arpa/inet.h>
#include <bpf/bpf.h>
#include <sched.h>
#include <openssl/sha.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <stdexcept>

namespace mpsteer::test {

namespace fs = std::filesystem;

uint32_t retval_of(Verdict v, Hook h) {
    if (is_xdp(h)) return v == Verdict::pass ? XDP_PASS_ : XDP_DROP_;
    return v == Verdict::pass ? TC_PASS_ : TC_DROP_;
}

bool is_xdp(Hook h) {
    return h == Hook::xdp;
}

const char* name_of(Hook h) {
    switch (h) {
    case Hook::xdp: return "xdp";
    case Hook::tc_egress: return "tc_egress";
    case Hook::tc_ingress: return "tc_ingress";
    }
    return "?";
}

// ---- steps ----------------------------------------------------------------------------------

mps_step step(mps_prog prog, uint16_t on_match, uint16_t on_miss) {
    return dp::make_step(prog, on_match, on_miss);
}

namespace {
struct Cidr {
    uint8_t family;
    uint8_t prefix;
    uint32_t addr[4];
    uint32_t mask[4];
};

Cidr parse_cidr(std::string_view text) {
    auto slash = text.find('/');
    if (slash == std::string_view::npos)
        throw std::invalid_argument("no prefix: " + std::string(text));
    std::string addr(text.substr(0, slash));
    int prefix = std::stoi(std::string(text.substr(slash + 1)));
    Cidr c{};
    uint8_t bytes[16] = {};
    if (addr.find(':') != std::string::npos) {
        c.family = 6;
        auto a = ip6(addr);
        std::memcpy(bytes, a.data(), 16);
    } else {
        c.family = 4;
        auto a = ip4(addr);
        std::memcpy(bytes, a.data(), 4);
    }
    c.prefix = uint8_t(prefix);
    uint8_t mask[16] = {};
    for (int i = 0; i < prefix; i++) mask[i / 8] |= uint8_t(0x80 >> (i % 8));
    for (int i = 0; i < 16; i++) bytes[i] &= mask[i];
    std::memcpy(c.addr, bytes, 16);
    std::memcpy(c.mask, mask, 16);
    return c;
}

void addr_words(std::string_view text, uint32_t out[4], uint8_t* family) {
    uint8_t bytes[16] = {};
    if (text.find(':') != std::string_view::npos) {
        auto a = ip6(text);
        std::memcpy(bytes, a.data(), 16);
        *family = 6;
    } else {
        auto a = ip4(text);
        std::memcpy(bytes, a.data(), 4);
        *family = 4;
    }
    std::memcpy(out, bytes, 16);
}
}  // namespace

static mps_step cidr_step(mps_word base, std::string_view cidr, uint16_t m, uint16_t miss) {
    Cidr c = parse_cidr(cidr);
    return dp::Match(c.family).prefix(base, c.addr, c.prefix).step(m, miss);
}

mps_step sel_src(std::string_view cidr, uint16_t m, uint16_t miss) {
    return cidr_step(MPS_W_SRC, cidr, m, miss);
}
mps_step sel_dst(std::string_view cidr, uint16_t m, uint16_t miss) {
    return cidr_step(MPS_W_DST, cidr, m, miss);
}

// As the compiler lowers them: a and b either way round, with the ports (subflow) or without.
static mps_step pair_step(std::string_view a, std::optional<std::pair<uint16_t, uint16_t>> ports,
                          std::string_view b, uint16_t m, uint16_t miss) {
    uint32_t wa[4], wb[4];
    uint8_t fa, fb;
    addr_words(a, wa, &fa);
    addr_words(b, wb, &fb);
    if (fa != fb) throw std::invalid_argument("mixed families");
    const unsigned bits = fa == 4 ? 32 : 128;
    dp::Match match(fa, true);
    match.prefix(MPS_W_SRC, wa, bits).prefix(MPS_W_DST, wb, bits);
    if (ports) {
        const uint32_t w = uint32_t(ports->first) << 16 | ports->second;
        match.test(MPS_W_PORTS, ~0u, w, w);
    }
    return match.step(m, miss);
}

mps_step sel_subflow(std::string_view a, uint16_t pa, std::string_view b, uint16_t pb, uint16_t m,
                     uint16_t miss) {
    return pair_step(a, std::pair{pa, pb}, b, m, miss);
}

mps_step sel_ip_pair(std::string_view a, std::string_view b, uint16_t m, uint16_t miss) {
    return pair_step(a, std::nullopt, b, m, miss);
}

mps_step sel_port(PortDir dir, uint16_t lo, uint16_t hi, uint16_t m, uint16_t miss) {
    return dp::port_match(dir, lo, hi).step(m, miss);
}

mps_step sel_kinds(uint32_t any_of, uint16_t m, uint16_t miss) {
    return dp::kinds_match(any_of).step(m, miss);
}

mps_step sel_token(uint32_t token, uint16_t m, uint16_t miss) {
    mps_step s = step(MPS_SEL_TOKEN, m, miss);
    s.p.token.token = token;
    return s;
}

mps_step sel_seq(mps_seq_kind kind, uint64_t lo, uint64_t hi, uint16_t m, uint16_t miss) {
    mps_step s = step(MPS_SEL_SEQUENCE, m, miss);
    s.p.seq.kind = uint8_t(kind);
    s.p.seq.lo = lo;
    s.p.seq.hi = hi;
    return s;
}

mps_step sel_bytes(mps_bytes_scope scope, uint64_t lo, uint64_t hi, uint16_t m, uint16_t miss) {
    mps_step s = step(MPS_SEL_FLOW_BYTES, m, miss);
    s.p.bytes.scope = uint8_t(scope);
    s.p.bytes.lo = lo;
    s.p.bytes.hi = hi;
    return s;
}

mps_step act_rate(uint64_t bps, uint32_t rtt_us, uint32_t min_window, uint16_t next) {
    mps_step s = step(MPS_ACT_RATE_LIMIT, next);
    s.p.rate.bytes_per_sec = bps;
    s.p.rate.rtt_us = rtt_us;
    s.p.rate.min_window = min_window;
    return s;
}

dp::ChainSet chain_of(std::vector<mps_step> steps) {
    dp::ChainSet cs;
    cs.steps = std::move(steps);
    cs.policies = {"test"};
    for (Hook h : mpsteer::kHooks) cs.entries.push_back({h, "", 0});
    return cs;
}

dp::ChainSet probe(mps_step selector) {
    selector.on_match = 1;
    selector.on_miss = END;
    return chain_of({selector, step(MPS_ACT_DROP)});
}

// ---- flows ----------------------------------------------------------------------------------

mps_flow_key flow_key_of(const Packet& p, bool* from_a) {
    std::array<uint8_t, 16> s{}, d{};
    uint8_t family;
    if (auto* h = std::get_if<Ipv4>(&p.ip)) {
        std::copy(h->src.begin(), h->src.end(), s.begin());
        std::copy(h->dst.begin(), h->dst.end(), d.begin());
        family = 4;
    } else {
        const auto& h6 = std::get<Ipv6>(p.ip);
        s = h6.src;
        d = h6.dst;
        family = 6;
    }
    uint16_t sp = p.tcp.sport, dpt = p.tcp.dport;
    bool src_first = s < d || (s == d && sp <= dpt);
    mps_flow_key k;
    std::memset(&k, 0, sizeof k);
    k.family = family;
    std::memcpy(k.a, src_first ? s.data() : d.data(), 16);
    std::memcpy(k.b, src_first ? d.data() : s.data(), 16);
    k.port_a = src_first ? sp : dpt;
    k.port_b = src_first ? dpt : sp;
    if (from_a) *from_a = src_first;
    return k;
}

// ---- environment ----------------------------------------------------------------------------

PinRoot::PinRoot() {
    static std::atomic<int> n{0};
    path_ = "/sys/fs/bpf/mpsteer-test-" + std::to_string(getpid()) + "-" + std::to_string(n++);
    fs::remove_all(path_);
}

PinRoot::~PinRoot() {
    std::error_code ec;
    fs::remove_all(path_, ec);
}

CpuPin::CpuPin() {
    cpu_set_t old;
    CPU_ZERO(&old);
    if (sched_getaffinity(0, sizeof old, &old) != 0) return;
    int first = -1;
    for (int i = 0; i < CPU_SETSIZE && first < 0; i++)
        if (CPU_ISSET(i, &old)) first = i;
    if (first < 0) return;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(first, &one);
    if (sched_setaffinity(0, sizeof one, &one) == 0) {
        old_.assign(reinterpret_cast<uint8_t*>(&old),
                    reinterpret_cast<uint8_t*>(&old) + sizeof old);
        restored_ = true;
    }
}

CpuPin::~CpuPin() {
    if (restored_) sched_setaffinity(0, old_.size(), reinterpret_cast<cpu_set_t*>(old_.data()));
}

struct Loaded {
    PinRoot root;
    dp::StateMaps state;
    std::shared_ptr<dp::Datapath> datapath;  // the shared load; null: a load per Env
    explicit Loaded(const dp::TableSizes& sizes) : state(dp::StateMaps::open(root.path(), sizes)) {}
};

namespace {
bool one_load() {
    static const bool on = [] {
        const char* v = std::getenv("MPS_BPF_ONE_LOAD");
        return v && std::string_view(v) == "1";
    }();
    return on;
}

// The shared load for these table sizes, emptied of what earlier cases left.
std::shared_ptr<Loaded> shared_load(const dp::TableSizes& sizes) {
    static std::map<uint32_t, std::shared_ptr<Loaded>> loads;  // by sizes.flows
    auto& l = loads[sizes.flows];
    if (!l) {
        l = std::make_shared<Loaded>(sizes);
        l->datapath = dp::Datapath::load(l->state);
    }
    l->datapath->reset();
    // Events earlier cases left in the ring buffer.
    dp::EventReader drain(l->state, [](const dp::Event&) {});
    while (drain.poll(std::chrono::milliseconds(0)) > 0) {}
    return l;
}
}  // namespace

Env::Env(const dp::ChainSet& chains, const dp::TableSizes& sizes) {
    if (one_load()) {
        loaded_ = shared_load(sizes);
        gen_ = dp::Generation::build(loaded_->datapath, chains, 1);
    } else {
        loaded_ = std::make_shared<Loaded>(sizes);
        gen_ = dp::Generation::build(chains, 1, loaded_->state);
    }
    reader_ = std::make_unique<dp::EventReader>(
        loaded_->state, [this](const dp::Event& e) { pending_.push_back(e); });
}

Env::~Env() = default;

const dp::StateMaps& Env::state() const {
    return loaded_->state;
}

void next_clock_tick() {
    usleep(25000);  // two and a half ticks at the slowest HZ (100)
}

Run raw_run(int prog_fd, const Bytes& frame, bool xdp, uint32_t repeat) {
    // Our own BPF_PROG_TEST_RUN rather than dp::test_run: for XDP the kernel copies out from
    // data_meta, and ctx_out.data says how many bytes of metadata to skip (see
    // NOTES-bpf-tests.md, L1).
    Bytes out(frame.size() + 512);
    xdp_md ctx_in{}, ctx_out{};
    LIBBPF_OPTS(bpf_test_run_opts, opts, .data_in = frame.data(), .data_out = out.data(),
                .data_size_in = uint32_t(frame.size()), .data_size_out = uint32_t(out.size()),
                .repeat = int(repeat));
    if (xdp) {
        ctx_in.data_end = uint32_t(frame.size());
        opts.ctx_in = &ctx_in;
        opts.ctx_size_in = sizeof ctx_in;
        opts.ctx_out = &ctx_out;
        opts.ctx_size_out = sizeof ctx_out;
    }
    if (bpf_prog_test_run_opts(prog_fd, &opts) != 0)
        throw std::runtime_error(std::string("BPF_PROG_TEST_RUN: ") + std::strerror(errno));
    out.resize(opts.data_size_out);
    if (xdp) out.erase(out.begin(), out.begin() + ctx_out.data);
    return {opts.retval, std::move(out)};
}

Run Env::run(Hook h, const Bytes& frame, uint32_t repeat) {
    return raw_run(gen_->entry_fd(h), frame, is_xdp(h), repeat);
}

void Env::set_step(uint32_t pc, const mps_step& s) {
    gen_->write_step(pc, s);  // throws when the step's program was not loaded
}

std::optional<mps_flow> Env::flow(const mps_flow_key& k) const {
    mps_flow f;
    if (bpf_map_lookup_elem(state().flows(), &k, &f) != 0) return std::nullopt;
    return f;
}

void Env::put_flow(const mps_flow_key& k, const mps_flow& f) {
    if (bpf_map_update_elem(state().flows(), &k, &f, BPF_ANY) != 0)
        throw std::runtime_error("writing the flow map failed");
}

std::optional<mps_conn> Env::conn(uint32_t token) const {
    mps_conn c;
    if (bpf_map_lookup_elem(state().conns(), &token, &c) != 0) return std::nullopt;
    return c;
}

std::vector<dp::Event> Env::events() {
    while (reader_->poll(std::chrono::milliseconds(0)) > 0) {}
    return std::exchange(pending_, {});
}

dp::StepCounters step_delta(const Snap& a, const Snap& b, size_t pc) {
    dp::StepCounters d;
    d.runs = b.steps.at(pc).runs - a.steps.at(pc).runs;
    d.matched = b.steps.at(pc).matched - a.steps.at(pc).matched;
    d.drops = b.steps.at(pc).drops - a.steps.at(pc).drops;
    d.missed_tail_calls = b.steps.at(pc).missed_tail_calls - a.steps.at(pc).missed_tail_calls;
    return d;
}

bool counted(const mps_step& s) {
    auto p = static_cast<mps_prog>(s.prog);
    return dp::has_program(p) || p == MPS_ACT_PASS || p == MPS_ACT_DROP;
}

uint64_t gen_delta(const Snap& a, const Snap& b, mps_gen_counter c) {
    return b.gen.values[c] - a.gen.values[c];
}

std::string describe_frame(const Bytes& got, const Bytes& want) {
    std::string s = "got (" + std::to_string(got.size()) + " bytes, * = differs):\n" +
                    hexdump(got, want) + "\nwant (" + std::to_string(want.size()) + " bytes):\n" +
                    hexdump(want, got);
    return s;
}

uint64_t wire64(uint64_t v) {
    Bytes b;
    put64(b, v);
    uint64_t w;
    std::memcpy(&w, b.data(), 8);
    return w;
}

static std::array<uint8_t, 32> sha256_be(uint64_t key) {
    Bytes b;
    put64(b, key);
    std::array<uint8_t, 32> h{};
    SHA256(b.data(), b.size(), h.data());
    return h;
}

uint32_t token_of(uint64_t key) {
    auto h = sha256_be(key);
    return get32(h, 0);
}

uint64_t idsn_of(uint64_t key) {
    auto h = sha256_be(key);
    return uint64_t(get32(h, 24)) << 32 | get32(h, 28);
}

}  // namespace mpsteer::test
