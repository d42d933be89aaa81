// YAML -> typed JSON. yaml-cpp hands every scalar over as a string; JSON Schema needs types,
// so plain scalars are resolved with the YAML 1.2 core schema (null, bool, int, float), quoted
// ones stay strings, and each node's mark is remembered by JSON pointer for error positions.
#include <charconv>
#include <cmath>
#include <optional>
#include <regex>
#include <utility>

#include <yaml-cpp/yaml.h>

#include "manifest/internal.h"

namespace mpsteer::manifest::detail {

std::string pointer_escape(const std::string& key) {
    std::string out;
    for (char c : key) {
        if (c == '~') out += "~0";
        else if (c == '/') out += "~1";
        else out += c;
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
        if (c < 0x80) { ++i; continue; }
        if (c >= 0xc2 && c <= 0xdf) len = 2, cp = c & 0x1f;
        else if (c >= 0xe0 && c <= 0xef) len = 3, cp = c & 0x0f;
        else if (c >= 0xf0 && c <= 0xf4) len = 4, cp = c & 0x07;
        else return false;
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

// yaml-cpp 0.7 loops forever (allocating) on a ',' outside a flow collection where a value
// would start (`,` or `'a',`), which is a syntax error anyway. Find it first, with a small lexer that
// knows quotes, comments, flow brackets and block scalars. Returns the 0-based line, column.
std::optional<std::pair<int, int>> quoted_comma(const std::string& t) {
    int line = 0, col = 0, flow = 0;
    size_t i = 0;
    char prev = 0;            // last significant character on this line (0: none yet)
    std::string prev_token;   // last whitespace-separated token (tags, anchors)
    int block_indent = -1;    // inside a block scalar: lines indented more than this
    auto advance = [&](size_t n) {
        for (size_t k = 0; k < n && i < t.size(); ++k, ++i) {
            if (t[i] == '\n') ++line, col = 0;
            else ++col;
        }
    };
    while (i < t.size()) {
        // Start of a line: measure indentation, skip block scalar content.
        if (col == 0) {
            size_t j = i;
            while (j < t.size() && t[j] == ' ') ++j;
            int indent = int(j - i);
            bool blank = j >= t.size() || t[j] == '\n' || t[j] == '\r';
            if (block_indent >= 0 && (blank || indent > block_indent)) {
                while (i < t.size() && t[i] != '\n') advance(1);
                advance(1);
                continue;
            }
            block_indent = -1;
            prev = 0;
            prev_token.clear();
        }
        char c = t[i];
        if (c == '#' && (col == 0 || t[i - 1] == ' ' || t[i - 1] == '\t')) {
            while (i < t.size() && t[i] != '\n') advance(1);
            continue;
        }
        if (c == '\n') { advance(1); continue; }
        if (c == ' ' || c == '\t' || c == '\r') { advance(1); continue; }
        bool scalar_start = prev == 0 || prev == ':' || prev == '-' || prev == '[' ||
                            prev == '{' || prev == ',' || prev == '?' ||
                            (!prev_token.empty() && (prev_token[0] == '!' || prev_token[0] == '&'));
        if ((c == '\'' || c == '"') && scalar_start) {
            advance(1);
            while (i < t.size()) {
                if (c == '"' && t[i] == '\\') { advance(2); continue; }
                if (t[i] == c) {
                    if (c == '\'' && i + 1 < t.size() && t[i + 1] == '\'') { advance(2); continue; }
                    break;
                }
                advance(1);
            }
            advance(1);  // closing quote
            size_t j = i;
            while (j < t.size() && (t[j] == ' ' || t[j] == '\t')) ++j;
            if (flow == 0 && j < t.size() && t[j] == ',') return std::pair{line, col + int(j - i)};
            prev = c;
            prev_token = "q";
            continue;
        }
        if (flow == 0 && c == ',' && scalar_start)  // `,` cannot start a plain scalar either
            return std::pair{line, col};
        if (flow == 0 && (c == '|' || c == '>') && scalar_start) {
            // A block scalar: its content is the following, more indented lines.
            size_t ls = t.rfind('\n', i == 0 ? 0 : i - 1);
            ls = ls == std::string::npos || i == 0 ? 0 : ls + 1;
            int indent = 0;
            while (ls + size_t(indent) < t.size() && t[ls + size_t(indent)] == ' ') ++indent;
            block_indent = indent;
            while (i < t.size() && t[i] != '\n') advance(1);
            continue;
        }
        if (c == '[' || c == '{') ++flow;
        if ((c == ']' || c == '}') && flow > 0) --flow;
        // Read one token so that tags and anchors are recognised.
        std::string tok;
        while (i < t.size() && t[i] != ' ' && t[i] != '\t' && t[i] != '\n' && t[i] != '\r' &&
               !(tok.size() && (t[i] == ',' || t[i] == '[' || t[i] == ']' || t[i] == '{' ||
                                t[i] == '}'))) {
            tok += t[i];
            advance(1);
            if (tok.size() == 1 && (tok[0] == '[' || tok[0] == ']' || tok[0] == '{' ||
                                    tok[0] == '}' || tok[0] == ','))
                break;
        }
        for (char x : tok.substr(tok.empty() ? 0 : 1)) {
            if (x == '[' || x == '{') ++flow;
            if ((x == ']' || x == '}') && flow > 0) --flow;
        }
        prev = tok.empty() ? prev : tok.back();
        prev_token = tok;
    }
    return std::nullopt;
}

struct Converter {
    const std::string& file;
    Doc& doc;
    std::vector<Diagnostic>& diags;
    size_t nodes = 0;
    bool failed = false;

    Position pos(const YAML::Mark& m) const {
        if (m.is_null()) return {file, 1, 1};
        return {file, m.line + 1, m.column + 1};
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
            bool ok = base == 16 ? std::isxdigit(static_cast<unsigned char>(c)) != 0
                      : base == 8 ? (c >= '0' && c <= '7')
                                  : (c >= '0' && c <= '9');
            if (!ok) return std::nullopt;
        }
        uint64_t v = 0;
        auto r = std::from_chars(digits.data(), digits.data() + digits.size(), v, base);
        if (r.ec != std::errc{} || (neg && v > uint64_t(INT64_MAX) + 1)) {
            error(p, ptr, "integer '" + s + "' is out of range");
            return nlohmann::json(nullptr);
        }
        if (neg) return nlohmann::json(v == uint64_t(INT64_MAX) + 1 ? INT64_MIN : -int64_t(v));
        if (v <= uint64_t(INT64_MAX)) return nlohmann::json(int64_t(v));
        return nlohmann::json(v);
    }

    nlohmann::json scalar(const YAML::Node& n, const Position& p, const std::string& ptr) {
        const std::string& s = n.Scalar();
        if (s.size() > kMaxScalar) {
            error(p, ptr, "scalar longer than " + std::to_string(kMaxScalar) + " characters");
            return "";
        }
        if (!valid_utf8(s)) {
            error(p, ptr, "invalid UTF-8");
            return "";
        }
        const std::string& tag = n.Tag();
        if (tag == "?") return resolve_plain(s, p, ptr);
        if (tag == "!" || tag == "tag:yaml.org,2002:str") return s;
        if (tag == "tag:yaml.org,2002:null") return nullptr;
        if (tag == "tag:yaml.org,2002:bool" || tag == "tag:yaml.org,2002:int" ||
            tag == "tag:yaml.org,2002:float") {
            nlohmann::json v = resolve_plain(s, p, ptr);
            bool ok = tag.ends_with("bool") ? v.is_boolean()
                      : tag.ends_with("int") ? v.is_number_integer()
                                             : v.is_number();
            if (!ok) error(p, ptr, "'" + s + "' is not a valid " + tag.substr(18));
            return v;
        }
        error(p, ptr, valid_utf8(tag) && tag.size() < 64 ? "unsupported tag '" + tag + "'"
                                                        : std::string("unsupported tag"));
        return s;
    }

    nlohmann::json convert(const YAML::Node& n, const std::string& ptr, size_t depth,
                           const Position& p) {
        if (++nodes > kMaxNodes) {
            if (nodes == kMaxNodes + 1)
                error(p, ptr, "document too large (more than " + std::to_string(kMaxNodes) +
                                  " nodes after alias expansion)");
            return nullptr;
        }
        if (depth > kMaxDepth) {
            if (!std::exchange(depth_reported, true))
                error(p, ptr, "nesting deeper than " + std::to_string(kMaxDepth) + " levels");
            failed = true;
            return nullptr;
        }
        doc.value_pos.emplace(ptr, p);
        switch (n.Type()) {
        case YAML::NodeType::Null:
        case YAML::NodeType::Undefined:
            return nullptr;
        case YAML::NodeType::Scalar:
            return scalar(n, p, ptr);
        case YAML::NodeType::Sequence: {
            nlohmann::json arr = nlohmann::json::array();
            size_t i = 0;
            for (const auto& item : n) {
                std::string child = pointer_join(ptr, i++);
                arr.push_back(convert(item, child, depth + 1, pos(item.Mark())));
                if (nodes > kMaxNodes) break;
            }
            return arr;
        }
        case YAML::NodeType::Map: {
            nlohmann::json obj = nlohmann::json::object();
            for (const auto& kv : n) {
                Position kp = pos(kv.first.Mark());
                if (!kv.first.IsScalar()) {
                    error(kp, ptr, "mapping keys must be plain strings");
                    continue;
                }
                const std::string& key = kv.first.Scalar();
                if (key.size() > kMaxScalar || !valid_utf8(key)) {
                    error(kp, ptr, "invalid mapping key (not UTF-8, or too long)");
                    continue;
                }
                std::string child = pointer_join(ptr, key);
                if (obj.contains(key)) {
                    auto first = doc.key_pos[child];
                    error(kp, child, "duplicate key '" + key + "' (first defined at line " +
                                         std::to_string(first.line) + ")");
                    continue;
                }
                doc.key_pos.emplace(child, kp);
                // An empty value ("key:") has its mark on the following line; point at the key.
                Position vp = kv.second.IsNull() ? kp : pos(kv.second.Mark());
                obj[key] = convert(kv.second, child, depth + 1, vp);
                if (nodes > kMaxNodes) break;
            }
            return obj;
        }
        }
        return nullptr;
    }
    bool depth_reported = false;
};

}  // namespace

std::vector<Doc> parse_yaml(const std::string& file, const std::string& text,
                            std::vector<Diagnostic>& diags) {
    std::vector<Doc> out;
    if (text.size() > kMaxFileSize) {
        diags.push_back({Severity::error, {file, 1, 1}, "",
                         "file larger than " + std::to_string(kMaxFileSize) + " bytes"});
        return out;
    }
    if (auto at = quoted_comma(text)) {
        diags.push_back({Severity::error, {file, at->first + 1, at->second + 1}, "",
                         "yaml: unexpected ',' outside [ ] or { }"});
        return out;
    }
    std::vector<YAML::Node> nodes;
    try {
        nodes = YAML::LoadAll(text);
    } catch (const YAML::Exception& e) {
        Position p{file, 1, 1};
        if (!e.mark.is_null()) p = {file, e.mark.line + 1, e.mark.column + 1};
        diags.push_back({Severity::error, p, "", "yaml: " + e.msg});
        return out;
    }
    for (const auto& n : nodes) {
        if (n.IsNull()) continue;  // "---" with nothing after it
        Doc d;
        d.file = file;
        Converter c{file, d, diags};
        d.root = c.pos(n.Mark());
        d.json = c.convert(n, "", 0, d.root);
        if (!c.failed) out.push_back(std::move(d));
    }
    return out;
}

}  // namespace mpsteer::manifest::detail
