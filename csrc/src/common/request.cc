#include "common/request.h"

#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include "common/dtype.h"
#include "common/list_string.h"

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
  auto bad = [&](const std::string& why) {
    return Status::Error(PERSEUS_INVALID_ARGUMENT,
                         std::string("request '") + (r.name ? r.name : "?") + "': " + why);
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
  switch (r.op_type) {
    case PERSEUS_ALLREDUCE:
    case PERSEUS_REDUCESCATTER:
      if (r.reduce_op < PERSEUS_SUM || r.reduce_op > PERSEUS_ADASUM)
        return bad("unknown reduce op " + std::to_string(r.reduce_op));
      if (r.dtype == PERSEUS_BOOL) return bad("bool tensors cannot be reduced");
      if (r.reduce_op == PERSEUS_ADASUM && r.op_type == PERSEUS_REDUCESCATTER)
        return Status::Error(PERSEUS_UNSUPPORTED, std::string("request '") + r.name +
                                                      "': Adasum is not supported for reducescatter");
      if (r.reduce_op == PERSEUS_ADASUM && !IsFloatingDtype(r.dtype))
        return bad(std::string("Adasum needs a floating-point tensor (float16, bfloat16, "
                               "float32 or float64), got ") + DtypeName(r.dtype));
      if (!std::isfinite(r.prescale) || !std::isfinite(r.postscale))
        return bad("scale factors must be finite");
      m.reduce_op = r.reduce_op;
      m.prescale = r.prescale;
      m.postscale = r.postscale;
      if (r.op_type == PERSEUS_REDUCESCATTER) {
        if (m.shape.empty()) return bad("reducescatter needs at least one dimension");
        int64_t rows = m.shape[0] / set_size + (set_rank < m.shape[0] % set_size ? 1 : 0);
        if (rows * m.RowElements() > 0 && r.output == nullptr) return bad("output pointer is NULL");
      } else if (m.NumElements() > 0 && r.output == nullptr) {
        return bad("output pointer is NULL");
      }
      break;
    case PERSEUS_BROADCAST:
      if (r.root_rank < 0 || r.root_rank >= set_size)
        return bad("root rank " + std::to_string(r.root_rank) + " is outside [0, " +
                   std::to_string(set_size) + ")");
      m.root_rank = r.root_rank;
      if (m.NumElements() > 0 && r.output == nullptr) return bad("output pointer is NULL");
      break;
    case PERSEUS_ALLGATHER:
      if (m.shape.empty()) return bad("allgather needs at least one dimension");
      break;
    case PERSEUS_ALLTOALL: {
      if (m.shape.empty()) return bad("alltoall needs at least one dimension");
      if (r.splits == nullptr || r.nsplits == 0) {
        if (m.shape[0] % set_size != 0)
          return bad("first dimension " + std::to_string(m.shape[0]) +
                     " is not divisible by the process set size " + std::to_string(set_size) +
                     "; pass splits");
        e->splits.assign(set_size, m.shape[0] / set_size);
      } else {
        if (r.nsplits != set_size)
          return bad("splits has " + std::to_string(r.nsplits) + " entries, expected " +
                     std::to_string(set_size));
        e->splits.assign(r.splits, r.splits + r.nsplits);
        int64_t total = 0;
        for (int64_t s : e->splits) {
          if (s < 0) return bad("splits must be non-negative");
          total += s;
        }
        if (total != m.shape[0])
          return bad("splits sum to " + std::to_string(total) + " but the first dimension is " +
                     std::to_string(m.shape[0]));
      }
      break;
    }
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
