// Where a mixture-of-experts layer's experts live with expert parallelism: its physical expert slots (the routed
// experts plus SGLang's --ep-num-redundant-experts extra copies) split into ep_size contiguous groups, each slot
// holding one logical expert, and which copy each routed assignment uses. Model-free, so the placement algorithms
// are tested alone.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace servetune {

struct ExpertPlacement {
  std::vector<int32_t> slot_expert;          // [slot] -> the logical expert it holds
  std::vector<std::vector<int32_t>> copies;  // [logical expert] -> the slots holding it, ascending

  int64_t slots() const { return static_cast<int64_t>(slot_expert.size()); }
  bool identity() const;  // every slot holds the expert of its own index, one copy each
  // The copy an assignment of `expert` uses: copies in turn by `key` (a token's index), so a hot expert's tokens
  // spread evenly over its copies; every rank that computes the same key picks the same copy.
  int32_t slot_for(int32_t expert, int64_t key) const {
    const auto& c = copies[static_cast<size_t>(expert)];
    return c[static_cast<size_t>(key % static_cast<int64_t>(c.size()))];
  }
};

// Builds `copies` from `slot_expert`; throws Error(kUsage) naming `what` when a slot holds no expert of `experts`
// or an expert has no slot.
ExpertPlacement placement_from_slots(std::vector<int32_t> slot_expert, int64_t experts, const std::string& what);

// SGLang's trivial placement: slot s holds expert s mod `experts` (the redundant slots repeat the first experts).
ExpertPlacement trivial_placement(int64_t experts, int64_t slots);

// DeepSeek's EPLB for one layer from its measured load per logical expert: the redundant slots go one at a time to
// the expert with the highest load per copy; then the copies (each carrying its expert's load / copies), heaviest
// first, go to the group of `groups` with the least load that still has a free slot (groups of slots / groups).
// Slots within a group are ordered by expert. Deterministic (ties by the lower expert, then group).
ExpertPlacement balanced_placement(const std::vector<int64_t>& load, int64_t slots, int groups);

// The --init-expert-location file: JSON with "logical_count" ([moe layer][expert] measured assignments, as
// `servetune bench --expert-distribution-out` writes them; placed by balanced_placement) or
// "physical_to_logical_map" ([moe layer][slot], used as given). One placement per MoE layer, in layer order; throws
// Error(kUsage) naming `path` and the key for a file that does not fit the model (layers, experts, slots).
std::vector<ExpertPlacement> read_expert_location(const std::string& path, int64_t moe_layers, int64_t experts, int64_t slots,
                                                  int groups);

}  // namespace servetune
