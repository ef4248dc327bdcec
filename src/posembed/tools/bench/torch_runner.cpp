#include "posembed/tools/bench/torch_runner.h"

#include <array>
#include <cstdio>
#include <memory>

#include <nlohmann/json.hpp>

#include "posembed/core/error.h"

namespace posembed::tools::bench {

TorchRun run_torch_bench(const TorchBenchCall& call, const std::string& shape_name,
                         const EmbeddingShape& s) {
  const std::string spec = shape_name + ":" + std::to_string(s.batch) + ":" +
                           std::to_string(s.seq_len) + ":" + std::to_string(s.embed_dim) + ":" +
                           std::to_string(s.vocab_size) + ":" + std::to_string(s.max_seq_len);
  const std::string command =
      call.python + " " + call.script + " --threads " + std::to_string(call.threads) + " --reps " +
      std::to_string(call.reps) + " --shape " + spec + (call.compile ? " --compile" : "") +
      (call.evict_bytes ? " --evict-bytes " + std::to_string(call.evict_bytes) : "");
  std::unique_ptr<FILE, int (*)(FILE*)> pipe(popen(command.c_str(), "r"), pclose);
  if (!pipe) throw Error("could not run " + command);
  std::string text;
  std::array<char, 4096> buffer{};
  while (std::fgets(buffer.data(), static_cast<int>(buffer.size()), pipe.get()))
    text += buffer.data();
  const int status = pclose(pipe.release());
  if (status != 0 || text.empty()) {
    throw Error("the PyTorch bench failed (" + command +
                "); run it from the repository root, with "
                "python3-torch installed (scripts/deps.sh test), or leave out --torch" +
                (call.evict_bytes
                     ? std::string("; --cold needs a --torch-script that takes --evict-bytes")
                     : ""));
  }
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || j.value("format", "") != "posembed-torch-bench/1") {
    throw Error("unexpected output from " + command);
  }
  if (j.value("evict_bytes", std::size_t{0}) != call.evict_bytes) {
    throw Error("the PyTorch bench did not evict the caches as asked (" + command +
                "): its JSON must echo evict_bytes " + std::to_string(call.evict_bytes));
  }
  TorchRun run;
  run.version = j.value("torch", "");
  run.threads = j.value("threads", 0);
  run.compile = j.value("compile", false);
  run.evict_bytes = j.value("evict_bytes", std::size_t{0});
  if (!j.contains("shapes") || !j["shapes"].contains(shape_name)) {
    throw Error("the PyTorch bench printed no shape " + shape_name + " (" + command + ")");
  }
  for (const auto& [name, k] : j["shapes"][shape_name].items()) {
    run.kernels[name] = {k.at("median_ms").get<double>(), k.at("min_ms").get<double>(),
                         k.value("variant", "eager")};
  }
  return run;
}

}  // namespace posembed::tools::bench
