#include "pagedmha/registry.h"

#include <map>
#include <mutex>

#include "backend/buffers.h"
#include "pagedmha/error.h"

namespace pagedmha {

namespace {

struct Registry {
  std::mutex mutex;
  std::map<std::string, BackendFactory> factories;
  Registry() {
    // Built-ins registered here, not by static initialisers a static library may drop.
    const BackendFactory mha = [](const BackendConfig& c) { return std::make_unique<MhaBackend>(c); };
    factories.emplace("pagedmha", mha);
    factories.emplace("trtllm", mha);
  }
};

Registry& registry() {
  static Registry r;
  return r;
}

}  // namespace

void register_backend(const std::string& name, BackendFactory factory) {
  if (name.empty() || !factory) {
    throw_invalid_argument("register_backend", name.empty() ? "name" : "factory", "a non-empty value", "empty");
  }
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.factories[name] = std::move(factory);
}

std::vector<std::string> registered_backends() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<std::string> names;
  for (const auto& [name, f] : r.factories) names.push_back(name);
  return names;
}

std::unique_ptr<MhaBackend> create_backend(const std::string& name, const BackendConfig& config) {
  BackendFactory factory;
  {
    Registry& r = registry();
    std::lock_guard<std::mutex> lock(r.mutex);
    auto it = r.factories.find(name);
    if (it != r.factories.end()) factory = it->second;
  }
  if (!factory) {
    std::string known;
    for (const std::string& n : registered_backends()) known += (known.empty() ? "" : ", ") + n;
    throw_invalid_argument("create_backend", "name", "one of {" + known + "}", "'" + name + "'");
  }
  // The backend's errors name create_backend (config errors: "create_backend: config.head_dim: ...").
  const backend_detail::CallScope call("create_backend");
  try {
    return factory(config);
  } catch (const Error& e) {
    backend_detail::rethrow_in_call(e, "create_backend");
  }
}

}  // namespace pagedmha
