// Perseus requests as asynchronous operations of MXNet's dependency engine.
//
// Python (perseus/mxnet/engine.py) packs a batch of perseus_request_t records with
// perseus.common.requests and pushes one operation with MXEnginePushAsyncND: the
// input NDArrays as const vars, the outputs as mutable vars, RunJob as the
// function and a Job (made here) as its parameter. When the engine runs RunJob,
// every input is written and nothing else touches the outputs; RunJob reads the
// arrays' data pointers (MXNDArrayGetData, which also allocates a delay-allocated
// output), enqueues the batch with the core and returns at once. Once the core's
// handles complete, the core calls back (perseus_on_complete) and that signals the
// engine's completion callback, with an error when a request failed, so the engine
// marks the outputs as failed and whoever reads them gets the message. Nothing is
// linked against MXNet: the two facts taken from its headers are restated below,
// and MXNDArrayGetData comes in as a function pointer.
#include <perseus/perseus.h>

#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

namespace dmlc {
// dmlc::Error (include/dmlc/logging.h in the mxnet wheel) is a std::runtime_error
// with no members of its own; the engine copies it into the outputs' exception.
struct Error : public std::runtime_error {
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};
}  // namespace dmlc

namespace {

// mxnet::engine::CallbackOnComplete (include/mxnet/engine.h): three pointers;
// invoking it calls callback(engine, param, error).
struct OnComplete {
  void (*callback)(void* engine, void* param, const dmlc::Error* error);
  void* engine;
  void* param;
};

// MXNet C API functions (include/mxnet/c_api.h), passed in by perseus.mxnet.engine.
using GetDataFn = int (*)(void* ndarray, void** data);        // MXNDArrayGetData
using LastErrorFn = const char* (*)();                        // MXGetLastError
using ShallowCopyFn = int (*)(void* ndarray, void** copy);    // MXShallowCopyNDArray
using FreeFn = int (*)(void* ndarray);                        // MXNDArrayFree
GetDataFn g_get_data = nullptr;
LastErrorFn g_mx_last_error = nullptr;
ShallowCopyFn g_shallow_copy = nullptr;
FreeFn g_free = nullptr;

struct Job {
  ~Job() {
    for (void* handle : owned) g_free(handle);
  }
  std::vector<void*> owned;   // our own NDArray handles (shallow copies), freed with the job
  std::vector<int64_t> blob;  // the packed batch: records, shapes, splits, names
  perseus_request_t* requests = nullptr;
  int32_t n = 0;
  std::vector<void*> inputs;   // NDArray handle per request (one of `owned`)
  std::vector<void*> outputs;  // NDArray handle per request (may equal the input)
  std::vector<int64_t> handles;
  OnComplete done{};
};

// Tells the engine the job is over. The engine may delete the job (our deleter)
// from inside the callback, so nothing of it is touched afterwards.
void Finish(Job* job, perseus_status_t status, const std::string& message) {
  OnComplete done = job->done;
  if (status == PERSEUS_SUCCESS) {
    done.callback(done.engine, done.param, nullptr);
  } else {
    dmlc::Error error(std::string("Perseus: ") + perseus_status_string(status) + ": " + message);
    done.callback(done.engine, done.param, &error);
  }
}

// perseus_on_complete's callback: the job's requests are all done.
void OnJobDone(void* arg, perseus_status_t status, const char* message) {
  Job* job = static_cast<Job*>(arg);
  for (int64_t handle : job->handles) perseus_release(handle);
  Finish(job, status, message && *message ? message : perseus_status_string(status));
}

// Sets *data to an NDArray's data address (nullptr for an empty array, e.g. a
// rank's zero-row reducescatter output); false with *message set if MXNet fails.
bool DataOf(void* ndarray, void** data, std::string* message) {
  *data = nullptr;
  if (g_get_data(ndarray, data) != 0) {
    *message = std::string("MXNDArrayGetData failed: ") +
               (g_mx_last_error ? g_mx_last_error() : "(no message)");
    return false;
  }
  return true;
}

int64_t Elements(const perseus_request_t& request) {
  int64_t count = 1;
  for (int32_t d = 0; d < request.ndim; ++d) count *= request.shape[d];
  return count;
}

}  // namespace

extern "C" {

__attribute__((visibility("default")))
void perseus_mx_set_functions(void* get_data, void* last_error, void* shallow_copy,
                              void* free_ndarray) {
  g_get_data = reinterpret_cast<GetDataFn>(get_data);
  g_mx_last_error = reinterpret_cast<LastErrorFn>(last_error);
  g_shallow_copy = reinterpret_cast<ShallowCopyFn>(shallow_copy);
  g_free = reinterpret_cast<FreeFn>(free_ndarray);
}

// A job over a copy of the batch packed at `batch` (`bytes` long, the n records
// at byte `records_at`). The records' name, shape and splits pointers point into
// the batch; the copy gets them moved along. inputs/outputs: n NDArray handles;
// the job holds its own handles to the same arrays (the caller's may be freed
// before the engine runs the job). Returns nullptr when copying a handle fails.
__attribute__((visibility("default")))
void* perseus_mx_job_new(const void* batch, int64_t bytes, int64_t records_at, int32_t n,
                         void* const* inputs, void* const* outputs) {
  Job* job = new Job;
  job->blob.resize((bytes + 7) / 8);
  std::memcpy(job->blob.data(), batch, bytes);
  const char* old_base = static_cast<const char*>(batch);
  char* new_base = reinterpret_cast<char*>(job->blob.data());
  auto moved = [&](const void* p) -> char* {
    return p ? new_base + (static_cast<const char*>(p) - old_base) : nullptr;
  };
  job->requests = reinterpret_cast<perseus_request_t*>(new_base + records_at);
  job->n = n;
  for (int32_t i = 0; i < n; ++i) {
    perseus_request_t& r = job->requests[i];
    r.name = moved(r.name);
    r.shape = reinterpret_cast<const int64_t*>(moved(r.shape));
    r.splits = reinterpret_cast<const int64_t*>(moved(r.splits));
  }
  for (int32_t i = 0; i < n; ++i) {
    void* in = nullptr;
    void* out = nullptr;
    if (g_shallow_copy(inputs[i], &in) != 0) { delete job; return nullptr; }
    job->owned.push_back(in);
    if (outputs[i] == inputs[i]) {
      out = in;
    } else if (outputs[i]) {
      if (g_shallow_copy(outputs[i], &out) != 0) { delete job; return nullptr; }
      job->owned.push_back(out);
    }
    job->inputs.push_back(in);
    job->outputs.push_back(out);
  }
  job->handles.resize(n);
  return job;
}

__attribute__((visibility("default")))
void perseus_mx_job_delete(void* job) { delete static_cast<Job*>(job); }

// EngineAsyncFunc: (RunContext*, CallbackOnComplete*, param).
__attribute__((visibility("default")))
void perseus_mx_job_run(void* /*run_context*/, void* on_complete, void* param) {
  Job* job = static_cast<Job*>(param);
  job->done = *static_cast<const OnComplete*>(on_complete);
  std::string message;
  for (int32_t i = 0; i < job->n; ++i) {
    perseus_request_t& r = job->requests[i];
    if (Elements(r) == 0) continue;  // empty: the core reads no pointer
    void* in = nullptr;
    void* out = nullptr;
    if (!DataOf(job->inputs[i], &in, &message) ||
        (job->outputs[i] && !DataOf(job->outputs[i], &out, &message))) {
      Finish(job, PERSEUS_INTERNAL_ERROR, message);
      return;
    }
    r.input = in;
    r.output = out;
  }
  perseus_status_t status = perseus_enqueue(job->requests, job->n, job->handles.data());
  if (status != PERSEUS_SUCCESS) {
    const char* text = perseus_last_error();
    Finish(job, status, text ? text : "");
    return;
  }
  // The core calls back once all are done, on its own thread (or here, if they
  // already are); it also learns that someone waits, so it does not hold them as
  // it holds a backward's gradients.
  status = perseus_on_complete(job->handles.data(), job->n, OnJobDone, job);
  if (status != PERSEUS_SUCCESS) {
    std::string text = perseus_last_error();  // before a release overwrites it
    for (int64_t handle : job->handles) perseus_release(handle);
    Finish(job, status, text);
  }
}

}  // extern "C"
