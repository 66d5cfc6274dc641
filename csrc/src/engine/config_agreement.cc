#include "engine/config_agreement.h"

#include <string>
#include <vector>

#include "mpi/mpi_status.h"

namespace perseus {

namespace {

// The agreed values, each followed by a NUL, in table order (the same on every
// rank: one binary, one table).
std::string AgreedValues(const Config& config) {
  std::string text;
  for (const Setting& s : Settings(config))
    if (s.agreed) text += s.value + '\0';
  return text;
}

const char* Shown(const std::string& value) { return value.empty() ? "unset" : value.c_str(); }

}  // namespace

Status AgreeOnConfig(const Config& config, MPI_Comm comm) {
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  // Values are text of any length: gather the lengths, then the texts.
  const std::string mine = AgreedValues(config);
  int length = static_cast<int>(mine.size());
  std::vector<int> lengths(size), offsets(size);
  Status status = MpiStatus(MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm),
                            "MPI_Allgather");
  if (!status.ok()) return status;
  int total = 0;
  for (int r = 0; r < size; ++r) {
    offsets[r] = total;
    total += lengths[r];
  }
  std::string all(total, '\0');
  status = MpiStatus(MPI_Allgatherv(mine.data(), length, MPI_CHAR, &all[0], lengths.data(),
                                    offsets.data(), MPI_CHAR, comm),
                     "MPI_Allgatherv");
  if (!status.ok()) return status;

  // values[r][k]: rank r's value of the k-th agreed variable.
  std::vector<std::vector<std::string>> values(size);
  for (int r = 0; r < size; ++r) {
    const std::string text = all.substr(offsets[r], lengths[r]);
    for (size_t start = 0, end; (end = text.find('\0', start)) != std::string::npos;
         start = end + 1)
      values[r].push_back(text.substr(start, end - start));
  }
  for (int r = 1; r < size; ++r)
    if (values[r].size() != values[0].size())
      return Status::Error(PERSEUS_CONFIG_ERROR, "rank " + std::to_string(r) +
                                                     " runs a Perseus build with a different "
                                                     "configuration table than rank 0");
  size_t k = 0;
  for (const Setting& s : Settings(config)) {
    if (!s.agreed) continue;
    for (int r = 1; r < size; ++r) {
      if (values[r][k] != values[0][k]) {
        return Status::Error(PERSEUS_CONFIG_ERROR,
                             std::string(s.name) + " differs across ranks (rank 0: " +
                                 Shown(values[0][k]) + ", rank " + std::to_string(r) + ": " +
                                 Shown(values[r][k]) + "); every rank must use the same value");
      }
    }
    ++k;
  }
  return Status::OK();
}

}  // namespace perseus
