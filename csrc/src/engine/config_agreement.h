// Cross-rank check of the settings every rank must share (the table's agreed rows).
#ifndef PERSEUS_CONFIG_AGREEMENT_H_
#define PERSEUS_CONFIG_AGREEMENT_H_

#include <mpi.h>

#include "common/status.h"
#include "engine/config.h"

namespace perseus {

// Collective over `comm`. A PERSEUS_CONFIG_ERROR on every rank when ranks differ,
// naming what the user set differently, rank 0's value and the first rank's that
// differs from it. Compared in this order, so that a difference is reported as its
// cause rather than as what follows from it: the agreed variables' values (and, for
// a variable only rank 0 uses, whether it is set); then whether the variables the
// autotuner leaves alone when set are set; then MPI's thread support, which decides
// how many lanes a rank makes.
Status AgreeOnConfig(const Config& config, bool thread_multiple, MPI_Comm comm);

}  // namespace perseus

#endif  // PERSEUS_CONFIG_AGREEMENT_H_
