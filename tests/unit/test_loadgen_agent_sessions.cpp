// Agent-shaped sessions (a system message first) with the server's replies as history: the dispatcher finds a
// session's replies by role.
#include <gtest/gtest.h>

#include "loadgen/dispatcher.h"

namespace servetune::loadgen {
namespace {

// One session: a two-word system message, then turns t = 0..turns-1 asking "q t" with the dataset's reply "dataset
// reply" between them.
std::vector<datasets::SampleRequest> agent_session(int turns) {
  std::vector<datasets::SampleRequest> v;
  std::vector<ChatMessage> history = {{"system", "be brief"}};
  for (int t = 0; t < turns; ++t) {
    history.push_back({"user", "q " + std::to_string(t)});
    datasets::SampleRequest r;
    r.messages = history;
    r.session = 0;
    r.turn = t;
    v.push_back(r);
    history.push_back({"assistant", "dataset reply"});
  }
  return v;
}

RunSpec server_history_plan(const std::vector<datasets::SampleRequest>& reqs) {
  RunSpec spec;
  spec.sessions = true;
  for (const auto& r : reqs) spec.requests.push_back({&r, 0.0, 0.0});
  spec.render = [](datasets::SampleRequest& r) {
    r.prompt.clear();
    for (const auto& m : r.messages) r.prompt += m.content + "|";
  };
  return spec;
}

TEST(Dispatcher, ServerHistoryReplacesRepliesNotMessagesAfterASystemPrompt) {
  const auto reqs = agent_session(3);
  const RunSpec spec = server_history_plan(reqs);
  std::vector<RequestOutput> out(reqs.size());
  Dispatcher d(spec, out);
  ASSERT_EQ(d.next(0.0)->index, 0u);
  out[0].success = true;
  out[0].generated_text = "server said A";
  d.finished(0, 0.0);
  EXPECT_EQ(d.next(0.0)->sample->prompt, "be brief|q 0|server said A|q 1|");
  out[1].success = true;
  out[1].generated_text = "server said B";
  d.finished(1, 0.0);
  EXPECT_EQ(d.next(0.0)->sample->prompt, "be brief|q 0|server said A|q 1|server said B|q 2|");
}

}  // namespace
}  // namespace servetune::loadgen
