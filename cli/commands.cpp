// Subcommand registry storage (function-local static, so registration order across files does not matter).
#include "commands.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace servetune::cli {
namespace {

std::vector<std::pair<int, AddCommand>>& registry() {
  static std::vector<std::pair<int, AddCommand>> commands;
  return commands;
}

}  // namespace

CommandRegistration::CommandRegistration(int order, AddCommand add) { registry().emplace_back(order, add); }

void add_all_commands(CLI::App& app) {
  auto commands = registry();
  std::stable_sort(commands.begin(), commands.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [order, add] : commands) add(app);
}

}  // namespace servetune::cli
