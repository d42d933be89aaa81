// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
// SHA-256 (Nettle): MPTCP derives tokens and IDSNs from keys with it (RFC 8684, 3.2), the
// agent names policy contents and BPF objects by it.
#pragma once

#include <nettle/sha2.h>

#include <array>
#include <cstddef>
#include <cstdint>

namespace mpsteer::net {

using Sha256Digest = std::array<uint8_t, SHA256_DIGEST_SIZE>;

class Sha256 {
public:
    Sha256() { sha256_init(&ctx_); }
    Sha256& update(const void* data, size_t size) {
        sha256_update(&ctx_, size, static_cast<const uint8_t*>(data));
        return *this;
    }
    // The digest; the object starts over afterwards.
    Sha256Digest digest() {
        Sha256Digest d;
        sha256_digest(&ctx_, d.size(), d.data());
        return d;
    }

private:
    sha256_ctx ctx_;
};

inline Sha256Digest sha256(const void* data, size_t size) {
    return Sha256().update(data, size).digest();
}

}  // namespace mpsteer::net
