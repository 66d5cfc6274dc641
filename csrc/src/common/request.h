// A request as the engine keeps it, and the metadata that ranks compare.
#ifndef PERSEUS_REQUEST_H_
#define PERSEUS_REQUEST_H_

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "perseus/perseus.h"

namespace perseus {

// What every rank must agree on for one named request. Serialised during
// negotiation; for names seen before, kept in the response cache instead.
struct TensorMeta {
  std::string name;
  int32_t op_type = 0;
  int32_t reduce_op = 0;
  int32_t dtype = 0;
  int32_t device = PERSEUS_CPU_DEVICE;
  int32_t root_rank = 0;
  int32_t anonymous = 0;
  int32_t group_size = 0;  // requests in its grouped call, 0 if not grouped
  double prescale = 1.0;
  double postscale = 1.0;
  std::vector<int64_t> shape;

  int64_t NumElements() const;
  int64_t RowElements() const;  // elements per index of the first dimension
  // Allgather and alltoall may differ in the first dimension across ranks; the
  // cache and the comparison ignore it for them.
  bool FirstDimMayDiffer() const;
  // Empty when `other` describes the same collective; otherwise what differs,
  // e.g. "shape [2, 3] vs [4]".
  std::string Difference(const TensorMeta& other) const;
};

std::string ShapeString(const std::vector<int64_t>& shape);

// A request submitted on this rank, waiting for or under execution.
struct Entry {
  TensorMeta meta;
  const void* input = nullptr;
  void* output = nullptr;
  std::vector<int64_t> splits;  // alltoall
  void* stream = nullptr;
  // GPU requests: an event recorded on `stream` at enqueue, which the device lane's
  // stream waits for before reading the input (opaque here; cuda/ knows it). Returned
  // to its pool when the entry goes.
  std::shared_ptr<void> ready_event;
  int32_t process_set = 0;
  int64_t group = 0;  // grouped calls: an id shared by the group's entries on this rank, else 0
  int64_t handle = 0;
  std::chrono::steady_clock::time_point submitted;  // when the engine took it in (stall check)
};
using EntryPtr = std::shared_ptr<Entry>;

// GPU requests: the ready events recorded for one enqueue call, by device and stream
// (cuda/device_backend.h records them). The requests of one call on one stream share
// one event, since it stands for everything queued on that stream so far (161
// gradients enqueued together: one cudaEventRecord).
struct ReadyEvents {
  struct Recorded {
    int device;
    void* stream;
    std::shared_ptr<void> event;
  };
  std::vector<Recorded> recorded;
};

// Checks one request from the C ABI (the rules of request_rules.h among others) and
// converts it. Errors are INVALID_ARGUMENT, or the rule's own, after "request '<name>': ".
Status MakeEntry(const perseus_request_t& request, int set_rank, int set_size, EntryPtr* out);

// Byte streams for negotiation messages.
class Writer {
 public:
  void I32(int32_t v) { Raw(&v, sizeof v); }
  void I64(int64_t v) { Raw(&v, sizeof v); }
  void F64(double v) { Raw(&v, sizeof v); }
  void Str(const std::string& s);
  void Meta(const TensorMeta& m);
  std::vector<char>& bytes() { return bytes_; }

 private:
  void Raw(const void* p, size_t n);
  std::vector<char> bytes_;
};

class Reader {
 public:
  Reader(const char* data, size_t size) : p_(data), end_(data + size) {}
  int32_t I32();
  int64_t I64();
  double F64();
  std::string Str();
  TensorMeta Meta();
  bool done() const { return p_ >= end_; }

 private:
  void Raw(void* out, size_t n);
  const char* p_;
  const char* end_;
};

}  // namespace perseus

#endif  // PERSEUS_REQUEST_H_
