// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
#include "cli/commands.h"

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <filesystem>
#include <spdlog/pattern_formatter.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <string_view>

#include "net/text.h"

namespace mpsteer::cli {
namespace {
int g_exit_code = 0;

// Log text carries names, messages and script output from the policy repository: every line is
// escaped here, once, so none can end a line early, forge another or drive the terminal. A
// multi-line message (a verifier log at debug) becomes one line with \n in it.
class EscapingFormatter final : public spdlog::formatter {
public:
    explicit EscapingFormatter(std::string pattern)
        : pattern_(std::move(pattern)),
          inner_(std::make_unique<spdlog::pattern_formatter>(pattern_)) {}
    void format(const spdlog::details::log_msg& msg, spdlog::memory_buf_t& dest) override {
        std::string_view text(msg.payload.data(), msg.payload.size());
        while (!text.empty() && text.back() == '\n') text.remove_suffix(1);  // the line's own end
        const std::string escaped = net::escape_control(text);
        spdlog::details::log_msg line = msg;
        line.payload = spdlog::string_view_t(escaped.data(), escaped.size());
        inner_->format(line, dest);
    }
    std::unique_ptr<spdlog::formatter> clone() const override {
        return std::make_unique<EscapingFormatter>(pattern_);
    }

private:
    std::string pattern_;
    std::unique_ptr<spdlog::pattern_formatter> inner_;
};
}  // namespace

void set_exit_code(int code) {
    g_exit_code = code;
}
int exit_code() {
    return g_exit_code;
}

int run_app(int argc, char** argv, const char* title, const std::vector<AddCommand>& commands) {
    // Logs go to stderr: stdout carries results (validate, plan, status, events, bench).
    spdlog::set_default_logger(spdlog::stderr_color_mt("mpsteer"));
    spdlog::set_formatter(std::make_unique<EscapingFormatter>("[%Y-%m-%d %H:%M:%S.%e] [%l] %v"));
    CLI::App app{title};
    app.require_subcommand(1);
    bool verbose = false;
    app.add_flag("-v,--verbose", verbose, "debug logging");
    app.parse_complete_callback([&] {
        if (verbose) spdlog::set_level(spdlog::level::debug);
    });
    for (auto add : commands) add(app);
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
        return app.exit(e) == 0 ? 0 : 2;  // usage errors exit 2
    } catch (const std::exception& e) {   // what a command did not report itself
        spdlog::error("{}", e.what());
        return 1;
    }
    return exit_code();
}

std::string companion_binary(const std::string& name) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const fs::path dir = fs::read_symlink("/proc/self/exe", ec).parent_path();
    if (ec) return {};
    for (const fs::path& p : {dir / name, dir / "../lib/mpsteer" / name, dir / "../../bin" / name})
        if (access(p.c_str(), X_OK) == 0) return fs::weakly_canonical(p, ec).string();
    return {};
}
}  // namespace mpsteer::cli
