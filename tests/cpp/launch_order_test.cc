// The launch order across process sets (cuda/context/launch_order.h): gated batches launch
// in the order of the grants, whichever lane thread gets there first; the global set's
// ungated batches go first; End() lets what waits go in its own set's order.
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cuda/context/launch_order.h"
#include "expect.h"

using perseus::LaunchGrant;
using perseus::gpu::CrossSetOrder;
using perseus::gpu::LaunchSequence;
using perseus::gpu::LaunchTurn;

namespace {

// What launched, in order, as "<set>.<turn>".
struct Launches {
  std::mutex mu;
  std::vector<std::string> order;
  void Add(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    order.push_back(what);
  }
  std::vector<std::string> Get() {
    std::lock_guard<std::mutex> lock(mu);
    return order;
  }
};

// A lane launching one batch: takes its turn, records, passes it.
std::thread Lane(LaunchSequence* sequence, int set, int64_t turn, bool gated, Launches* launches,
                 bool staged = false) {
  return std::thread([=] {
    LaunchTurn launch(sequence, turn, gated);
    if (!staged) launch.Take();
    launches->Add(std::to_string(set) + "." + std::to_string(turn));
  });
}

void Settle() { std::this_thread::sleep_for(std::chrono::milliseconds(50)); }

std::string Join(const std::vector<std::string>& parts) {
  std::string out;
  for (const std::string& p : parts) out += (out.empty() ? "" : " ") + p;
  return out;
}

void GrantsOrderSetsWhoeverComesFirst(bool a_first) {
  auto across = std::make_shared<CrossSetOrder>();
  LaunchSequence a(1, across), b(2, across);
  across->Begin(0);
  Launches launches;
  std::thread lane_b = Lane(&b, 2, 0, true, &launches);  // b's lane gets there first
  Settle();
  std::thread lane_a = Lane(&a, 1, 0, true, &launches);
  Settle();
  Expect(launches.Get().empty(), "a gated batch launched before any grant: " + Join(launches.Get()));
  if (a_first) across->Grant({LaunchGrant{1, 0, 1}, LaunchGrant{2, 0, 1}});
  else across->Grant({LaunchGrant{2, 0, 1}, LaunchGrant{1, 0, 1}});
  lane_a.join();
  lane_b.join();
  const std::string want = a_first ? "1.0 2.0" : "2.0 1.0";
  Expect(Join(launches.Get()) == want, "launched " + Join(launches.Get()) + ", granted " + want);
}

void UngatedGlobalBatchesGoFirst() {
  auto across = std::make_shared<CrossSetOrder>();
  LaunchSequence global(0, across), other(3, across);
  across->Begin(2);  // the global set's turns 0 and 1 were agreed before the order began
  across->Grant({LaunchGrant{3, 0, 1}, LaunchGrant{0, 2, 3}});
  Launches launches;
  std::thread gated = Lane(&other, 3, 0, true, &launches);
  Settle();
  Expect(launches.Get().empty(), "a gated batch launched before the ungated ones: " + Join(launches.Get()));
  std::thread last = Lane(&global, 0, 2, true, &launches);
  std::thread first = Lane(&global, 0, 0, false, &launches, /*staged=*/true);
  first.join();
  std::thread second = Lane(&global, 0, 1, false, &launches);
  second.join();
  gated.join();
  last.join();
  Expect(Join(launches.Get()) == "0.0 0.1 3.0 0.2", "launched " + Join(launches.Get()));
}

void EndLetsWaitersGoInTheirSetsOrder() {
  auto across = std::make_shared<CrossSetOrder>();
  LaunchSequence a(1, across);
  across->Begin(0);
  Launches launches;
  std::thread second = Lane(&a, 1, 1, true, &launches);
  std::thread first = Lane(&a, 1, 0, true, &launches);
  Settle();
  Expect(launches.Get().empty(), "launched without grants: " + Join(launches.Get()));
  across->End();
  first.join();
  second.join();
  Expect(Join(launches.Get()) == "1.0 1.1", "after End, launched " + Join(launches.Get()));
}

}  // namespace

int main() {
  GrantsOrderSetsWhoeverComesFirst(true);
  GrantsOrderSetsWhoeverComesFirst(false);
  UngatedGlobalBatchesGoFirst();
  EndLetsWaitersGoInTheirSetsOrder();
  return Verdict();
}
