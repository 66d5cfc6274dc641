#include "common/request.h"

#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "common/dtype.h"
#include "common/list_string.h"
#include "common/request_rules.h"

namespace perseus {

int64_t TensorMeta::NumElements() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t TensorMeta::RowElements() const {
  int64_t n = 1;
  for (size_t i = 1; i < shape.size(); ++i) n *= shape[i];
  return n;
}

bool TensorMeta::FirstDimMayDiffer() const {
  return op_type == PERSEUS_ALLGATHER || op_type == PERSEUS_ALLTOALL;
}

std::string ShapeString(const std::vector<int64_t>& shape) { return ListString(shape); }

std::string TensorMeta::Difference(const TensorMeta& o) const {
  std::ostringstream d;
  if (op_type != o.op_type) {
    d << "operation " << OpTypeName(op_type) << " vs " << OpTypeName(o.op_type);
    return d.str();
  }
  if (group_size != o.group_size) {
    auto members = [](int32_t n) { return n ? std::to_string(n) + " tensors" : std::string("none"); };
    d << "group size (tensors in the grouped call) " << members(group_size) << " vs "
      << members(o.group_size);
    return d.str();
  }
  if (dtype != o.dtype) {
    d << "dtype " << DtypeName(dtype) << " vs " << DtypeName(o.dtype);
  } else if ((device == PERSEUS_CPU_DEVICE) != (o.device == PERSEUS_CPU_DEVICE)) {
    d << "device " << (device < 0 ? "CPU" : "GPU") << " vs " << (o.device < 0 ? "CPU" : "GPU");
  } else if (FirstDimMayDiffer()) {
    std::vector<int64_t> a(shape.begin() + (shape.empty() ? 0 : 1), shape.end());
    std::vector<int64_t> b(o.shape.begin() + (o.shape.empty() ? 0 : 1), o.shape.end());
    if (shape.size() != o.shape.size() || a != b)
      d << "shape beyond the first dimension " << ShapeString(shape) << " vs "
        << ShapeString(o.shape);
  } else if (shape != o.shape) {
    d << "shape " << ShapeString(shape) << " vs " << ShapeString(o.shape);
  }
  if (!d.str().empty()) return d.str();
  bool reduces = op_type == PERSEUS_ALLREDUCE || op_type == PERSEUS_REDUCESCATTER;
  if (reduces && reduce_op != o.reduce_op) {
    d << "reduce op " << ReduceOpName(reduce_op) << " vs " << ReduceOpName(o.reduce_op);
  } else if (reduces && prescale != o.prescale) {
    d << "prescale factor " << prescale << " vs " << o.prescale;
  } else if (reduces && postscale != o.postscale) {
    d << "postscale factor " << postscale << " vs " << o.postscale;
  } else if (op_type == PERSEUS_BROADCAST && root_rank != o.root_rank) {
    d << "root rank " << root_rank << " vs " << o.root_rank;
  }
  return d.str();
}

Status MakeEntry(const perseus_request_t& r, int set_rank, int set_size, EntryPtr* out) {
  auto named = [&](const Status& why) {
    return Status::Error(why.code, std::string("request '") + (r.name ? r.name : "?") + "': " +
                                       why.message);
  };
  auto bad = [&](const std::string& why) {
    return named(Status::Error(PERSEUS_INVALID_ARGUMENT, why));
  };
  if (r.name == nullptr || r.name[0] == '\0') return bad("a request needs a name");
  if (r.op_type < PERSEUS_ALLREDUCE || r.op_type > PERSEUS_JOIN) return bad("unknown operation");
  bool has_data = r.op_type != PERSEUS_BARRIER && r.op_type != PERSEUS_JOIN;
  auto e = std::make_shared<Entry>();
  TensorMeta& m = e->meta;
  m.name = r.name;
  m.op_type = r.op_type;
  m.anonymous = r.anonymous;
  m.device = r.device;
  if (r.group_size < 0) return bad("negative group size " + std::to_string(r.group_size));
  m.group_size = r.group_size > 1 ? r.group_size : 0;  // a group of one is no group
  if (has_data) {
    if (!ValidDtype(r.dtype)) return bad("unknown dtype code " + std::to_string(r.dtype));
    if (r.ndim < 0 || r.ndim > PERSEUS_MAX_DIMS || (r.ndim > 0 && r.shape == nullptr))
      return bad("invalid number of dimensions " + std::to_string(r.ndim));
    m.dtype = r.dtype;
    m.shape.assign(r.shape, r.shape + r.ndim);
    for (int64_t d : m.shape)
      if (d < 0) return bad("negative dimension in shape " + ShapeString(m.shape));
    if (m.NumElements() > 0 && r.input == nullptr) return bad("input pointer is NULL");
  }
  if (r.device < PERSEUS_CPU_DEVICE) return bad("invalid device " + std::to_string(r.device));
  // Barrier and join carry no tensor: whatever device the front end named, they are
  // control operations (a joined rank's zeros are made by the lane of the data).
  if (!has_data) m.device = PERSEUS_CPU_DEVICE;
  Status rule = CheckReduction(r.op_type, r.reduce_op, r.dtype);
  if (rule.ok()) rule = CheckDims(r.op_type, r.ndim);
  if (!rule.ok()) return named(rule);
  int64_t dim0 = m.shape.empty() ? 0 : m.shape[0];
  switch (r.op_type) {
    case PERSEUS_ALLREDUCE:
    case PERSEUS_REDUCESCATTER: {
      if (!std::isfinite(r.prescale) || !std::isfinite(r.postscale))
        return bad("scale factors must be finite");
      if (IsBitwiseOp(r.reduce_op) && (r.prescale != 1.0 || r.postscale != 1.0))
        return bad(std::string("reduce op ") + ReduceOpName(r.reduce_op) +
                   " takes no scale factors");
      m.reduce_op = r.reduce_op;
      m.prescale = r.prescale;
      m.postscale = r.postscale;
      int64_t rows = r.op_type == PERSEUS_REDUCESCATTER ? ScatterRows(dim0, set_rank, set_size)
                                                        : dim0;
      if (rows * m.RowElements() > 0 && r.output == nullptr) return bad("output pointer is NULL");
      break;
    }
    case PERSEUS_BROADCAST:
      if (r.root_rank < 0 || r.root_rank >= set_size)
        return bad("root rank " + std::to_string(r.root_rank) + " is outside [0, " +
                   std::to_string(set_size) + ")");
      m.root_rank = r.root_rank;
      if (m.NumElements() > 0 && r.output == nullptr) return bad("output pointer is NULL");
      break;
    case PERSEUS_ALLTOALL:
      rule = AlltoallSplits(dim0, r.splits, r.nsplits, set_size, &e->splits);
      if (!rule.ok()) return named(rule);
      break;
    default:
      break;
  }
  e->input = r.input;
  e->output = r.output;
  e->stream = r.stream;
  e->process_set = r.process_set;
  *out = std::move(e);
  return Status::OK();
}

void Writer::Raw(const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  bytes_.insert(bytes_.end(), c, c + n);
}

void Writer::Str(const std::string& s) {
  I32(static_cast<int32_t>(s.size()));
  Raw(s.data(), s.size());
}

void Writer::Meta(const TensorMeta& m) {
  Str(m.name);
  I32(m.op_type);
  I32(m.reduce_op);
  I32(m.dtype);
  I32(m.device);
  I32(m.root_rank);
  I32(m.anonymous);
  I32(m.group_size);
  F64(m.prescale);
  F64(m.postscale);
  I32(static_cast<int32_t>(m.shape.size()));
  for (int64_t d : m.shape) I64(d);
}

void Reader::Raw(void* out, size_t n) {
  if (p_ + n > end_) throw std::runtime_error("truncated negotiation message");
  std::memcpy(out, p_, n);
  p_ += n;
}

int32_t Reader::I32() { int32_t v; Raw(&v, sizeof v); return v; }
int64_t Reader::I64() { int64_t v; Raw(&v, sizeof v); return v; }
double Reader::F64() { double v; Raw(&v, sizeof v); return v; }

std::string Reader::Str() {
  int32_t n = I32();
  std::string s(n, '\0');
  Raw(&s[0], n);
  return s;
}

TensorMeta Reader::Meta() {
  TensorMeta m;
  m.name = Str();
  m.op_type = I32();
  m.reduce_op = I32();
  m.dtype = I32();
  m.device = I32();
  m.root_rank = I32();
  m.anonymous = I32();
  m.group_size = I32();
  m.prescale = F64();
  m.postscale = F64();
  int32_t ndim = I32();
  for (int32_t i = 0; i < ndim; ++i) m.shape.push_back(I64());
  return m;
}

}  // namespace perseus
