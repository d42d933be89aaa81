// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Entry points (files, directories, in-memory sources), diagnostics, number parsers and the
// text forms of the model.
#include <algorithm>
#include <arpa/inet.h>
#include <charconv>
#include <filesystem>
#include <map>

#include <lua5.4/lauxlib.h>
#include <lua5.4/lua.h>

#include "manifest/internal.h"
#include "manifest/policy_files.h"
#include "net/address.h"

namespace mpsteer::manifest {

namespace fs = std::filesystem;

std::string Diagnostic::format() const {
    std::string out = pos.file + ":" + std::to_string(pos.line) + ":" + std::to_string(pos.col) +
                      ": " + (severity == Severity::error ? "error" : "warning") + ": ";
    if (!pointer.empty()) out += pointer + ": ";
    return out + message;
}

namespace {
// Messages may quote the input (yaml-cpp's do): keep them valid UTF-8 so they print as JSON.
void printable(std::string& s) {
    std::string out;
    for (size_t i = 0; i < s.size();) {
        auto c = static_cast<unsigned char>(s[i]);
        size_t len = c < 0x80                   ? 1
                     : (c >= 0xc2 && c <= 0xdf) ? 2
                     : (c >= 0xe0 && c <= 0xef) ? 3
                     : (c >= 0xf0 && c <= 0xf4) ? 4
                                                : 0;
        bool ok = len > 0 && i + len <= s.size();
        for (size_t k = 1; ok && k < len; ++k)
            ok = (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
        if (ok && len == 3) {  // no overlongs or surrogates
            unsigned cp = (c & 0x0fu) << 12 | (s[i + 1] & 0x3fu) << 6 | (s[i + 2] & 0x3fu);
            ok = cp >= 0x800 && (cp < 0xd800 || cp > 0xdfff);
        } else if (ok && len == 4) {
            unsigned cp = (c & 0x07u) << 18 | (s[i + 1] & 0x3fu) << 12 | (s[i + 2] & 0x3fu) << 6 |
                          (s[i + 3] & 0x3fu);
            ok = cp >= 0x10000 && cp <= 0x10ffff;
        }
        if (ok && c >= 0x20 && c != 0x7f)
            out.append(s, i, len);
        else if (ok && len == 1 && c == '\t')
            out += ' ';
        else
            out += '?';
        i += ok ? len : 1;
    }
    s = std::move(out);
}
}  // namespace

void sort_diagnostics(std::vector<Diagnostic>& d) {
    for (auto& x : d) {
        printable(x.message);
        printable(x.pointer);
        printable(x.pos.file);
    }
    auto key = [](const Diagnostic& x) {
        return std::tie(x.pos.file, x.pos.line, x.pos.col, x.severity, x.pointer, x.message);
    };
    std::sort(d.begin(), d.end(), [&](const auto& a, const auto& b) { return key(a) < key(b); });
    d.erase(std::unique(d.begin(), d.end(),
                        [&](const auto& a, const auto& b) { return key(a) == key(b); }),
            d.end());
}

bool Result::ok() const {
    return std::none_of(diagnostics.begin(), diagnostics.end(),
                        [](const Diagnostic& d) { return d.severity == Severity::error; });
}

std::string to_string(const IpAddr& a) {
    return net::address_text(a.family, a.bytes.data());
}

std::optional<IpAddr> parse_ip(std::string_view s) {
    if (s.size() >= INET6_ADDRSTRLEN) return std::nullopt;
    std::string str(s);
    IpAddr a;
    if (inet_pton(AF_INET, str.c_str(), a.bytes.data()) == 1) {
        a.family = 4;
        return a;
    }
    if (inet_pton(AF_INET6, str.c_str(), a.bytes.data()) == 1) {
        a.family = 6;
        return a;
    }
    return std::nullopt;
}

namespace {
// Splits "123.5Mbit" into a decimal number (scaled by 10^6 to stay integral) and a unit.
bool split_number(std::string_view s, uint64_t& micro, std::string_view& unit) {
    size_t i = 0;
    uint64_t whole = 0, frac = 0, scale = 1000000;
    auto digit = [&](char c) { return c >= '0' && c <= '9'; };
    if (s.empty() || !digit(s[0])) return false;
    for (; i < s.size() && digit(s[i]); ++i) {
        if (whole > UINT64_MAX / 10 / 1000000) return false;
        whole = whole * 10 + uint64_t(s[i] - '0');
    }
    if (i < s.size() && s[i] == '.') {
        ++i;
        size_t n = 0;
        for (; i < s.size() && digit(s[i]); ++i, ++n) {
            if (n >= 6) return false;
            scale /= 10;
            frac += uint64_t(s[i] - '0') * scale;
        }
        if (n == 0) return false;
    }
    micro = whole * 1000000 + frac;
    unit = s.substr(i);
    return true;
}
}  // namespace

std::optional<uint64_t> parse_duration_us(std::string_view s) {
    uint64_t micro;
    std::string_view unit;
    if (!split_number(s, micro, unit) || micro % 1000000) return std::nullopt;
    uint64_t n = micro / 1000000, mul;
    if (unit == "us")
        mul = 1;
    else if (unit == "ms")
        mul = 1000;
    else if (unit == "s")
        mul = 1000000;
    else if (unit == "m")
        mul = 60000000;
    else
        return std::nullopt;
    if (n > UINT64_MAX / mul) return std::nullopt;
    return n * mul;
}

std::optional<uint64_t> parse_rate_bytes_per_sec(std::string_view s) {
    uint64_t micro;
    std::string_view unit;
    if (!split_number(s, micro, unit)) return std::nullopt;
    // bits per second need dividing by 8; bytes per second by 1
    uint64_t mul, div;
    if (unit == "bit")
        mul = 1, div = 8;
    else if (unit == "kbit" || unit == "Kbit")
        mul = 1000, div = 8;
    else if (unit == "mbit" || unit == "Mbit")
        mul = 1000000, div = 8;
    else if (unit == "gbit" || unit == "Gbit")
        mul = 1000000000, div = 8;
    else if (unit == "B/s")
        mul = 1, div = 1;
    else if (unit == "KB/s")
        mul = 1000, div = 1;
    else if (unit == "MB/s")
        mul = 1000000, div = 1;
    else if (unit == "GB/s")
        mul = 1000000000, div = 1;
    else
        return std::nullopt;
    // micro * mul / d in 64 bits (no 128-bit integers on 32-bit ARM): split micro at d; the
    // remainder's product stays below d * mul, far from overflow for the schema's units.
    const uint64_t d = div * 1000000;
    uint64_t v;
    if (__builtin_mul_overflow(micro / d, mul, &v) ||
        __builtin_add_overflow(v, micro % d * mul / d, &v))
        return std::nullopt;
    return v;
}

std::string_view to_string(Action::Kind k) {
    switch (k) {
#define MPS_ACTION_NAME(k) \
    case Action::Kind::k: return #k;
        MPS_ACTION_KINDS(MPS_ACTION_NAME)
#undef MPS_ACTION_NAME
    case Action::Kind::ref: return "action_chain";
    }
    return "?";
}

std::optional<Action::Kind> action_kind(std::string_view key) {
    constexpr Action::Kind kinds[] = {
#define MPS_ACTION_ENUM(k) Action::Kind::k,
        MPS_ACTION_KINDS(MPS_ACTION_ENUM)
#undef MPS_ACTION_ENUM
            Action::Kind::ref};
    for (auto k : kinds)
        if (to_string(k) == key) return k;
    return std::nullopt;
}

// Where each actor makes sense (documented in schemas/README.md):
// - no_subflows changes the SYN/ACK this host sends: tc_egress.
// - set_backup adds MP_PRIO to pure ACKs: those this host sends (tc_egress: the peer stops
//   sending on the subflow) or receives (xdp: this host's own scheduler does).
// - blk_subflow hides ADD_ADDR from this host's stack: ingress (xdp, tc_ingress).
// - add_subflow re-injects an address into the stack by cloning a packet back into a TC hook
//   (bpf_clone_redirect): tc_ingress only, XDP has no clone.
// - redirect sends a packet out of another interface: xdp (forwarding) and tc_egress; at
//   tc_ingress the packet is already past the XDP hook meant for that.
// - reject answers a SYN with a reset sent back through the same interface with bpf_redirect
//   (tc_egress: into this host's stack; tc_ingress: out to the sender): TC only.
// - the rest observe, count, drop or rewrite the window and run anywhere.
std::vector<Hook> allowed_hooks(Action::Kind k) {
    using enum Hook;
    switch (k) {
    case Action::Kind::set_backup: return {xdp, tc_egress};
    case Action::Kind::no_subflows: return {tc_egress};
    case Action::Kind::blk_subflow: return {xdp, tc_ingress};
    case Action::Kind::add_subflow: return {tc_ingress};
    case Action::Kind::redirect: return {xdp, tc_egress};
    case Action::Kind::reject: return {tc_egress, tc_ingress};
    default: return {xdp, tc_egress, tc_ingress};
    }
}

bool ends_chain(Action::Kind k) {
    return k == Action::Kind::pass || k == Action::Kind::drop || k == Action::Kind::reject;
}

bool applicable(Action::Kind k, Hook h) {
    auto hooks = allowed_hooks(k);
    return std::find(hooks.begin(), hooks.end(), h) != hooks.end();
}

size_t Selector::leaves() const {
    if (children.empty()) return 1;
    size_t n = 0;
    for (const auto& c : children) n += c.leaves();
    return n;
}

size_t Policy::steps() const {
    size_t n = actions.size();
    for (const auto& s : select) n += s.leaves();
    return n;
}

namespace {
// A value, or an inclusive range "lo-hi".
std::string port_text(uint16_t lo, uint16_t hi) {
    return lo == hi ? std::to_string(lo) : std::to_string(lo) + "-" + std::to_string(hi);
}
std::string range_text(uint64_t lo, uint64_t hi) {
    return "[" + std::to_string(lo) + ", " + (hi == UINT64_MAX ? "inf" : std::to_string(hi)) + ")";
}
}  // namespace

std::string Selector::describe() const {
    auto list = [&](const char* name) {
        std::string s = std::string(name) + "(";
        for (size_t i = 0; i < children.size(); ++i) s += (i ? ", " : "") + children[i].describe();
        return s + ")";
    };
    switch (kind) {
    case Kind::src: return "src " + to_string(addr) + "/" + std::to_string(prefix);
    case Kind::dst: return "dst " + to_string(addr) + "/" + std::to_string(prefix);
    case Kind::ip_pair: return "ip_pair " + to_string(a) + " <-> " + to_string(b);
    case Kind::subflow:
        return "subflow " + to_string(a) + "." + std::to_string(port_a) + " <-> " + to_string(b) +
               "." + std::to_string(port_b);
    case Kind::port:
        return std::string("port ") +
               (dir == PortDir::src   ? "src "
                : dir == PortDir::dst ? "dst "
                                      : "either ") +
               port_text(port_lo, port_hi);
    case Kind::ttl: return "ttl " + port_text(ip_lo, ip_hi);
    case Kind::dscp: return "dscp " + port_text(ip_lo, ip_hi);
    case Kind::packet_type: {
        std::string s = "packet_type ";
        for (size_t i = 0; i < packet_types.size(); ++i) s += (i ? "|" : "") + packet_types[i];
        return s;
    }
    case Kind::token: {
        char buf[16];
        snprintf(buf, sizeof buf, "0x%08x", token);
        return std::string("token ") + buf;
    }
    case Kind::sequence:
        return std::string("sequence ") + (seq_kind == SeqKind::data ? "data " : "subflow ") +
               range_text(lo, hi);
    case Kind::flow_bytes:
        return std::string("flow_bytes ") +
               (scope == BytesScope::connection ? "connection " : "subflow ") + range_text(lo, hi);
    case Kind::any: return list("any");
    case Kind::all: return list("all");
    case Kind::not_: return list("not");
    case Kind::ref: return "selector_set " + ref;
    }
    return "?";
}

std::string Action::describe() const {
    std::string s(to_string(kind));
    switch (kind) {
    case Kind::rate_limit:
        s += " " + std::to_string(rate_bytes_per_sec) + "B/s rtt " + std::to_string(rtt_us) +
             "us min_window " + std::to_string(min_window);
        break;
    case Kind::set_backup:
        s += std::string(backup ? " backup" : " no-backup") + (once ? " once" : " every-packet");
        break;
    case Kind::add_subflow:
        if (after_bytes) s += " after " + std::to_string(*after_bytes) + " bytes";
        break;
    case Kind::redirect: s += " " + interface; break;
    case Kind::ref: s = "action_chain " + ref; break;
    default: break;
    }
    return s;
}

namespace {

bool manifest_name(const std::string& name) {
    auto ext = fs::path(name).extension();
    return ext == ".yaml" || ext == ".yml";
}

// Where a policy's script must resolve: the repository root the caller names, else the
// nearest directory above the manifest with a .git entry, else the directory given.
fs::path script_root(const Options& opts, const std::string& manifest, const fs::path& given) {
    std::error_code ec;
    if (!opts.repo_root.empty()) return fs::absolute(opts.repo_root, ec).lexically_normal();
    for (fs::path dir = fs::absolute(manifest, ec).parent_path();; dir = dir.parent_path()) {
        if (fs::exists(dir / ".git", ec)) return dir.lexically_normal();
        if (dir == dir.parent_path()) break;
    }
    return fs::absolute(given, ec).lexically_normal();
}

// Why a script's text does not compile as the sandbox loads it (Lua 5.4, text only), or
// nullopt. Compiling runs none of it; the parser bounds its own recursion, and its memory is
// capped here.
std::optional<std::string> compile_error(const std::string& script, const std::string& source) {
    constexpr size_t kMaxCompileBytes = 64 << 20;
    size_t used = 0;
    lua_Alloc capped = [](void* ud, void* ptr, size_t osize, size_t nsize) -> void* {
        size_t& in_use = *static_cast<size_t*>(ud);
        const size_t old = ptr ? osize : 0;  // without ptr, osize is the kind of object
        if (nsize == 0) {
            in_use -= old;
            free(ptr);
            return nullptr;
        }
        if (nsize > old && in_use + (nsize - old) > kMaxCompileBytes) return nullptr;
        void* p = realloc(ptr, nsize);
        if (p) in_use = in_use - old + nsize;
        return p;
    };
    lua_State* L = lua_newstate(capped, &used);
    if (!L) return "cannot be compiled: out of memory";
    std::optional<std::string> error;
    const std::string chunkname = "@" + script;  // messages say "lua/x.lua:LINE:"
    if (luaL_loadbufferx(L, source.data(), source.size(), chunkname.c_str(), "t") != LUA_OK) {
        const char* message = lua_tostring(L, -1);
        error = message ? message : "unknown error";
    }
    lua_close(L);
    return error;
}

// Scripts are found and read here, with the manifests and through the same rule
// (policy_files.h): the Lua host runs exactly the bytes validated, never a path that may have
// changed since. One reader per repository root, every one counting against the revision's
// byte cap. Only what lies beneath the root is looked at: a path that leads out of it gives
// the same answer whether or not its target exists.
class ScriptFiles {
public:
    ScriptFiles(const Options& opts, const std::map<std::string, fs::path>& given_for_file,
                size_t& revision_bytes)
        : opts_(opts), given_for_file_(given_for_file), revision_bytes_(revision_bytes) {}

    std::optional<detail::ScriptFile> read(const std::string& manifest, const std::string& script,
                                           std::string& why) {
        auto given = given_for_file_.find(manifest);
        fs::path root = script_root(
            opts_, manifest,
            given == given_for_file_.end() ? fs::path(manifest).parent_path() : given->second);
        std::error_code ec;
        fs::path dir = fs::absolute(manifest, ec).parent_path().lexically_normal();
        dir = dir.lexically_relative(root);
        if (dir.empty() || *dir.begin() == "..") {
            why = "is not looked up: the manifest is outside the repository " + root.string();
            return std::nullopt;
        }
        try {
            auto& tree = trees_[root.string()];
            if (!tree) tree = std::make_unique<PolicyTree>(root.string(), "", &revision_bytes_);
            // Next to the manifest, then each directory above it up to the root.
            for (dir = dir == "." ? fs::path() : dir;; dir = dir.parent_path()) {
                const std::string rel = (dir / script).lexically_normal().string();
                if (tree->present(rel)) {
                    std::vector<Diagnostic> read_diags;
                    if (auto text = tree->read(rel, read_diags)) {
                        if (auto error = compile_error(script, *text)) {
                            why = "does not compile: " + *error;
                            return std::nullopt;
                        }
                        return detail::ScriptFile{(root / rel).string(), std::move(*text)};
                    }
                    why = read_diags.empty() ? "cannot be read" : read_diags.front().message;
                    return std::nullopt;
                }
                if (dir.empty()) break;
            }
        } catch (const std::exception& e) {
            why = "cannot be read: " + std::string(e.what());
            return std::nullopt;
        }
        why = "not found next to the manifest or in a parent directory up to the repository root";
        return std::nullopt;
    }

private:
    const Options& opts_;
    const std::map<std::string, fs::path>& given_for_file_;
    size_t& revision_bytes_;
    std::map<std::string, std::unique_ptr<PolicyTree>> trees_;
};

Result load(const std::vector<std::pair<std::string, std::string>>& sources, const Options& opts,
            ScriptFiles& scripts) {
    std::vector<Diagnostic> diags;
    std::vector<detail::Doc> docs;
    std::vector<std::string> files;
    // Sorted by name so that "first defined" and every other order-dependent answer is the
    // same whatever order the caller lists the files in.
    auto sorted = sources;
    std::stable_sort(sorted.begin(), sorted.end(),
                     [](const auto& a, const auto& b) { return a.first < b.first; });
    size_t documents = 0;
    detail::ExpansionBudget budget;
    for (const auto& [name, text] : sorted) {
        files.push_back(name);
        // Each document is bounded (alias expansion included); so are their number and, across
        // files, the nodes and bytes they expand to.
        const size_t n = count_documents(text);
        if (n > kMaxDocumentsPerFile || documents + n > kMaxDocuments) {
            diags.push_back({Severity::error,
                             {name, 0, 0},
                             "",
                             n > kMaxDocumentsPerFile
                                 ? "more than " + std::to_string(kMaxDocumentsPerFile) +
                                       " YAML documents in one file; not parsed"
                                 : "more than " + std::to_string(kMaxDocuments) +
                                       " YAML documents in the policy directory; not parsed"});
            continue;
        }
        documents += n;
        auto d = detail::parse_yaml(name, text, diags, budget);
        for (auto& x : d) docs.push_back(std::move(x));
    }
    detail::ScriptReader reader;
    if (opts.check_scripts)
        reader = [&scripts](const std::string& manifest, const std::string& script,
                            std::string& why) { return scripts.read(manifest, script, why); };
    return detail::load_docs(std::move(docs), std::move(diags), std::move(files), opts, reader);
}

}  // namespace

Result load_sources(const std::vector<std::pair<std::string, std::string>>& sources,
                    const Options& opts) {
    size_t revision_bytes = 0;
    const std::map<std::string, fs::path> given_for_file;
    ScriptFiles scripts(opts, given_for_file, revision_bytes);
    return load(sources, opts, scripts);
}

Result load_paths(const std::vector<std::string>& paths, const Options& opts) {
    std::vector<Diagnostic> diags;
    std::vector<std::pair<std::string, std::string>> sources;
    std::map<std::string, fs::path> given_for_file;
    size_t revision_bytes = 0;  // manifests and scripts together: one revision
    for (const auto& p : paths) {
        // Everything is read through a PolicyTree: a directory's, or a file's parent's.
        std::error_code ec;
        fs::path arg(p);
        const bool dir = fs::is_directory(arg, ec);
        if (!dir && !fs::exists(fs::symlink_status(arg, ec))) {
            diags.push_back({Severity::error, {p, 0, 0}, "", "no such file or directory"});
            continue;
        }
        fs::path base = dir ? arg : arg.parent_path().empty() ? fs::path(".") : arg.parent_path();
        try {
            PolicyTree tree(base.string(), dir ? p : arg.parent_path().string(), &revision_bytes);
            std::vector<std::string> rels;
            if (dir) {
                rels = tree.list(manifest_name, diags);
                tree.ownership_warnings(diags);
            } else {
                rels = {arg.filename().string()};
            }
            for (const auto& rel : rels) {
                auto name = tree.display(rel);
                if (given_for_file.count(name)) continue;
                given_for_file.emplace(name, base);
                if (auto text = tree.read(rel, diags)) sources.emplace_back(name, std::move(*text));
            }
        } catch (const std::exception& e) {
            diags.push_back(
                {Severity::error, {p, 0, 0}, "", std::string("cannot read: ") + e.what()});
        }
    }
    ScriptFiles scripts(opts, given_for_file, revision_bytes);
    Result r = load(sources, opts, scripts);
    r.diagnostics.insert(r.diagnostics.end(), diags.begin(), diags.end());
    sort_diagnostics(r.diagnostics);
    cap_diagnostics(r.diagnostics);
    r.files.clear();
    for (const auto& [name, given] : given_for_file) r.files.push_back(name);
    return r;
}

}  // namespace mpsteer::manifest
