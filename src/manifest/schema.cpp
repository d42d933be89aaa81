// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// JSON Schema validation with valijson, and the translation of its errors into messages with
// a JSON pointer and a position. valijson reports a chain of errors per failure (the leaf, then
// one "Failed to validate item #n" per enclosing level); only leaves are kept, reworded from
// the schema itself (expected type, allowed values, the schema's errorMessage).
#include <algorithm>
#include <map>
#include <memory>
#include <regex>
#include <unordered_map>

#include <valijson/adapters/nlohmann_json_adapter.hpp>
#include <valijson/schema.hpp>
#include <valijson/schema_parser.hpp>
#include <valijson/validation_results.hpp>
#include <valijson/validator.hpp>

#include "manifest/internal.h"

namespace mpsteer::manifest::detail {

using nlohmann::json;

std::string closest(const std::string& word, const std::vector<std::string>& candidates) {
    auto distance = [](const std::string& a, const std::string& b) {
        std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
        for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
        for (size_t i = 1; i <= a.size(); ++i) {
            cur[0] = i;
            for (size_t j = 1; j <= b.size(); ++j)
                cur[j] = std::min(
                    {prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
            std::swap(prev, cur);
        }
        return prev[b.size()];
    };
    std::string best;
    size_t best_d = std::max<size_t>(2, word.size() / 3) + 1;
    if (word.size() > 64) return best;
    for (const auto& c : candidates) {
        size_t d = distance(word, c);
        if (d < best_d) best_d = d, best = c;
    }
    return best;
}

namespace {

// valijson compares every pair of items for `uniqueItems` and reports every equal pair: a
// long list takes quadratic time, and one value repeated quadratic memory. It gets the
// schemas without it; unique_items() checks it in linear time.
void drop_unique_items(json& schema) {
    if (schema.is_object()) schema.erase("uniqueItems");
    if (schema.is_structured())
        for (auto& child : schema) drop_unique_items(child);
}

struct Schemas {
    std::map<std::string, json> docs;  // by file name
    std::map<std::string, json> for_valijson;
    std::map<std::string, std::unique_ptr<valijson::Schema>> compiled;

    Schemas() {
        for (const auto& [name, text] : embedded_schemas()) {
            docs[name] = json::parse(text);
            drop_unique_items(for_valijson[name] = docs[name]);
        }
        for (const char* root :
             {"manifest.schema.json", "policy.schema.json", "selector-set.schema.json",
              "action-chain.schema.json", "balancer.schema.json"}) {
            auto s = std::make_unique<valijson::Schema>();
            valijson::SchemaParser parser(valijson::SchemaParser::kDraft7);
            valijson::adapters::NlohmannJsonAdapter adapter(for_valijson.at(root));
            auto fetch = [this](const std::string& uri) -> const json* {
                auto it = for_valijson.find(uri);
                return it == for_valijson.end() ? nullptr : &it->second;
            };
            auto release = [](const json*) {};  // the documents belong to this object
            parser.populateSchema(adapter, *s, fetch, release);
            compiled[root] = std::move(s);
        }
    }

    // Follows a $ref ("file#/a/b" or "#/a/b") from within document `file`.
    const json* resolve(const json* node, std::string& file) const {
        for (int guard = 0; node && node->is_object() && node->contains("$ref") && guard < 16;
             ++guard) {
            std::string ref = (*node)["$ref"].get<std::string>();
            auto hash = ref.find('#');
            if (hash != 0) file = ref.substr(0, hash);
            auto it = docs.find(file);
            if (it == docs.end()) return nullptr;
            const json* cur = &it->second;
            std::string ptr = hash == std::string::npos ? "" : ref.substr(hash + 1);
            try {
                cur = &cur->at(json::json_pointer(ptr));
            } catch (const json::exception&) {
                return nullptr;
            }
            node = cur;
        }
        return node;
    }

    // The schema node that applies to the instance at `path` (keys or indexes), or nullptr.
    const json* walk(const std::string& root, const std::vector<std::string>& path,
                     const json& instance) const {
        std::string file = root;
        const json* node = resolve(&docs.at(root), file);
        const json* inst = &instance;
        for (const auto& step : path) {
            if (!node) return nullptr;
            node = resolve(node, file);
            if (node && node->contains("allOf") && !node->contains("items") &&
                !node->contains("properties"))
                node = resolve(&(*node)["allOf"][0], file);
            if (!node || !node->is_object()) return nullptr;
            if (inst && inst->is_array()) {
                node = node->contains("items") ? &(*node)["items"] : nullptr;
                size_t i = std::stoul(step);
                inst = i < inst->size() ? &(*inst)[i] : nullptr;
            } else {
                if (node->contains("properties") && (*node)["properties"].contains(step))
                    node = &(*node)["properties"][step];
                else if (node->contains("additionalProperties") &&
                         (*node)["additionalProperties"].is_object())
                    node = &(*node)["additionalProperties"];
                else
                    node = nullptr;
                inst = inst && inst->is_object() && inst->contains(step) ? &(*inst)[step] : nullptr;
            }
        }
        return node ? resolve(node, file) : nullptr;
    }
};

const Schemas& schemas() {
    static const Schemas s;
    return s;
}

std::string type_name(const json& v) {
    switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "boolean";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned: return "integer";
    case json::value_t::number_float: return "number";
    case json::value_t::string: return "string";
    case json::value_t::array: return "array";
    case json::value_t::object: return "object";
    default: return "value";
    }
}

std::string join(const json& arr, const std::string& sep) {
    std::string out;
    for (const auto& v : arr) {
        if (!out.empty()) out += sep;
        out += v.is_string() ? v.get<std::string>() : v.dump();
    }
    return out;
}

std::string show(const json& v) {
    std::string s = v.is_string() ? "'" + v.get<std::string>() + "'" : v.dump();
    if (s.size() > 60) {
        size_t cut = 57;
        while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xc0) == 0x80) --cut;  // UTF-8
        s = s.substr(0, cut) + "...";
    }
    return s;
}

// The quoted name in valijson's "... constraints: 'NAME'." message.
std::string quoted(const std::string& desc) {
    auto end = desc.rfind('\'');
    auto start = end == std::string::npos ? end : desc.rfind('\'', end - 1);
    if (start == std::string::npos || end == start) return "";
    return desc.substr(start + 1, end - start - 1);
}

bool starts(const std::string& s, const char* prefix) {
    return s.rfind(prefix, 0) == 0;
}

// `uniqueItems` of every list in the document, one error per repeated item (at the item, with
// the first one like it): linear in the document.
bool unique_items(const Schemas& S, const std::string& root, const Doc& doc, const json& value,
                  std::vector<std::string>& path, const std::string& ptr,
                  std::vector<Diagnostic>& diags) {
    bool ok = true;
    if (value.is_array()) {
        const json* sch = S.walk(root, path, doc.json);
        if (sch && sch->value("uniqueItems", false)) {
            std::unordered_map<std::string, size_t> first;
            for (size_t i = 0; i < value.size(); ++i) {
                auto [it, fresh] = first.emplace(value[i].dump(), i);
                if (fresh) continue;
                std::string item = pointer_join(ptr, i);
                diags.push_back(
                    {Severity::error, doc.at(item), item,
                     "duplicate item (same as item " + std::to_string(it->second) + ")"});
                ok = false;
            }
        }
        for (size_t i = 0; i < value.size(); ++i) {
            path.push_back(std::to_string(i));
            ok = unique_items(S, root, doc, value[i], path, pointer_join(ptr, i), diags) && ok;
            path.pop_back();
        }
    } else if (value.is_object()) {
        for (auto it = value.begin(); it != value.end(); ++it) {
            path.push_back(it.key());
            ok = unique_items(S, root, doc, it.value(), path, pointer_join(ptr, it.key()), diags) &&
                 ok;
            path.pop_back();
        }
    }
    return ok;
}

}  // namespace

bool schema_validate(const Doc& doc, std::vector<Diagnostic>& diags) {
    const Schemas& S = schemas();
    std::string root = "manifest.schema.json";
    if (doc.json.is_object() && doc.json.contains("kind") && doc.json["kind"].is_string()) {
        const auto& k = doc.json["kind"].get_ref<const std::string&>();
        if (k == "Policy")
            root = "policy.schema.json";
        else if (k == "SelectorSet")
            root = "selector-set.schema.json";
        else if (k == "ActionChain")
            root = "action-chain.schema.json";
        else if (k == "Balancer")
            root = "balancer.schema.json";
    }
    std::vector<std::string> path;
    const bool unique = unique_items(S, root, doc, doc.json, path, "", diags);
    valijson::Validator validator;
    valijson::ValidationResults results;
    valijson::adapters::NlohmannJsonAdapter target(doc.json);
    validator.validate(*S.compiled.at(root), target, &results);
    if (results.numErrors() == 0) return unique;

    struct Raw {
        std::string pointer;
        std::vector<std::string> path;
        std::string desc;
    };
    std::vector<Raw> raws;
    for (const auto& e : results) {
        Raw r;
        const json* inst = &doc.json;
        for (size_t i = 1; i < e.context.size(); ++i) {  // [0] is "<root>"
            const std::string& c = e.context[i];
            std::string step = c.size() >= 2 ? c.substr(1, c.size() - 2) : c;
            r.path.push_back(step);
            r.pointer = pointer_join(r.pointer, step);
            if (inst && inst->is_array()) {
                size_t idx = std::stoul(step);
                inst = idx < inst->size() ? &(*inst)[idx] : nullptr;
            } else if (inst && inst->is_object() && inst->contains(step)) {
                inst = &(*inst)[step];
            } else {
                inst = nullptr;
            }
        }
        r.desc = e.description;
        raws.push_back(std::move(r));
    }

    auto wrapper = [](const std::string& d) {
        return starts(d, "Failed to validate item #") ||
               starts(d, "Failed to validate against schema associated with property name") ||
               starts(d, "Failed to validate against child schema") ||
               starts(d, "Failed to validate against additional properties schema") ||
               starts(d, "Failed to validate against any") ||
               starts(d, "Failed to validate against exactly one") ||
               starts(d, "Failed to validate against a conditional") ||
               starts(d, "Failed to validate against dependent") ||
               starts(d, "Failed to validate against schema associated with pattern") ||
               starts(d, "Failed to validate against additional items") ||
               starts(d, "Cannot validate item #");
    };
    // Per pointer, whether something more precise than a wrapper was said there; sorted, so
    // that the pointers below one follow it.
    std::map<std::string, bool> precise_at;
    for (const auto& r : raws) precise_at[r.pointer] |= !wrapper(r.desc);
    bool ok = unique;
    for (const auto& r : raws) {
        if (wrapper(r.desc)) {
            // Kept only when nothing more precise was said at or below this place.
            auto at = precise_at.find(r.pointer);
            auto next = std::next(at);
            bool covered = at->second || (next != precise_at.end() &&
                                          next->first.compare(0, r.pointer.size(), r.pointer) == 0);
            if (covered) continue;
            // valijson says nothing of its own when `propertyNames` fails: find the names.
            if (starts(r.desc, "Failed to validate against schema associated with property name")) {
                std::string name = quoted(r.desc);
                auto path = r.path;
                path.push_back(name);
                const json* child = S.walk(root, path, doc.json);
                std::string cptr = pointer_join(r.pointer, name);
                const json* inst = nullptr;
                try {
                    inst = &doc.json.at(json::json_pointer(cptr));
                } catch (const json::exception&) {}
                if (child && inst && inst->is_object() && child->contains("propertyNames") &&
                    (*child)["propertyNames"].contains("pattern")) {
                    std::regex re((*child)["propertyNames"]["pattern"].get<std::string>());
                    for (auto it = inst->begin(); it != inst->end(); ++it) {
                        if (std::regex_search(it.key(), re)) continue;
                        std::string kp = pointer_join(cptr, it.key());
                        diags.push_back(
                            {Severity::error, doc.key_at(kp), kp,
                             "invalid name '" + it.key() + "' (must match " +
                                 (*child)["propertyNames"]["pattern"].get<std::string>() + ")"});
                        ok = false;
                    }
                    continue;
                }
            }
        }
        const json* sch = S.walk(root, r.path, doc.json);
        const json* val = nullptr;
        try {
            val = &doc.json.at(json::json_pointer(r.pointer));
        } catch (const json::exception&) {}
        auto custom = [&]() -> std::string {
            if (sch && sch->contains("errorMessage")) return (*sch)["errorMessage"];
            return "";
        };
        std::string ptr = r.pointer;
        Position pos = doc.at(ptr);
        std::string msg;
        const std::string& d = r.desc;
        if (starts(d, "Object contains a property that could not be validated")) {
            std::string name = quoted(d);
            ptr = pointer_join(r.pointer, name);
            pos = doc.key_at(ptr);
            msg = "unknown property '" + name + "'";
            std::vector<std::string> known;
            if (sch && sch->contains("properties"))
                for (auto it = (*sch)["properties"].begin(); it != (*sch)["properties"].end(); ++it)
                    known.push_back(it.key());
            std::string near = closest(name, known);
            if (!near.empty())
                msg += "; did you mean '" + near + "'?";
            else if (!known.empty() && known.size() <= 16) {
                std::string list;
                for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
                msg += " (expected one of: " + list + ")";
            }
        } else if (starts(d, "Missing required property")) {
            msg = "missing required property '" + quoted(d) + "'";
        } else if (starts(d, "Value type not permitted")) {
            std::string expected = "a different type";
            if (sch && sch->contains("type")) {
                const json& t = (*sch)["type"];
                expected = t.is_array() ? join(t, " or ") : t.get<std::string>();
            }
            msg = "expected " + expected + ", got " + (val ? type_name(*val) : "value");
            if (val && (val->is_string() || val->is_number() || val->is_boolean()))
                msg += " " + show(*val);
        } else if (starts(d, "Failed to match against any enum values")) {
            msg = (val ? show(*val) : std::string("value")) + " is not one of: " +
                  (sch && sch->contains("enum") ? join((*sch)["enum"], ", ") : "");
            if (val && val->is_string() && sch && sch->contains("enum")) {
                std::vector<std::string> cands;
                for (const auto& e : (*sch)["enum"])
                    if (e.is_string()) cands.push_back(e);
                std::string near = closest(*val, cands);
                if (!near.empty()) msg += "; did you mean '" + near + "'?";
            }
        } else if (starts(d, "Failed to match expected value set by 'const'")) {
            msg = custom();
            if (msg.empty() && sch && sch->contains("const"))
                msg = "must be " + show((*sch)["const"]);
            if (val) msg = show(*val) + ": " + msg;
        } else if (starts(d, "Failed to match regex")) {
            msg = custom();
            if (msg.empty()) msg = "does not match the expected pattern";
            if (val) msg = show(*val) + " " + msg;
        } else if (starts(d, "Expected number")) {
            std::string range;
            if (sch && sch->contains("minimum") && sch->contains("maximum"))
                range = " (" + (*sch)["minimum"].dump() + " to " + (*sch)["maximum"].dump() + ")";
            else if (sch && sch->contains("minimum"))
                range = " (at least " + (*sch)["minimum"].dump() + ")";
            else if (sch && sch->contains("maximum"))
                range = " (at most " + (*sch)["maximum"].dump() + ")";
            msg = (val ? val->dump() : std::string("value")) + " is out of range" + range;
        } else if (starts(d, "Object should have no")) {
            msg = custom();
            if (msg.empty()) msg = "wrong number of properties";
            if (val && val->is_object() && val->size() > 1) {
                std::string keys;
                for (auto it = val->begin(); it != val->end(); ++it)
                    keys += (keys.empty() ? "" : ", ") + it.key();
                msg += "; found " + keys;
            }
        } else if (starts(d, "Array should contain no fewer than")) {
            msg = "needs at least " +
                  std::to_string(sch && sch->contains("minItems") ? (*sch)["minItems"].get<int>()
                                                                  : 1) +
                  " item(s)";
        } else if (starts(d, "String should be no more than")) {
            msg = "too long (at most " +
                  (sch && sch->contains("maxLength") ? (*sch)["maxLength"].dump() : "?") +
                  " characters)";
        } else if (starts(d, "String should be no fewer than")) {
            msg = "must not be empty";
        } else {
            msg = d;
            if (!msg.empty()) msg[0] = static_cast<char>(std::tolower(msg[0]));
            if (!msg.empty() && msg.back() == '.') msg.pop_back();
        }
        diags.push_back({Severity::error, pos, ptr.empty() ? "/" : ptr, msg});
        ok = false;
    }
    return ok;
}

}  // namespace mpsteer::manifest::detail
