// Expert placements (EPLB's redundant experts): the trivial layout, the load-balanced one (copies to the experts
// with the most load per copy, groups packed heaviest first), copy choice by token, and the --init-expert-location
// file's checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <unistd.h>

#include "core/error.h"
#include "model/expert_placement.h"

namespace servetune {
namespace {

// Each group's load when every expert's load is shared evenly by its copies.
std::vector<double> group_loads(const ExpertPlacement& p, const std::vector<int64_t>& load, int groups) {
  std::vector<double> out(static_cast<size_t>(groups), 0.0);
  const int64_t per_group = p.slots() / groups;
  for (int64_t s = 0; s < p.slots(); ++s) {
    const int32_t e = p.slot_expert[static_cast<size_t>(s)];
    out[static_cast<size_t>(s / per_group)] += static_cast<double>(load[static_cast<size_t>(e)]) /
                                               static_cast<double>(p.copies[static_cast<size_t>(e)].size());
  }
  return out;
}

TEST(ExpertPlacement, TrivialRepeatsTheFirstExperts) {
  const ExpertPlacement p = trivial_placement(4, 6);
  EXPECT_EQ(p.slot_expert, (std::vector<int32_t>{0, 1, 2, 3, 0, 1}));
  EXPECT_EQ(p.copies[0], (std::vector<int32_t>{0, 4}));
  EXPECT_EQ(p.copies[3], (std::vector<int32_t>{3}));
  EXPECT_FALSE(p.identity());
  EXPECT_TRUE(trivial_placement(4, 4).identity());
  // Copies in turn by token: expert 0's tokens alternate between its slots, expert 3's always use its one.
  EXPECT_EQ(p.slot_for(0, 0), 0);
  EXPECT_EQ(p.slot_for(0, 1), 4);
  EXPECT_EQ(p.slot_for(0, 2), 0);
  EXPECT_EQ(p.slot_for(3, 7), 3);
}

TEST(ExpertPlacement, BalancedCopiesTheHottestAndEvensTheGroups) {
  // 8 experts, 4 extra slots, 4 groups of 3. Load per copy decides each extra slot: 600 -> expert 0 (2 copies),
  // 300 > 250 -> expert 0 (3), 250 > 200 -> expert 1 (2), 200 > 125 -> expert 0 (4).
  const std::vector<int64_t> load = {600, 250, 10, 10, 10, 10, 10, 10};
  const ExpertPlacement p = balanced_placement(load, 12, 4);
  EXPECT_EQ(p.slots(), 12);
  EXPECT_EQ(p.copies[0].size(), 4u);
  EXPECT_EQ(p.copies[1].size(), 2u);
  for (size_t e = 2; e < load.size(); ++e) EXPECT_EQ(p.copies[e].size(), 1u) << e;
  // Expert 0's four copies (150 each) go one to each group, expert 1's (125) to the first two; the light ones fill
  // up: the heaviest group carries 150 + 125 + 10.
  std::vector<int64_t> groups_of_0;
  for (const int32_t s : p.copies[0]) groups_of_0.push_back(s / 3);
  std::sort(groups_of_0.begin(), groups_of_0.end());
  EXPECT_EQ(groups_of_0, (std::vector<int64_t>{0, 1, 2, 3}));
  const auto loads = group_loads(p, load, 4);
  EXPECT_DOUBLE_EQ(*std::max_element(loads.begin(), loads.end()), 285.0);
  EXPECT_DOUBLE_EQ(std::accumulate(loads.begin(), loads.end(), 0.0), 910.0);
  // Slots in a group ordered by expert, and the same input gives the same placement.
  for (int g = 0; g < 4; ++g) EXPECT_TRUE(std::is_sorted(p.slot_expert.begin() + g * 3, p.slot_expert.begin() + g * 3 + 3));
  EXPECT_EQ(balanced_placement(load, 12, 4).slot_expert, p.slot_expert);
}

TEST(ExpertPlacement, BalancedWithoutCopiesIsABalancedPermutation) {
  // Without extra slots the experts only move between groups: the two heavy ones end up apart.
  const std::vector<int64_t> load = {100, 100, 1, 1};
  const ExpertPlacement p = balanced_placement(load, 4, 2);
  const auto loads = group_loads(p, load, 2);
  EXPECT_DOUBLE_EQ(loads[0], 101.0);
  EXPECT_DOUBLE_EQ(loads[1], 101.0);
  for (const auto& c : p.copies) EXPECT_EQ(c.size(), 1u);
}

class LocationFile : public ::testing::Test {
 protected:
  std::string write(const std::string& text) {
    const auto path = std::filesystem::temp_directory_path() / ("servetune_location_" + std::to_string(::getpid()) + ".json");
    std::ofstream(path) << text;
    path_ = path.string();
    return path_;
  }
  void TearDown() override {
    if (!path_.empty()) std::filesystem::remove(path_);
  }
  // The Error(kUsage) reading `text` throws for 2 MoE layers of 4 experts in 6 slots and 2 groups.
  std::string error(const std::string& text) {
    try {
      read_expert_location(write(text), 2, 4, 6, 2);
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
      return e.what();
    }
    ADD_FAILURE() << "no error for " << text;
    return "";
  }
  std::string path_;
};

TEST_F(LocationFile, CountsArePlacedByLoadAndMapsTakenAsGiven) {
  const auto by_load = read_expert_location(write(R"({"logical_count": [[50, 1, 1, 1], [1, 1, 1, 50]]})"), 2, 4, 6, 2);
  ASSERT_EQ(by_load.size(), 2u);
  EXPECT_EQ(by_load[0].copies[0].size(), 3u);  // 50/3 > 1: both extra slots to the hot expert
  EXPECT_EQ(by_load[1].copies[3].size(), 3u);
  const auto given = read_expert_location(write(R"({"physical_to_logical_map": [[3, 2, 1, 0, 0, 0], [0, 1, 2, 3, 0, 1]]})"), 2, 4, 6, 2);
  EXPECT_EQ(given[0].slot_expert, (std::vector<int32_t>{3, 2, 1, 0, 0, 0}));
  EXPECT_EQ(given[0].copies[0], (std::vector<int32_t>{3, 4, 5}));
  EXPECT_EQ(given[1].slot_expert, trivial_placement(4, 6).slot_expert);
}

TEST_F(LocationFile, FilesThatDoNotFitTheModelAreNamedErrors) {
  EXPECT_NE(error("not json").find("not JSON"), std::string::npos);
  EXPECT_NE(error("{}").find("needs exactly one of"), std::string::npos);
  EXPECT_NE(error(R"({"logical_count": [[1, 1, 1, 1]]})").find("one row per mixture-of-experts layer (2 in this model)"), std::string::npos);
  EXPECT_NE(error(R"({"logical_count": [[1, 1, 1], [1, 1, 1, 1]]})").find("row 0 needs 4 counts"), std::string::npos);
  EXPECT_NE(error(R"({"logical_count": [[1, -1, 1, 1], [1, 1, 1, 1]]})").find("holds -1"), std::string::npos);
  EXPECT_NE(error(R"({"physical_to_logical_map": [[0, 1, 2, 3, 0, 9], [0, 1, 2, 3, 0, 1]]})").find("slot 5 holds expert 9"), std::string::npos);
  EXPECT_NE(error(R"({"physical_to_logical_map": [[0, 1, 2, 2, 0, 1], [0, 1, 2, 3, 0, 1]]})").find("expert 3 has no slot"), std::string::npos);
  EXPECT_NE(error(R"({"physical_to_logical_map": [[0, 1, 2, 3], [0, 1, 2, 3]]})").find("needs 6 experts"), std::string::npos);
  try {
    read_expert_location("/nonexistent/location.json", 2, 4, 6, 2);
    ADD_FAILURE() << "no error for a missing file";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/location.json: cannot open"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace servetune
