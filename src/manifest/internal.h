// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// Internals of the manifest stage shared by its .cpp files (not a public header).
#pragma once

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "manifest/manifest.h"
#include "manifest/policy_files.h"

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

// Limits that keep hostile input (alias bombs, recursive aliases, huge scalars) cheap. Nodes
// alone do not bound an alias bomb: an alias of a 4 KiB scalar is one node, so the bytes of
// keys and scalars are counted too, with the paths positions are kept by (deeply nested long
// keys make every path below them long). Aliases never make a document bigger than a file
// could hold written out, nor a load bigger than a revision could; twice that leaves room for
// the paths.
inline constexpr size_t kMaxDepth = 64;
inline constexpr size_t kMaxNodes = 100000;           // one document, aliases expanded
inline constexpr size_t kMaxRevisionNodes = 1000000;  // every document of one load
inline constexpr size_t kMaxScalar = 4096;
// Policies with a Lua hook per revision: each is a Lua state (16 MiB at most) in the one hook
// process, whose address space is 1 GiB.
inline constexpr size_t kMaxHookScripts = 32;
inline constexpr size_t kMaxFileSize = kMaxPolicyFileBytes;
inline constexpr size_t kMaxDocumentBytes = 2 * kMaxPolicyFileBytes;        // one document
inline constexpr size_t kMaxRevisionExpandedBytes = 2 * kMaxRevisionBytes;  // one load

// What is left of a load's expansion limits: each file's documents take from it, and a file
// that needs more than is left gives no documents.
struct ExpansionBudget {
    size_t nodes = kMaxRevisionNodes;
    size_t bytes = kMaxRevisionExpandedBytes;
};

// Parses every document of a YAML text; null documents are skipped. Syntax and conversion
// errors go to diags; documents that could not be converted are not returned.
std::vector<Doc> parse_yaml(const std::string& file, const std::string& text,
                            std::vector<Diagnostic>& diags, ExpansionBudget& budget);

std::string pointer_escape(const std::string& key);
std::string pointer_join(const std::string& base, const std::string& key);
std::string pointer_join(const std::string& base, size_t index);

// Validates a document against the schema of its kind (or the envelope schema when the kind
// is unknown). Returns false when any error was added.
bool schema_validate(const Doc& doc, std::vector<Diagnostic>& diags);

// "did you mean" helper: the closest candidate within a small edit distance, or "".
std::string closest(const std::string& word, const std::vector<std::string>& candidates);

// A policy's Lua script, found beneath the repository root.
struct ScriptFile {
    std::string path;    // on disk
    std::string source;  // its bytes
};
// Finds and reads the script a manifest names; nullopt with the reason in `why`. Empty when
// scripts are not checked (Options::check_scripts).
using ScriptReader = std::function<std::optional<ScriptFile>(
    const std::string& manifest, const std::string& script, std::string& why)>;

// The semantic checks over every parsed document, and the model (model.cpp).
Result load_docs(std::vector<Doc> docs, std::vector<Diagnostic> diags,
                 std::vector<std::string> files, const Options& opts, const ScriptReader& scripts);

// Embedded schema texts, generated from schemas/*.json at build time: {file name, text}.
const std::vector<std::pair<std::string, std::string>>& embedded_schemas();

}  // namespace mpsteer::manifest::detail
