// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Internals of the manifest stage shared by its .cpp files (not a public header).
#pragma once

#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "manifest/manifest.h"

namespace mpsteer::manifest::detail {

// One YAML document as typed JSON, with where each value (and each key) came from.
struct Doc {
    std::string file;
    nlohmann::json json;
    Position root;
    std::map<std::string, Position> value_pos;  // JSON pointer -> the value's position
    std::map<std::string, Position> key_pos;    // JSON pointer -> the key naming that value
    // The value's position, else the nearest ancestor's.
    Position at(const std::string& pointer) const;
    // The key's position when the pointer names a mapping member, else at().
    Position key_at(const std::string& pointer) const;
};

// Limits that keep hostile input (alias bombs, recursive aliases, huge scalars) cheap.
inline constexpr size_t kMaxDepth = 64;
inline constexpr size_t kMaxNodes = 100000;           // one document, aliases expanded
inline constexpr size_t kMaxRevisionNodes = 1000000;  // every document of one load
inline constexpr size_t kMaxScalar = 4096;
inline constexpr size_t kMaxFileSize = 4 << 20;

// Parses every document of a YAML text; null documents are skipped. Syntax and conversion
// errors go to diags; documents that could not be converted are not returned. node_budget is
// what is left of kMaxRevisionNodes for this load: the nodes built are taken from it, and a
// file that needs more than is left gives no documents.
std::vector<Doc> parse_yaml(const std::string& file, const std::string& text,
                            std::vector<Diagnostic>& diags, size_t& node_budget);

std::string pointer_escape(const std::string& key);
std::string pointer_join(const std::string& base, const std::string& key);
std::string pointer_join(const std::string& base, size_t index);

// Validates a document against the schema of its kind (or the envelope schema when the kind
// is unknown). Returns false when any error was added.
bool schema_validate(const Doc& doc, std::vector<Diagnostic>& diags);

// "did you mean" helper: the closest candidate within a small edit distance, or "".
std::string closest(const std::string& word, const std::vector<std::string>& candidates);

// The semantic checks over every parsed document, and the model (model.cpp).
Result load_docs(std::vector<Doc> docs, std::vector<Diagnostic> diags,
                 std::vector<std::string> files, const Options& opts);

// Embedded schema texts, generated from schemas/*.json at build time: {file name, text}.
const std::vector<std::pair<std::string, std::string>>& embedded_schemas();

}  // namespace mpsteer::manifest::detail
