// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// YAML -> typed JSON. yaml-cpp hands every scalar over as a string; JSON Schema needs types,
// so plain scalars are resolved with the YAML 1.2 core schema (null, bool, int, float), quoted
// ones stay strings, and each node's position is remembered by JSON pointer for error
// positions (1-based line, column in code points).
#include <charconv>
#include <cmath>
#include <functional>
#include <map>
#include <optional>
#include <regex>
#include <sstream>
#include <utility>

#include <yaml-cpp/eventhandler.h>
#include <yaml-cpp/yaml.h>

#include "manifest/internal.h"

namespace mpsteer::manifest::detail {

std::string pointer_escape(const std::string& key) {
    std::string out;
    for (char c : key) {
        if (c == '~')
            out += "~0";
        else if (c == '/')
            out += "~1";
        else
            out += c;
    }
    return out;
}
std::string pointer_join(const std::string& base, const std::string& key) {
    return base + "/" + pointer_escape(key);
}
std::string pointer_join(const std::string& base, size_t index) {
    return base + "/" + std::to_string(index);
}

Position Doc::at(const std::string& pointer) const {
    std::string p = pointer;
    for (;;) {
        if (auto it = value_pos.find(p); it != value_pos.end()) return it->second;
        auto slash = p.rfind('/');
        if (slash == std::string::npos) return root;
        p.resize(slash);
    }
}
Position Doc::key_at(const std::string& pointer) const {
    if (auto it = key_pos.find(pointer); it != key_pos.end()) return it->second;
    return at(pointer);
}

namespace {

// Strict UTF-8 (no overlongs, surrogates or code points above U+10FFFF). valijson and
// nlohmann's dump() both misbehave on invalid sequences, so they never get past here.
bool valid_utf8(const std::string& s) {
    size_t i = 0, n = s.size();
    while (i < n) {
        auto c = static_cast<unsigned char>(s[i]);
        size_t len;
        uint32_t cp;
        if (c < 0x80) {
            ++i;
            continue;
        }
        if (c >= 0xc2 && c <= 0xdf)
            len = 2, cp = c & 0x1f;
        else if (c >= 0xe0 && c <= 0xef)
            len = 3, cp = c & 0x0f;
        else if (c >= 0xf0 && c <= 0xf4)
            len = 4, cp = c & 0x07;
        else
            return false;
        if (i + len > n) return false;
        for (size_t k = 1; k < len; ++k) {
            auto cc = static_cast<unsigned char>(s[i + k]);
            if ((cc & 0xc0) != 0x80) return false;
            cp = cp << 6 | (cc & 0x3f);
        }
        if ((len == 3 && (cp < 0x800 || (cp >= 0xd800 && cp <= 0xdfff))) ||
            (len == 4 && (cp < 0x10000 || cp > 0x10ffff)))
            return false;
        i += len;
    }
    return true;
}

// The file's text by line, to turn yaml-cpp's marks (0-based line, byte column) into
// positions an editor shows (1-based line, column in code points), and to find things the
// marks do not point at (the `-` of an empty sequence item).
struct Lines {
    std::string_view text;
    std::vector<size_t> starts;  // byte offset of each line
    explicit Lines(std::string_view t) : text(t) {
        // yaml-cpp does not count a leading byte order mark in the first line's columns.
        starts.push_back(t.starts_with("\xef\xbb\xbf") ? 3 : 0);
        for (size_t i = 0; i < t.size(); ++i)
            if (t[i] == '\n') starts.push_back(i + 1);
    }
    std::string_view line(size_t n) const {
        if (n >= starts.size()) return {};
        size_t end = text.find('\n', starts[n]);
        return text.substr(starts[n],
                           (end == std::string_view::npos ? text.size() : end) - starts[n]);
    }
    // Code points before byte column `col` of line `n`, plus one.
    int column(size_t n, size_t col) const {
        auto l = line(n);
        int cp = 1;
        for (size_t i = 0; i < std::min(col, l.size()); ++i)
            if ((static_cast<unsigned char>(l[i]) & 0xc0) != 0x80) ++cp;
        return cp + int(col > l.size() ? col - l.size() : 0);
    }
    char at(size_t n, size_t col) const {
        auto l = line(n);
        return col < l.size() ? l[col] : '\0';
    }
};

// YAML allows tab, line feed, carriage return and printable characters only (c-printable);
// anything else is reported where it is, before the parser sees it.
bool check_characters(const std::string& file, const Lines& lines, std::vector<Diagnostic>& diags) {
    constexpr size_t kMaxReported = 10;
    size_t reported = 0;
    for (size_t n = 0; n < lines.starts.size() && reported < kMaxReported; ++n) {
        std::string_view l = lines.line(n);
        size_t i = 0;
        while (i < l.size() && reported < kMaxReported) {
            auto c = static_cast<unsigned char>(l[i]);
            size_t len = c < 0x80                   ? 1
                         : (c >= 0xc2 && c <= 0xdf) ? 2
                         : (c >= 0xe0 && c <= 0xef) ? 3
                         : (c >= 0xf0 && c <= 0xf4) ? 4
                                                    : 0;
            if (len == 0 || !valid_utf8(std::string(l.substr(i, len)))) {
                char hex[8];
                snprintf(hex, sizeof hex, "0x%02x", c);
                diags.push_back({Severity::error,
                                 {file, int(n) + 1, lines.column(n, i)},
                                 "",
                                 std::string("invalid UTF-8 (byte ") + hex + ")"});
                ++reported;
                ++i;
                continue;
            }
            uint32_t cp = len == 1   ? c
                          : len == 2 ? (c & 0x1fu) << 6 | (l[i + 1] & 0x3fu)
                          : len == 3
                              ? (c & 0x0fu) << 12 | (l[i + 1] & 0x3fu) << 6 | (l[i + 2] & 0x3fu)
                              : 0x10000;  // beyond the BMP: all printable
            bool printable = cp == '\t' || cp == '\r' || (cp >= 0x20 && cp != 0x7f && cp < 0x80) ||
                             cp == 0x85 || (cp >= 0xa0 && cp != 0xfffe && cp != 0xffff);
            if (!printable) {
                char name[16];
                snprintf(name, sizeof name, "U+%04X", cp);
                diags.push_back({Severity::error,
                                 {file, int(n) + 1, lines.column(n, i)},
                                 "",
                                 std::string("control character ") + name +
                                     " (YAML allows tab, line feed and carriage return only; "
                                     "write it as an escape in a double-quoted string)"});
                ++reported;
            }
            i += len;
        }
    }
    return reported == 0;
}

struct Stop {};  // thrown out of the parser once a document is over a limit

// Builds typed JSON from yaml-cpp's parse events. Events (rather than YAML::Node) give the
// position of an alias where it is used, and keep the document loop in our hands: yaml-cpp
// 0.7 produces empty documents forever at a ',' where a document would start (`,` or
// `'x', y`), which shows here as a document starting where the previous one did.
struct Builder : YAML::EventHandler {
    const std::string& file;
    const Lines& lines;
    std::vector<Diagnostic>& diags;

    struct Frame {
        bool map = false;
        nlohmann::json value;
        std::string ptr;
        YAML::Mark mark;
        YAML::anchor_t anchor = 0;
        size_t nodes_at_start = 0;
        size_t content_at_start = 0;
        size_t items = 0;       // sequence: index of the next item
        bool have_key = false;  // map: a key is waiting for its value
        std::string key;
        Position key_pos;
        bool skip_value = false;  // map: the key was rejected; drop its value
    };
    struct Anchored {
        nlohmann::json value;
        size_t nodes = 0;
        size_t bytes = 0;
        size_t depth = 0;
    };

    Doc doc;
    std::vector<Frame> stack;
    std::map<YAML::anchor_t, Anchored> anchors;  // complete anchored nodes of this document
    size_t skipping = 0;  // > 0: inside a collection that is being dropped (a complex key)
    size_t nodes = 0;
    size_t content = 0;  // bytes of keys and scalars, aliases expanded
    size_t bytes = 0;    // the same, and the paths positions are kept by
    bool failed = false, depth_reported = false;
    std::optional<nlohmann::json> root;

    ExpansionBudget& budget;  // left for the whole load

    Builder(const std::string& f, const Lines& l, std::vector<Diagnostic>& d, ExpansionBudget& b)
        : file(f), lines(l), diags(d), budget(b) {}

    Position pos(const YAML::Mark& m) const {
        if (m.is_null()) return {file, 1, 1};
        return {file, m.line + 1, lines.column(size_t(m.line), size_t(m.column))};
    }
    void error(const Position& p, const std::string& ptr, std::string msg) {
        diags.push_back({Severity::error, p, ptr.empty() ? "/" : ptr, std::move(msg)});
        failed = true;
    }

    // YAML 1.2 core schema resolution of a plain scalar.
    nlohmann::json resolve_plain(const std::string& s, const Position& p, const std::string& ptr) {
        if (s.empty() || s == "~" || s == "null" || s == "Null" || s == "NULL") return nullptr;
        if (s == "true" || s == "True" || s == "TRUE") return true;
        if (s == "false" || s == "False" || s == "FALSE") return false;
        if (auto i = resolve_int(s, p, ptr)) return *i;
        static const std::regex float_re(
            R"(^[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?$)");
        if (std::regex_match(s, float_re)) {
            double d = std::strtod(s.c_str(), nullptr);
            if (!std::isfinite(d)) {
                error(p, ptr, "number '" + s + "' is out of range");
                return nullptr;
            }
            return d;
        }
        if (s == ".inf" || s == ".Inf" || s == ".INF" || s == "+.inf" || s == "+.Inf" ||
            s == "+.INF" || s == "-.inf" || s == "-.Inf" || s == "-.INF" || s == ".nan" ||
            s == ".NaN" || s == ".NAN") {
            error(p, ptr, "infinity and NaN are not accepted in manifests");
            return nullptr;
        }
        return s;
    }

    std::optional<nlohmann::json> resolve_int(const std::string& s, const Position& p,
                                              const std::string& ptr) {
        // [-+]?[0-9]+ | 0o[0-7]+ | 0x[0-9a-fA-F]+
        int base = 10;
        std::string_view digits = s;
        bool neg = false;
        if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'o')) {
            base = s[1] == 'x' ? 16 : 8;
            digits.remove_prefix(2);
        } else if (!s.empty() && (s[0] == '-' || s[0] == '+')) {
            neg = s[0] == '-';
            digits.remove_prefix(1);
        }
        if (digits.empty()) return std::nullopt;
        for (char c : digits) {
            bool ok = base == 16  ? std::isxdigit(static_cast<unsigned char>(c)) != 0
                      : base == 8 ? (c >= '0' && c <= '7')
                                  : (c >= '0' && c <= '9');
            if (!ok) return std::nullopt;
        }
        uint64_t v = 0;
        auto r = std::from_chars(digits.data(), digits.data() + digits.size(), v, base);
        if (r.ec != std::errc{} || (neg && v > uint64_t(INT64_MAX) + 1)) {
            error(p, ptr,
                  "integer '" + s + "' does not fit in 64 bits (" + std::to_string(INT64_MIN) +
                      " to " + std::to_string(UINT64_MAX) + ")");
            return nlohmann::json(nullptr);
        }
        if (neg) return nlohmann::json(v == uint64_t(INT64_MAX) + 1 ? INT64_MIN : -int64_t(v));
        if (v <= uint64_t(INT64_MAX)) return nlohmann::json(int64_t(v));
        return nlohmann::json(v);
    }

    nlohmann::json scalar(const std::string& s, const std::string& tag, const Position& p,
                          const std::string& ptr) {
        if (s.size() > kMaxScalar) {
            error(p, ptr, "scalar longer than " + std::to_string(kMaxScalar) + " bytes");
            return "";
        }
        if (!valid_utf8(s)) {  // the text is valid; an escape in a double-quoted string is not
            error(p, ptr, "invalid UTF-8");
            return "";
        }
        if (tag == "?") return resolve_plain(s, p, ptr);
        if (tag == "!" || tag == "tag:yaml.org,2002:str") return s;
        if (tag == "tag:yaml.org,2002:null") return nullptr;
        if (tag == "tag:yaml.org,2002:bool" || tag == "tag:yaml.org,2002:int" ||
            tag == "tag:yaml.org,2002:float") {
            nlohmann::json v = resolve_plain(s, p, ptr);
            bool ok = tag.ends_with("bool")  ? v.is_boolean()
                      : tag.ends_with("int") ? v.is_number_integer()
                                             : v.is_number();
            if (!ok) error(p, ptr, "'" + s + "' is not a valid " + tag.substr(18));
            return v;
        }
        error(p, ptr,
              valid_utf8(tag) && tag.size() < 64 ? "unsupported tag '" + tag + "'"
                                                 : std::string("unsupported tag"));
        return s;
    }

    // ---- where a new node goes ----------------------------------------------------------

    struct Slot {
        bool is_key = false;  // the node is a mapping key
        bool drop = false;    // the node is discarded (a rejected key's value)
        std::string ptr;
        Position pos;
    };

    // The `-` of an empty block sequence item: yaml-cpp marks the empty node at the next
    // token, which may be the next key several lines down.
    Position dash_before(const Frame& seq, const YAML::Mark& m) const {
        if (seq.mark.is_null() || m.is_null()) return pos(m);
        for (int n = m.line; n >= seq.mark.line; --n) {
            size_t col = size_t(seq.mark.column);
            if (n == m.line && col >= size_t(m.column)) continue;
            auto l = lines.line(size_t(n));
            if (lines.at(size_t(n), col) != '-') continue;
            char after = lines.at(size_t(n), col + 1);
            bool only_space_before = l.substr(0, std::min(col, l.size())).find_first_not_of(" -") ==
                                     std::string_view::npos;
            if ((after == '\0' || after == ' ' || after == '\t' || after == '\r') &&
                only_space_before)
                return {file, n + 1, lines.column(size_t(n), col)};
        }
        return pos(m);
    }

    Slot slot(const YAML::Mark& m, bool null_node) {
        Slot s;
        s.pos = pos(m);
        if (stack.empty()) return s;
        Frame& f = stack.back();
        if (!f.map) {
            s.ptr = pointer_join(f.ptr, f.items++);
            if (null_node) s.pos = dash_before(f, m);
            return s;
        }
        if (!f.have_key) {
            s.is_key = true;
            return s;
        }
        f.have_key = false;
        s.drop = std::exchange(f.skip_value, false);
        s.ptr = pointer_join(f.ptr, f.key);
        if (null_node) s.pos = f.key_pos;  // "key:" with nothing after: point at the key
        return s;
    }

    bool key(const Slot& s, const nlohmann::json* k) {
        Frame& f = stack.back();
        f.have_key = true;
        f.key_pos = s.pos;
        if (!k || !k->is_string()) {
            error(s.pos, f.ptr, "mapping keys must be plain strings");
            f.skip_value = true;
            return false;
        }
        const std::string& name = k->get_ref<const std::string&>();
        std::string child = pointer_join(f.ptr, name);
        if (f.value.contains(name)) {
            error(s.pos, child,
                  "duplicate key '" + name + "' (first defined at line " +
                      std::to_string(doc.key_pos[child].line) + ")");
            f.skip_value = true;
            return false;
        }
        f.key = name;
        charge(s, child, 0, child.size());
        doc.key_pos.emplace(child, s.pos);
        return true;
    }

    // Counts the bytes of keys and scalars a node brings (all of an aliased node's), before
    // they are copied: an alias of a long scalar costs one node but its bytes every time. The
    // JSON pointer a position is kept by counts too: long keys nested deep make every path
    // below them long.
    void charge(const Slot& s, const std::string& ptr, size_t content_bytes, size_t path_bytes) {
        content += content_bytes;
        const size_t n = content_bytes + path_bytes;
        bytes += n;
        if (bytes > kMaxDocumentBytes) {
            error(s.pos, ptr,
                  "document too large (more than " + std::to_string(kMaxDocumentBytes) +
                      " bytes of keys, scalars and their paths after alias expansion)");
            throw Stop{};
        }
        if (n > budget.bytes) {
            error(s.pos, ptr,
                  "the policy documents together expand to more than " +
                      std::to_string(kMaxRevisionExpandedBytes) +
                      " bytes of keys, scalars and their paths (aliases included); not used");
            throw Stop{};
        }
        budget.bytes -= n;
    }

    // Counts the node and its bytes and checks depth; false when over a limit.
    bool admit(const Slot& s, size_t count, size_t depth, size_t node_bytes) {
        nodes += count;
        if (nodes > kMaxNodes) {
            error(s.pos, s.ptr,
                  "document too large (more than " + std::to_string(kMaxNodes) +
                      " nodes after alias expansion)");
            throw Stop{};
        }
        if (count > budget.nodes) {
            error(s.pos, s.ptr,
                  "the policy documents together expand to more than " +
                      std::to_string(kMaxRevisionNodes) + " nodes (aliases included); not used");
            throw Stop{};
        }
        budget.nodes -= count;
        charge(s, s.ptr, node_bytes, s.drop ? 0 : s.ptr.size());
        if (stack.size() + depth > kMaxDepth) {
            if (!std::exchange(depth_reported, true))
                error(s.pos, s.ptr, "nesting deeper than " + std::to_string(kMaxDepth) + " levels");
            failed = true;
            return false;
        }
        return true;
    }

    void put(const Slot& s, nlohmann::json v) {
        if (s.drop) return;
        doc.value_pos.emplace(s.ptr, s.pos);
        if (stack.empty()) {
            root = std::move(v);
            doc.root = s.pos;
            return;
        }
        Frame& f = stack.back();
        if (f.map)
            f.value[f.key] = std::move(v);
        else
            f.value.push_back(std::move(v));
    }

    void remember(YAML::anchor_t a, const nlohmann::json& v, size_t count, size_t node_bytes) {
        if (!a) return;
        size_t depth = 0;
        std::function<void(const nlohmann::json&, size_t)> walk = [&](const nlohmann::json& j,
                                                                      size_t d) {
            depth = std::max(depth, d);
            if (j.is_structured())
                for (const auto& c : j) walk(c, d + 1);
        };
        walk(v, 0);
        anchors[a] = {v, count, node_bytes, depth};
    }

    // ---- events -------------------------------------------------------------------------

    YAML::Mark start_mark;
    void OnDocumentStart(const YAML::Mark& m) override { start_mark = m; }
    void OnDocumentEnd() override {}

    void OnNull(const YAML::Mark& m, YAML::anchor_t a) override {
        if (skipping) return;
        Slot s = slot(m, true);
        if (s.is_key) return void(key(s, nullptr));
        if (!admit(s, 1, 0, 0)) return;
        remember(a, nullptr, 1, 0);
        put(s, nullptr);
    }

    void OnAlias(const YAML::Mark& m, YAML::anchor_t a) override {
        if (skipping) return;
        Slot s = slot(m, false);
        auto it = anchors.find(a);
        if (it == anchors.end()) {  // yaml-cpp knows the anchor: it is still open
            if (s.is_key)
                key(s, nullptr);
            else
                error(s.pos, s.ptr, "alias refers to a node that contains it (recursive alias)");
            return;
        }
        if (s.is_key) {
            if (it->second.value.is_string()) charge(s, stack.back().ptr, it->second.bytes, 0);
            return void(key(s, &it->second.value));
        }
        if (!admit(s, it->second.nodes, it->second.depth, it->second.bytes)) return;
        // Nothing inside gets a position of its own: problems there are shown at the alias.
        put(s, it->second.value);
    }

    void OnScalar(const YAML::Mark& m, const std::string& tag, YAML::anchor_t a,
                  const std::string& value) override {
        if (skipping) return;
        Slot s = slot(m, false);
        if (s.is_key) {
            // A key is the text as written, whatever it looks like (`80: x` names "80").
            if (value.size() > kMaxScalar || !valid_utf8(value)) {
                error(s.pos, stack.back().ptr, "invalid mapping key (not UTF-8, or too long)");
                stack.back().have_key = true;
                stack.back().skip_value = true;
                return;
            }
            charge(s, stack.back().ptr, value.size(), 0);
            nlohmann::json k = value;
            remember(a, k, 0, value.size());
            return void(key(s, &k));
        }
        if (!admit(s, 1, 0, value.size())) return;
        nlohmann::json v = scalar(value, tag, s.pos, s.ptr);
        remember(a, v, 1, value.size());
        put(s, std::move(v));
    }

    void start(const YAML::Mark& m, YAML::anchor_t a, bool map) {
        if (skipping) return void(++skipping);
        Slot s = slot(m, false);
        if (s.is_key) {
            key(s, nullptr);
            skipping = 1;
            return;
        }
        if (!admit(s, 1, 0, 0)) {
            skipping = 1;
            return;
        }
        if (s.drop) {
            skipping = 1;
            return;
        }
        doc.value_pos.emplace(s.ptr, s.pos);
        if (stack.empty()) doc.root = s.pos;
        Frame f;
        f.map = map;
        f.value = map ? nlohmann::json::object() : nlohmann::json::array();
        f.ptr = s.ptr;
        f.mark = m;
        f.anchor = a;
        f.nodes_at_start = nodes - 1;
        f.content_at_start = content;
        stack.push_back(std::move(f));
    }

    void end() {
        if (skipping) return void(--skipping);
        Frame f = std::move(stack.back());
        stack.pop_back();
        remember(f.anchor, f.value, nodes - f.nodes_at_start, content - f.content_at_start);
        if (stack.empty()) {
            root = std::move(f.value);
            return;
        }
        Frame& parent = stack.back();
        if (parent.map)
            parent.value[parent.key] = std::move(f.value);
        else
            parent.value.push_back(std::move(f.value));
    }

    void OnSequenceStart(const YAML::Mark& m, const std::string& tag, YAML::anchor_t a,
                         YAML::EmitterStyle::value) override {
        check_collection_tag(m, tag, "seq");
        start(m, a, false);
    }
    void OnSequenceEnd() override { end(); }
    void OnMapStart(const YAML::Mark& m, const std::string& tag, YAML::anchor_t a,
                    YAML::EmitterStyle::value) override {
        check_collection_tag(m, tag, "map");
        start(m, a, true);
    }
    void OnMapEnd() override { end(); }

    void check_collection_tag(const YAML::Mark& m, const std::string& tag, const char* kind) {
        if (skipping || tag == "?" || tag == "!" || tag == std::string("tag:yaml.org,2002:") + kind)
            return;
        error(pos(m), stack.empty() ? "" : stack.back().ptr,
              valid_utf8(tag) && tag.size() < 64 ? "unsupported tag '" + tag + "'"
                                                 : std::string("unsupported tag"));
    }
};

}  // namespace

std::vector<Doc> parse_yaml(const std::string& file, const std::string& text,
                            std::vector<Diagnostic>& diags, ExpansionBudget& budget) {
    std::vector<Doc> out;
    if (text.size() > kMaxFileSize) {
        diags.push_back({Severity::error,
                         {file, 1, 1},
                         "",
                         "file larger than " + std::to_string(kMaxFileSize) + " bytes"});
        return out;
    }
    Lines lines(text);
    if (!check_characters(file, lines, diags)) return out;
    std::istringstream in(text);
    YAML::Parser parser(in);
    std::optional<YAML::Mark> previous_start;
    auto syntax_error = [&](const YAML::Mark& m, std::string msg) {
        Position p{file, 1, 1};
        if (!m.is_null()) p = {file, m.line + 1, lines.column(size_t(m.line), size_t(m.column))};
        if (!m.is_null() && lines.at(size_t(m.line), size_t(m.column)) == ',')
            msg = "unexpected ',' outside [ ] or { }";
        diags.push_back({Severity::error, p, "", "yaml: " + msg});
        out.clear();  // a file with a syntax error gives no documents
    };
    for (;;) {
        Builder b(file, lines, diags, budget);
        try {
            if (!parser.HandleNextDocument(b)) break;
        } catch (const YAML::Exception& e) {
            syntax_error(e.mark, e.msg);
            return out;
        } catch (const Stop&) {
            out.clear();
            return out;
        }
        // A document that starts where the previous one did consumed nothing: the parser is
        // stuck on a token that cannot start a document, and would go on forever.
        if (previous_start && previous_start->pos == b.start_mark.pos &&
            previous_start->line == b.start_mark.line) {
            syntax_error(b.start_mark, "a document cannot start here");
            return out;
        }
        previous_start = b.start_mark;
        if (b.failed || !b.root || b.root->is_null()) continue;  // "---" with nothing after it
        b.doc.file = file;
        b.doc.json = std::move(*b.root);
        out.push_back(std::move(b.doc));
    }
    return out;
}

}  // namespace mpsteer::manifest::detail
