// Everything the core knows about element types: size, name, MPI datatype,
// reduction operators (including fp16/bf16, which MPI lacks) and scaling.
#ifndef PERSEUS_DTYPE_H_
#define PERSEUS_DTYPE_H_

#include <mpi.h>

#include <cstddef>
#include <cstdint>

#include "perseus/perseus.h"
#include "status.h"

namespace perseus {

bool ValidDtype(int dtype);
size_t DtypeSize(int dtype);
const char* DtypeName(int dtype);
const char* ReduceOpName(int op);
const char* OpTypeName(int op_type);
bool IsFloatingDtype(int dtype);

// Creates the user-defined MPI operators; call once after MPI is initialised.
void CreateMpiOps();
void FreeMpiOps();

MPI_Datatype MpiDatatype(int dtype);
// The MPI operator reducing `dtype` with `op` (Average reduces as a sum).
Status MpiReduceOp(int dtype, int op, MPI_Op* out);

// dst[i] = src[i] * factor (dst may equal src). Integers are truncated toward zero.
void CopyScaled(int dtype, void* dst, const void* src, int64_t count, double factor);

}  // namespace perseus

#endif  // PERSEUS_DTYPE_H_
