// Expert placements: trivial, EPLB-balanced, and read from an --init-expert-location file (see expert_placement.h).
#include "model/expert_placement.h"

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "core/error.h"

namespace servetune {

bool ExpertPlacement::identity() const {
  for (size_t s = 0; s < slot_expert.size(); ++s) {
    if (slot_expert[s] != static_cast<int32_t>(s)) return false;
  }
  return copies.size() == slot_expert.size();
}

ExpertPlacement placement_from_slots(std::vector<int32_t> slot_expert, int64_t experts, const std::string& what) {
  ExpertPlacement p;
  p.copies.resize(static_cast<size_t>(experts));
  for (size_t s = 0; s < slot_expert.size(); ++s) {
    const int32_t e = slot_expert[s];
    if (e < 0 || e >= experts) {
      throw_usage(what + ": slot " + std::to_string(s) + " holds expert " + std::to_string(e) + ", outside the model's " +
                  std::to_string(experts) + " routed experts");
    }
    p.copies[static_cast<size_t>(e)].push_back(static_cast<int32_t>(s));
  }
  for (int64_t e = 0; e < experts; ++e) {
    if (p.copies[static_cast<size_t>(e)].empty()) throw_usage(what + ": expert " + std::to_string(e) + " has no slot");
  }
  p.slot_expert = std::move(slot_expert);
  return p;
}

ExpertPlacement trivial_placement(int64_t experts, int64_t slots) {
  std::vector<int32_t> slot_expert(static_cast<size_t>(slots));
  for (int64_t s = 0; s < slots; ++s) slot_expert[static_cast<size_t>(s)] = static_cast<int32_t>(s % experts);
  return placement_from_slots(std::move(slot_expert), experts, "trivial expert placement");
}

ExpertPlacement balanced_placement(const std::vector<int64_t>& load, int64_t slots, int groups) {
  const auto experts = static_cast<int64_t>(load.size());
  if (slots < experts || groups < 1 || slots % groups != 0) {
    throw Error(ErrorKind::kInternal, "balanced_placement: " + std::to_string(slots) + " slots for " + std::to_string(experts) +
                                          " experts in " + std::to_string(groups) + " groups");
  }
  // Replicate: each extra slot to the expert with the most load per copy (compared exactly: a/b > c/d as a*d > c*b).
  std::vector<int64_t> copies(static_cast<size_t>(experts), 1);
  for (int64_t extra = slots - experts; extra > 0; --extra) {
    size_t best = 0;
    for (size_t e = 1; e < copies.size(); ++e) {
      if (static_cast<double>(load[e]) * static_cast<double>(copies[best]) >
          static_cast<double>(load[best]) * static_cast<double>(copies[e])) {
        best = e;
      }
    }
    ++copies[best];
  }
  // Pack: every copy, heaviest first, into the least-loaded group with room.
  struct Item {
    double load;
    int32_t expert;
  };
  std::vector<Item> items;
  for (int64_t e = 0; e < experts; ++e) {
    for (int64_t c = 0; c < copies[static_cast<size_t>(e)]; ++c) {
      items.push_back({static_cast<double>(load[static_cast<size_t>(e)]) / static_cast<double>(copies[static_cast<size_t>(e)]),
                       static_cast<int32_t>(e)});
    }
  }
  std::stable_sort(items.begin(), items.end(), [](const Item& a, const Item& b) { return a.load > b.load; });
  const int64_t per_group = slots / groups;
  std::vector<std::vector<int32_t>> members(static_cast<size_t>(groups));
  std::vector<double> group_load(static_cast<size_t>(groups), 0.0);
  for (const Item& item : items) {
    int best = -1;
    for (int g = 0; g < groups; ++g) {
      if (static_cast<int64_t>(members[static_cast<size_t>(g)].size()) == per_group) continue;
      if (best < 0 || group_load[static_cast<size_t>(g)] < group_load[static_cast<size_t>(best)]) best = g;
    }
    members[static_cast<size_t>(best)].push_back(item.expert);
    group_load[static_cast<size_t>(best)] += item.load;
  }
  std::vector<int32_t> slot_expert;
  for (auto& m : members) {
    std::sort(m.begin(), m.end());
    slot_expert.insert(slot_expert.end(), m.begin(), m.end());
  }
  return placement_from_slots(std::move(slot_expert), experts, "balanced expert placement");
}

std::vector<ExpertPlacement> read_expert_location(const std::string& path, int64_t moe_layers, int64_t experts, int64_t slots,
                                                  int groups) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_usage("init_expert_location " + path + ": cannot open (give 'trivial' or a JSON file)");
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.str());
  } catch (const nlohmann::json::exception& e) {
    throw_usage("init_expert_location " + path + ": not JSON (" + e.what() + ")");
  }
  const bool counts = j.is_object() && j.contains("logical_count");
  const bool map = j.is_object() && j.contains("physical_to_logical_map");
  if (counts == map) {
    throw_usage("init_expert_location " + path + ": needs exactly one of \"logical_count\" ([moe layer][expert]) and "
                "\"physical_to_logical_map\" ([moe layer][slot])");
  }
  const std::string key = counts ? "logical_count" : "physical_to_logical_map";
  const std::string what = "init_expert_location " + path + ": " + key;
  const nlohmann::json& rows = j[key];
  if (!rows.is_array() || static_cast<int64_t>(rows.size()) != moe_layers) {
    throw_usage(what + " needs one row per mixture-of-experts layer (" + std::to_string(moe_layers) + " in this model)");
  }
  const int64_t width = counts ? experts : slots;
  std::vector<ExpertPlacement> out;
  for (size_t l = 0; l < rows.size(); ++l) {
    const std::string row_name = what + " row " + std::to_string(l);
    if (!rows[l].is_array() || static_cast<int64_t>(rows[l].size()) != width) {
      throw_usage(row_name + " needs " + std::to_string(width) + (counts ? " counts (one per routed expert)" :
                                                                    " experts (one per slot: routed + redundant experts)"));
    }
    std::vector<int64_t> values;
    for (const auto& v : rows[l]) {
      if (!v.is_number_integer() || v.get<int64_t>() < 0) throw_usage(row_name + " holds " + v.dump() + ", not an integer >= 0");
      values.push_back(v.get<int64_t>());
    }
    if (counts) {
      out.push_back(balanced_placement(values, slots, groups));
    } else {
      out.push_back(placement_from_slots(std::vector<int32_t>(values.begin(), values.end()), experts, row_name));
    }
  }
  return out;
}

}  // namespace servetune
