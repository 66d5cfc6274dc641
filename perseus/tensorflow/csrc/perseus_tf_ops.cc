// TensorFlow ops over the Perseus C ABI (perseus/perseus.h).
//
// One asynchronous kernel serves every collective, eagerly and inside tf.function:
// ComputeAsync turns its input tensors into perseus_request_t records, enqueues
// them in ONE perseus_enqueue call (so a grouped op is negotiated as one unit) and
// returns at once; the core calls back when the handles complete
// (perseus_on_complete) and the callback finishes the op (copying core-allocated
// outputs, or setting the error) before done().
// The thread that runs the kernel first drives the engine itself (drive_s > 0,
// perseus_enqueue_and_drive): a small collective then completes, done() included,
// on that thread, with no hand-off to the engine thread and back.
// The kernel fills perseus_request_t itself (no Python runs on this path), from what
// the Python side decided with perseus.common.builder (names, set id, root); the
// rules on requests are the core's: it asks the core for a reducescatter's rows
// (perseus_check_rows), and perseus_enqueue refuses what breaks the others.
// Names arrive as a string tensor, not an attribute:
// eager mode caches one kernel per attribute set, and unnamed eager calls get a
// new name each time.
//
// Built on first use by perseus/tensorflow/op_library.py against the installed
// TensorFlow, linked to libperseus.so.

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "perseus/perseus.h"
#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"

namespace {

using tensorflow::AsyncOpKernel;
using tensorflow::DataType;
using tensorflow::OpKernelConstruction;
using tensorflow::OpKernelContext;
using tensorflow::Tensor;
using tensorflow::TensorShape;
using tensorflow::shape_inference::InferenceContext;

// The one TF dtype -> core dtype table of the op library.
bool CoreDtype(DataType dtype, int32_t* code) {
  switch (dtype) {
    case tensorflow::DT_UINT8: *code = PERSEUS_UINT8; return true;
    // The core has no uint16; only the ops that move bits without arithmetic
    // (allgather, broadcast, alltoall: PERSEUS_MOVE_TYPES) accept it, as int16.
    case tensorflow::DT_UINT16: *code = PERSEUS_INT16; return true;
    case tensorflow::DT_INT8: *code = PERSEUS_INT8; return true;
    case tensorflow::DT_INT16: *code = PERSEUS_INT16; return true;
    case tensorflow::DT_INT32: *code = PERSEUS_INT32; return true;
    case tensorflow::DT_INT64: *code = PERSEUS_INT64; return true;
    case tensorflow::DT_HALF: *code = PERSEUS_FLOAT16; return true;
    case tensorflow::DT_BFLOAT16: *code = PERSEUS_BFLOAT16; return true;
    case tensorflow::DT_FLOAT: *code = PERSEUS_FLOAT32; return true;
    case tensorflow::DT_DOUBLE: *code = PERSEUS_FLOAT64; return true;
    case tensorflow::DT_BOOL: *code = PERSEUS_BOOL; return true;
    default: return false;
  }
}

// A core status as a TensorFlow error, so Python sees tf.errors.* (OpError).
absl::Status ToStatus(perseus_status_t status, const std::string& message) {
  std::string text = message.empty() ? perseus_status_string(status) : message;
  switch (status) {
    case PERSEUS_SUCCESS: return absl::OkStatus();
    case PERSEUS_INVALID_ARGUMENT:
    case PERSEUS_CONFIG_ERROR: return absl::InvalidArgumentError(text);
    case PERSEUS_NOT_INITIALIZED:
      return absl::FailedPreconditionError(text + "; call hvd.init() first");
    case PERSEUS_MISMATCH:
    case PERSEUS_NON_FINITE: return absl::FailedPreconditionError(text);
    case PERSEUS_UNSUPPORTED: return absl::UnimplementedError(text);
    case PERSEUS_SHUT_DOWN:
    case PERSEUS_RANK_FAILED: return absl::AbortedError(text);
    case PERSEUS_TIMEOUT:
    case PERSEUS_WITHDRAWN: return absl::DeadlineExceededError(text);
    default: return absl::InternalError(text);
  }
}

// What runs when a batch's handles complete (perseus_on_complete's argument).
using Completion = std::function<void(perseus_status_t, const std::string&)>;

// True while this thread runs a completion: it may be the engine's own thread, deep
// inside the engine, where a kernel that TensorFlow runs inline from done() must
// only enqueue, not drive the engine again.
thread_local bool in_completion = false;

void RunCompletion(void* arg, perseus_status_t status, const char* message) {
  std::unique_ptr<Completion> completion(static_cast<Completion*>(arg));
  in_completion = true;
  (*completion)(status, message ? message : "");
  in_completion = false;
}

// Everything the core may read until the handles complete.
struct Batch {
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<int64_t> splits;
  std::vector<perseus_request_t> requests;
  std::vector<Tensor> inputs;  // keeps input buffers alive
  std::vector<int32_t> dtypes;
  std::vector<int64_t> handles;
};

// PerseusAllreduce / Allgather / Broadcast / Reducescatter: N tensors in, N out,
// then one string per tensor with its wire name.
class CollectiveOp : public AsyncOpKernel {
 public:
  CollectiveOp(OpKernelConstruction* ctx, int32_t op_type)
      : AsyncOpKernel(ctx), op_type_(op_type) {
    OP_REQUIRES_OK(ctx, ctx->GetAttr("process_set", &process_set_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("anonymous", &anonymous_));
    OP_REQUIRES_OK(ctx, ctx->GetAttr("drive_s", &drive_s_));
    if (op_type == PERSEUS_ALLREDUCE || op_type == PERSEUS_REDUCESCATTER) {
      OP_REQUIRES_OK(ctx, ctx->GetAttr("reduce_op", &reduce_op_));
      OP_REQUIRES_OK(ctx, ctx->GetAttr("prescale", &prescale_));
      OP_REQUIRES_OK(ctx, ctx->GetAttr("postscale", &postscale_));
    }
    if (op_type == PERSEUS_BROADCAST) {
      OP_REQUIRES_OK(ctx, ctx->GetAttr("root_rank", &root_rank_));
    }
  }

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const int n = ctx->num_inputs() - 1;
    const Tensor& names = ctx->input(n);
    OP_REQUIRES_ASYNC(ctx, names.NumElements() == n,
                      absl::InvalidArgumentError("one name per tensor is needed"), done);
    auto batch = std::make_shared<Batch>();
    batch->names.resize(n);
    batch->shapes.resize(n);
    batch->requests.resize(n);
    batch->dtypes.resize(n);
    batch->handles.resize(n);
    for (int i = 0; i < n; ++i) {
      const Tensor& input = ctx->input(i);
      int32_t code;
      OP_REQUIRES_ASYNC(ctx, CoreDtype(input.dtype(), &code),
                        absl::InvalidArgumentError("Perseus does not support tensors of dtype " +
                                                   tensorflow::DataTypeString(input.dtype())),
                        done);
      batch->dtypes[i] = code;
      batch->names[i] = names.flat<tensorflow::tstring>()(i);
      for (int d = 0; d < input.dims(); ++d) batch->shapes[i].push_back(input.dim_size(d));
      void* output = nullptr;
      if (op_type_ == PERSEUS_ALLREDUCE || op_type_ == PERSEUS_BROADCAST) {
        // In place when nothing else reads the input (the core handles input ==
        // output): no output allocation and no input -> output copy. Before the
        // batch takes its reference, which would make the buffer look shared.
        Tensor* out = nullptr;
        OP_REQUIRES_OK_ASYNC(ctx, ctx->forward_input_or_allocate_output({i}, i, input.shape(), &out),
                             done);
        output = const_cast<char*>(out->tensor_data().data());
      } else if (op_type_ == PERSEUS_REDUCESCATTER) {
        // This rank's share of dim 0, as the core splits it (and refuses a scalar).
        int64_t rows = 0;
        perseus_status_t s = perseus_check_rows(op_type_, process_set_, input.dims(),
                                                input.dims() ? input.dim_size(0) : 0, nullptr,
                                                0, &rows);
        OP_REQUIRES_OK_ASYNC(ctx, ToStatus(s, s ? perseus_last_error() : ""), done);
        TensorShape shape = input.shape();
        shape.set_dim(0, rows);
        Tensor* out = nullptr;
        OP_REQUIRES_OK_ASYNC(ctx, ctx->allocate_output(i, shape, &out), done);
        output = const_cast<char*>(out->tensor_data().data());
      }
      // Allgather: output stays NULL; the core sizes and allocates it.
      batch->inputs.push_back(input);
      perseus_request_t& r = batch->requests[i];
      r.op_type = op_type_;
      r.reduce_op = reduce_op_;
      r.dtype = code;
      r.device = PERSEUS_CPU_DEVICE;
      r.ndim = input.dims();
      r.input = input.tensor_data().data();
      r.output = output;
      r.prescale = prescale_;
      r.postscale = postscale_;
      r.root_rank = root_rank_;
      r.process_set = process_set_;
      r.splits = nullptr;
      r.nsplits = 0;
      r.anonymous = anonymous_ ? 1 : 0;
      r.stream = nullptr;
      // Ranks agree on a group's size: one with fewer tensors must fail, not finish.
      r.group_size = n;
    }
    // Pointers into the vectors only once they stop growing.
    for (int i = 0; i < n; ++i) {
      batch->requests[i].name = batch->names[i].c_str();
      batch->requests[i].shape = batch->shapes[i].data();
    }
    std::function<absl::Status()> finish;
    if (op_type_ == PERSEUS_ALLGATHER) {  // the core allocated the outputs: copy them
      finish = [ctx, batch]() {
        for (size_t i = 0; i < batch->handles.size(); ++i) {
          absl::Status s = CopyCoreOutput(ctx, static_cast<int>(i), batch->handles[i], nullptr);
          if (!s.ok()) return s;
        }
        return absl::OkStatus();
      };
    }
    Submit(ctx, std::move(done), batch, std::move(finish));
  }

 protected:
  // Enqueues the batch; once every handle has completed, finish() fills the
  // outputs (unless a request failed), the handles are released and done() runs.
  // drive_s > 0: this thread first runs the engine itself for up to drive_s (the
  // Python side picks it: long eagerly, short in graphs, mpi_ops.GRAPH_DRIVE_S) and
  // completes inline when the result is in; no thread hand-off on that path.
  // Otherwise (or if the peers are late) the core's completing thread does.
  void Submit(OpKernelContext* ctx, DoneCallback done, std::shared_ptr<Batch> batch,
              std::function<absl::Status()> finish) {
    const int n = static_cast<int>(batch->requests.size());
    perseus_status_t status =
        drive_s_ > 0 && !in_completion ? perseus_enqueue_and_drive(batch->requests.data(), n,
                                                 batch->handles.data(), drive_s_)
                     : perseus_enqueue(batch->requests.data(), n, batch->handles.data());
    OP_REQUIRES_OK_ASYNC(ctx, ToStatus(status, status ? perseus_last_error() : ""), done);
    auto complete = [ctx, done, batch, finish](perseus_status_t failure,
                                               const std::string& message) {
      if (failure != PERSEUS_SUCCESS) {
        ctx->SetStatus(ToStatus(failure, message));
      } else if (finish) {
        absl::Status s = finish();
        if (!s.ok()) ctx->SetStatus(s);
      }
      for (int64_t handle : batch->handles) perseus_release(handle);
      done();
    };
    // The core calls back once all are done (inline if they already are); it also
    // learns that someone waits, so it does not hold them as a backward's gradients.
    auto completion = new Completion(std::move(complete));
    status = perseus_on_complete(batch->handles.data(), n, RunCompletion, completion);
    if (status != PERSEUS_SUCCESS) {
      std::unique_ptr<Completion> never_called(completion);
      (*never_called)(status, perseus_last_error());
    }
  }

  // Moves a completed handle's core-allocated output into output `index`;
  // recv_splits (alltoall) receives the rows from each rank when not null.
  static absl::Status CopyCoreOutput(OpKernelContext* ctx, int index, int64_t handle,
                                     std::vector<int64_t>* recv_splits) {
    void* data = nullptr;
    int64_t dims[PERSEUS_MAX_DIMS];
    int32_t ndim = 0;
    const int64_t* splits = nullptr;
    int32_t nsplits = 0;
    perseus_status_t status =
        perseus_handle_output(handle, &data, dims, &ndim, &splits, &nsplits);
    if (status != PERSEUS_SUCCESS) return ToStatus(status, perseus_last_error());
    std::unique_ptr<void, void (*)(void*)> owned(data, perseus_free_buffer);
    TensorShape shape;
    for (int d = 0; d < ndim; ++d) shape.AddDim(dims[d]);
    Tensor* out = nullptr;
    absl::Status s = ctx->allocate_output(index, shape, &out);
    if (!s.ok()) return s;
    size_t bytes = out->tensor_data().size();
    if (bytes > 0) {
      if (data == nullptr) return absl::InternalError("the core returned no output buffer");
      std::memcpy(const_cast<char*>(out->tensor_data().data()), data, bytes);
    }
    if (recv_splits != nullptr && splits != nullptr) recv_splits->assign(splits, splits + nsplits);
    return absl::OkStatus();
  }

  int32_t op_type_;
  int32_t process_set_ = 0;
  bool anonymous_ = false;
  float drive_s_ = 0.0f;
  int32_t reduce_op_ = 0;
  float prescale_ = 1.0f;
  float postscale_ = 1.0f;
  int32_t root_rank_ = 0;
};

// These kernels differ only in the op type they submit.
template <int32_t kOpType>
class TypedCollectiveOp : public CollectiveOp {
 public:
  explicit TypedCollectiveOp(OpKernelConstruction* ctx) : CollectiveOp(ctx, kOpType) {}
};
using AllreduceOp = TypedCollectiveOp<PERSEUS_ALLREDUCE>;
using AllgatherOp = TypedCollectiveOp<PERSEUS_ALLGATHER>;
using BroadcastOp = TypedCollectiveOp<PERSEUS_BROADCAST>;
using ReducescatterOp = TypedCollectiveOp<PERSEUS_REDUCESCATTER>;

// PerseusAlltoall(tensor, splits, name) -> (output, received_splits).
class AlltoallOp : public CollectiveOp {
 public:
  explicit AlltoallOp(OpKernelConstruction* ctx) : CollectiveOp(ctx, PERSEUS_ALLTOALL) {}

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    const Tensor& input = ctx->input(0);
    const Tensor& splits = ctx->input(1);
    const Tensor& name = ctx->input(2);
    auto batch = std::make_shared<Batch>();
    int32_t code;
    OP_REQUIRES_ASYNC(ctx, CoreDtype(input.dtype(), &code),
                      absl::InvalidArgumentError("Perseus does not support tensors of dtype " +
                                                 tensorflow::DataTypeString(input.dtype())),
                      done);
    batch->inputs.push_back(input);
    batch->names.push_back(name.scalar<tensorflow::tstring>()());
    batch->shapes.emplace_back();
    for (int d = 0; d < input.dims(); ++d) batch->shapes[0].push_back(input.dim_size(d));
    auto flat = splits.flat<int32_t>();
    for (int64_t i = 0; i < flat.size(); ++i) batch->splits.push_back(flat(i));
    batch->requests.resize(1);
    batch->handles.resize(1);
    perseus_request_t& r = batch->requests[0];
    r.name = batch->names[0].c_str();
    r.op_type = PERSEUS_ALLTOALL;
    r.reduce_op = 0;
    r.dtype = code;
    r.device = PERSEUS_CPU_DEVICE;
    r.ndim = input.dims();
    r.shape = batch->shapes[0].data();
    r.input = input.tensor_data().data();
    r.output = nullptr;
    r.prescale = r.postscale = 1.0;
    r.root_rank = 0;
    r.process_set = process_set_;
    r.splits = batch->splits.empty() ? nullptr : batch->splits.data();  // empty: even split
    r.nsplits = static_cast<int32_t>(batch->splits.size());
    r.anonymous = anonymous_ ? 1 : 0;
    r.stream = nullptr;
    Submit(ctx, std::move(done), batch, [ctx, batch]() {
      std::vector<int64_t> recv;
      absl::Status s = CopyCoreOutput(ctx, 0, batch->handles[0], &recv);
      Tensor* out = nullptr;
      if (s.ok()) {
        s = ctx->allocate_output(1, TensorShape({static_cast<int64_t>(recv.size())}), &out);
      }
      if (s.ok()) {
        for (size_t i = 0; i < recv.size(); ++i) out->flat<int32_t>()(i) = recv[i];
      }
      return s;
    });
  }
};

// PerseusJoin(name) -> last rank to join; PerseusBarrier(name). No tensors.
class SignalOp : public CollectiveOp {
 public:
  SignalOp(OpKernelConstruction* ctx, int32_t op_type) : CollectiveOp(ctx, op_type) {}

  void ComputeAsync(OpKernelContext* ctx, DoneCallback done) override {
    auto batch = std::make_shared<Batch>();
    batch->names.push_back(ctx->input(0).scalar<tensorflow::tstring>()());
    batch->shapes.emplace_back();
    batch->requests.resize(1);
    batch->handles.resize(1);
    perseus_request_t& r = batch->requests[0];
    r = perseus_request_t{};
    r.name = batch->names[0].c_str();
    r.op_type = op_type_;
    r.dtype = PERSEUS_UINT8;
    r.device = PERSEUS_CPU_DEVICE;
    r.shape = batch->shapes[0].data();
    r.prescale = r.postscale = 1.0;
    r.process_set = process_set_;
    r.anonymous = anonymous_ ? 1 : 0;
    std::function<absl::Status()> finish;
    if (op_type_ == PERSEUS_JOIN) {
      finish = [ctx, batch]() {
        // The core reports the last rank to join as the output's shape[0].
        void* data = nullptr;
        int64_t dims[PERSEUS_MAX_DIMS];
        int32_t ndim = 0;
        const int64_t* splits = nullptr;
        int32_t nsplits = 0;
        perseus_status_t s =
            perseus_handle_output(batch->handles[0], &data, dims, &ndim, &splits, &nsplits);
        if (data != nullptr) perseus_free_buffer(data);
        if (s != PERSEUS_SUCCESS) return ToStatus(s, perseus_last_error());
        if (ndim < 1) return absl::InternalError("join reported no last rank");
        Tensor* out = nullptr;
        absl::Status st = ctx->allocate_output(0, TensorShape({}), &out);
        if (st.ok()) out->scalar<int32_t>()() = static_cast<int32_t>(dims[0]);
        return st;
      };
    }
    Submit(ctx, std::move(done), batch, std::move(finish));
  }
};

class JoinOp : public SignalOp {
 public:
  explicit JoinOp(OpKernelConstruction* ctx) : SignalOp(ctx, PERSEUS_JOIN) {}
};
class BarrierOp : public SignalOp {
 public:
  explicit BarrierOp(OpKernelConstruction* ctx) : SignalOp(ctx, PERSEUS_BARRIER) {}
};

// ---- shapes -----------------------------------------------------------------------

absl::Status SameShapes(InferenceContext* c) {
  for (int i = 0; i < c->num_outputs(); ++i) c->set_output(i, c->input(i));
  return absl::OkStatus();
}

// Outputs whose dim 0 depends on other ranks.
absl::Status UnknownFirstDim(InferenceContext* c) {
  for (int i = 0; i < c->num_outputs(); ++i) {
    tensorflow::shape_inference::ShapeHandle shape = c->input(i);
    if (c->RankKnown(shape) && c->Rank(shape) >= 1) {
      TF_RETURN_IF_ERROR(c->ReplaceDim(shape, 0, c->UnknownDim(), &shape));
      c->set_output(i, shape);
    } else {
      c->set_output(i, c->UnknownShape());
    }
  }
  return absl::OkStatus();
}

#define PERSEUS_TYPES "{uint8, int8, int16, int32, int64, half, bfloat16, float, double, bool}"
// Ops that only move data also take uint16, as Horovod's allgather/broadcast/alltoall.
#define PERSEUS_MOVE_TYPES \
  "{uint8, int8, uint16, int16, int32, int64, half, bfloat16, float, double, bool}"

// rank_op() and friends: scalars read when the graph runs, not when it is built.
enum TopologyQuery { kRank, kSize, kLocalRank, kLocalSize, kProcessSetIncluded };

// Horovod's process_set_included_op() codes for "not initialized" and "unknown set".
constexpr int32_t kProcessSetErrorInit = -1;
constexpr int32_t kProcessSetErrorUnknownSet = -3;

template <TopologyQuery kQuery>
class TopologyOp : public tensorflow::OpKernel {
 public:
  explicit TopologyOp(OpKernelConstruction* ctx) : OpKernel(ctx) {
    if (kQuery == kSize || kQuery == kProcessSetIncluded) {
      OP_REQUIRES_OK(ctx, ctx->GetAttr("process_set", &process_set_));
    }
  }

  void Compute(OpKernelContext* ctx) override {
    int32_t value = 0;
    perseus_status_t status = PERSEUS_SUCCESS;
    switch (kQuery) {
      case kRank: status = perseus_rank(&value); break;
      case kSize: status = perseus_process_set_size(process_set_, &value); break;
      case kLocalRank: status = perseus_local_rank(&value); break;
      case kLocalSize: status = perseus_local_size(&value); break;
      case kProcessSetIncluded:  // a code, never an error, as Horovod
        if (!perseus_is_initialized()) {
          value = kProcessSetErrorInit;
        } else if (perseus_process_set_rank(process_set_, &value) != PERSEUS_SUCCESS) {
          value = kProcessSetErrorUnknownSet;
        } else {
          value = value >= 0 ? 1 : 0;
        }
        break;
    }
    OP_REQUIRES_OK(ctx, ToStatus(status, status ? perseus_last_error() : ""));
    Tensor* out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({}), &out));
    out->scalar<int32_t>()() = value;
  }

 private:
  int32_t process_set_ = 0;
};

absl::Status ScalarShape(InferenceContext* c) {
  c->set_output(0, c->Scalar());
  return absl::OkStatus();
}

}  // namespace

// Stateful: two identical collectives must both run (no CSE), and none is pruned.
REGISTER_OP("PerseusAllreduce")
    .Attr("T: list(" PERSEUS_TYPES ") >= 1")
    .Attr("reduce_op: int")
    .Attr("prescale: float = 1.0")
    .Attr("postscale: float = 1.0")
    .Attr("process_set: int = 0")
    .Attr("anonymous: bool = false")
    .Attr("drive_s: float = 0.0")
    .Input("tensors: T")
    .Input("names: string")
    .Output("outputs: T")
    .SetIsStateful()
    .SetShapeFn(SameShapes);

REGISTER_OP("PerseusAllgather")
    .Attr("T: list(" PERSEUS_MOVE_TYPES ") >= 1")
    .Attr("process_set: int = 0")
    .Attr("anonymous: bool = false")
    .Attr("drive_s: float = 0.0")
    .Input("tensors: T")
    .Input("names: string")
    .Output("outputs: T")
    .SetIsStateful()
    .SetShapeFn(UnknownFirstDim);

REGISTER_OP("PerseusBroadcast")
    .Attr("T: list(" PERSEUS_MOVE_TYPES ") >= 1")
    .Attr("root_rank: int")
    .Attr("process_set: int = 0")
    .Attr("anonymous: bool = false")
    .Attr("drive_s: float = 0.0")
    .Input("tensors: T")
    .Input("names: string")
    .Output("outputs: T")
    .SetIsStateful()
    .SetShapeFn(SameShapes);

REGISTER_OP("PerseusReducescatter")
    .Attr("T: list(" PERSEUS_TYPES ") >= 1")
    .Attr("reduce_op: int")
    .Attr("prescale: float = 1.0")
    .Attr("postscale: float = 1.0")
    .Attr("process_set: int = 0")
    .Attr("anonymous: bool = false")
    .Attr("drive_s: float = 0.0")
    .Input("tensors: T")
    .Input("names: string")
    .Output("outputs: T")
    .SetIsStateful()
    .SetShapeFn(UnknownFirstDim);

REGISTER_OP("PerseusAlltoall")
    .Attr("T: " PERSEUS_MOVE_TYPES)
    .Attr("process_set: int = 0")
    .Attr("anonymous: bool = false")
    .Attr("drive_s: float = 0.0")
    .Input("tensor: T")
    .Input("splits: int32")
    .Input("request_name: string")
    .Output("output: T")
    .Output("received_splits: int32")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      TF_RETURN_IF_ERROR(UnknownFirstDim(c));
      c->set_output(1, c->Vector(c->UnknownDim()));
      return absl::OkStatus();
    });

REGISTER_OP("PerseusJoin")
    .Attr("process_set: int = 0")
    .Attr("anonymous: bool = true")
    .Attr("drive_s: float = 0.0")
    .Input("request_name: string")
    .Output("last_rank: int32")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) {
      c->set_output(0, c->Scalar());
      return absl::OkStatus();
    });

REGISTER_OP("PerseusBarrier")
    .Attr("process_set: int = 0")
    .Attr("anonymous: bool = true")
    .Attr("drive_s: float = 0.0")
    .Input("request_name: string")
    .SetIsStateful()
    .SetShapeFn([](InferenceContext* c) { return absl::OkStatus(); });

// Stateful, so that no graph optimisation folds them into the values at build time.
REGISTER_OP("PerseusRank").Output("rank: int32").SetIsStateful().SetShapeFn(ScalarShape);
REGISTER_OP("PerseusLocalRank").Output("rank: int32").SetIsStateful().SetShapeFn(ScalarShape);
REGISTER_OP("PerseusLocalSize").Output("size: int32").SetIsStateful().SetShapeFn(ScalarShape);
REGISTER_OP("PerseusSize")
    .Attr("process_set: int = 0")
    .Output("size: int32")
    .SetIsStateful()
    .SetShapeFn(ScalarShape);
REGISTER_OP("PerseusProcessSetIncluded")
    .Attr("process_set: int = 0")
    .Output("included: int32")
    .SetIsStateful()
    .SetShapeFn(ScalarShape);

REGISTER_KERNEL_BUILDER(Name("PerseusAllreduce").Device(tensorflow::DEVICE_CPU), AllreduceOp);
REGISTER_KERNEL_BUILDER(Name("PerseusAllgather").Device(tensorflow::DEVICE_CPU), AllgatherOp);
REGISTER_KERNEL_BUILDER(Name("PerseusBroadcast").Device(tensorflow::DEVICE_CPU), BroadcastOp);
REGISTER_KERNEL_BUILDER(Name("PerseusReducescatter").Device(tensorflow::DEVICE_CPU),
                        ReducescatterOp);
REGISTER_KERNEL_BUILDER(Name("PerseusAlltoall").Device(tensorflow::DEVICE_CPU), AlltoallOp);
REGISTER_KERNEL_BUILDER(Name("PerseusJoin").Device(tensorflow::DEVICE_CPU), JoinOp);
REGISTER_KERNEL_BUILDER(Name("PerseusBarrier").Device(tensorflow::DEVICE_CPU), BarrierOp);
REGISTER_KERNEL_BUILDER(Name("PerseusRank").Device(tensorflow::DEVICE_CPU), TopologyOp<kRank>);
REGISTER_KERNEL_BUILDER(Name("PerseusSize").Device(tensorflow::DEVICE_CPU), TopologyOp<kSize>);
REGISTER_KERNEL_BUILDER(Name("PerseusLocalRank").Device(tensorflow::DEVICE_CPU),
                        TopologyOp<kLocalRank>);
REGISTER_KERNEL_BUILDER(Name("PerseusLocalSize").Device(tensorflow::DEVICE_CPU),
                        TopologyOp<kLocalSize>);
REGISTER_KERNEL_BUILDER(Name("PerseusProcessSetIncluded").Device(tensorflow::DEVICE_CPU),
                        TopologyOp<kProcessSetIncluded>);
