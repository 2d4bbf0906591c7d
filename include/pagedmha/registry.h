// Attention backends by name, as engines select them ("--attention-backend pagedmha").
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pagedmha/backend.h"

namespace pagedmha {

using BackendFactory = std::function<std::unique_ptr<MhaBackend>(const BackendConfig&)>;

/// Registers (or replaces) a factory under `name`. Built in: "pagedmha" and its alias
/// "trtllm" (the upstream backend this one replaces).
void register_backend(const std::string& name, BackendFactory factory);

/// Creates the backend registered under `name`.
/// Errors: an unknown name (the message lists the registered ones); config errors.
std::unique_ptr<MhaBackend> create_backend(const std::string& name, const BackendConfig& config);

/// Registered names, sorted.
std::vector<std::string> registered_backends();

}  // namespace pagedmha
