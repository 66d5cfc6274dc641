// Cross-rank check of the settings every rank must share (the table's agreed rows).
#ifndef PERSEUS_CONFIG_AGREEMENT_H_
#define PERSEUS_CONFIG_AGREEMENT_H_

#include <mpi.h>

#include "common/status.h"
#include "engine/config.h"

namespace perseus {

// Collective over `comm`. A PERSEUS_CONFIG_ERROR on every rank when an agreed
// setting differs, naming the first such variable, rank 0's value and the first
// rank's that differs from it.
Status AgreeOnConfig(const Config& config, MPI_Comm comm);

}  // namespace perseus

#endif  // PERSEUS_CONFIG_AGREEMENT_H_
