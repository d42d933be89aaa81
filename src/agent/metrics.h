// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// The agent's metrics: the status document in Prometheus text, served on 127.0.0.1 (GET
// /metrics, its own thread, which only reads the last rendered text) and/or written to a
// node_exporter textfile.
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

namespace mpsteer::agent {

// Prometheus text exposition of a status document.
std::string to_prometheus(const nlohmann::json& status);

class MetricsServer;

class MetricsOutput {
public:
    // port 0: no HTTP endpoint; textfile "": none. A port that cannot be bound is logged and
    // left out (the agent carries on without it).
    MetricsOutput(int port, std::string textfile);
    ~MetricsOutput();
    void publish(const nlohmann::json& status);

private:
    std::unique_ptr<MetricsServer> server_;
    std::string textfile_;
};

}  // namespace mpsteer::agent
